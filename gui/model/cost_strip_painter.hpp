#pragma once

// Draws the layer strip: stage spans, per-layer cost bars, stage totals and boundary handles.

#include <QFont>
#include <QPainter>
#include <QString>
#include <vector>

#include "gui/model/cost_strip_geometry.hpp"
#include "gui/model/text_cache.hpp"

namespace pipetune::gui {

struct CostStripStyle {
  int hovered_boundary = -1;
  int dragged_boundary = -1;
  std::vector<bool> stage_fits;  ///< per stage: its device fits its memory
  std::vector<QString> layer_names;
  QString caption;  ///< what the bars measure, shown in the gutter
};

class CostStripPainter {
 public:
  CostStripPainter();
  /// `area` is the whole strip; the geometry's plot lies inside it, right of the gutter.
  void paint(QPainter& painter, const QRectF& area, const CostStripGeometry& geometry,
             const CostStripStyle& style);

  static constexpr double kStageLabelHeight = 18.0;
  static constexpr double kLayerLabelHeight = 14.0;

 private:
  void paint_gutter(QPainter& painter, const QRectF& gutter, const CostStripStyle& style);
  void paint_stages(QPainter& painter, const QRectF& area, const CostStripGeometry& geometry,
                    const CostStripStyle& style);
  void paint_layers(QPainter& painter, const CostStripGeometry& geometry,
                    const CostStripStyle& style);
  void paint_boundaries(QPainter& painter, const QRectF& area, const CostStripGeometry& geometry,
                        const CostStripStyle& style);

  QFont name_font_, small_font_;
  TextCache texts_;
};

}  // namespace pipetune::gui
