#pragma once

// The layer strip above the timeline: one column per layer, a bar as tall as the layer's cost,
// the stages as shaded spans and the boundaries between stages as handles to drag. Dragging
// boundary b moves only the layers between stages b and b + 1; other stages keep their layers.

#include <QRectF>
#include <vector>

namespace pipetune::gui {

class CostStripGeometry {
 public:
  /// `layer_ms`: each layer's cost; `balance`: layers per stage; `plot`: where the columns go;
  /// `stage_ms`: each stage's cost where it is not the sum of its layers' (launch-bound stages
  /// of a GPU profile), else empty.
  void build(std::vector<double> layer_ms, std::vector<int> balance, const QRectF& plot,
             std::vector<double> stage_ms = {});

  int layer_count() const { return static_cast<int>(layer_ms_.size()); }
  int stage_count() const { return static_cast<int>(balance_.size()); }
  const std::vector<double>& layer_ms() const { return layer_ms_; }
  const std::vector<int>& balance() const { return balance_; }
  const QRectF& plot() const { return plot_; }

  QRectF column(int layer) const;
  QRectF bar(int layer) const;   ///< the cost bar inside the column, bottom-aligned
  int layer_at(double x) const;  ///< -1 outside the columns
  int first_layer(int stage) const { return first_[stage]; }
  QRectF stage_span(int stage) const;
  double stage_ms(int stage) const;  ///< build()'s `stage_ms`, or the sum of its layers'

  /// Boundary b sits between stage b and stage b + 1 (b in [0, stages − 1)).
  double boundary_x(int boundary) const;
  /// The boundary within `tolerance` pixels of x, the nearest one; -1 when none.
  int boundary_at(double x, double tolerance) const;
  /// The gap between two layers nearest to x, as the index of the layer right of it (1..L−1).
  int gap_at(double x) const;

  /// The balance after dragging `boundary` so that stage boundary + 1 starts at layer `gap`;
  /// the gap is clamped so that both stages keep at least one layer.
  static std::vector<int> move_boundary(const std::vector<int>& balance, int boundary, int gap);

 private:
  std::vector<double> layer_ms_;
  std::vector<double> stage_ms_;
  std::vector<int> balance_;
  std::vector<int> first_;  // first layer of each stage, plus the layer count
  QRectF plot_;
  double column_width_ = 1.0;
  double max_ms_ = 1.0;
};

}  // namespace pipetune::gui
