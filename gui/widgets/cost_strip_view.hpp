#pragma once

// The layer strip: per-layer cost bars with the stage boundaries on them. Dragging a boundary
// moves layers between its two stages, re-simulating at every step of the drag.

#include <QWidget>

#include "gui/model/cost_strip_geometry.hpp"
#include "gui/model/cost_strip_painter.hpp"
#include "gui/model/plan_editor.hpp"

namespace pipetune::gui {

class CostStripView : public QWidget {
  Q_OBJECT

 public:
  explicit CostStripView(PlanEditor& editor, QWidget* parent = nullptr);

  /// The plan or its prediction changed.
  void refresh();
  const CostStripGeometry& geometry() const { return geometry_; }

  QSize sizeHint() const override { return {900, 110}; }
  QSize minimumSizeHint() const override { return {320, 80}; }

 protected:
  void paintEvent(QPaintEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;
  void mousePressEvent(QMouseEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void mouseReleaseEvent(QMouseEvent* event) override;
  void leaveEvent(QEvent* event) override;

 private:
  void relayout();

  PlanEditor& editor_;
  CostStripGeometry geometry_;
  CostStripPainter painter_;
  CostStripStyle style_;
};

}  // namespace pipetune::gui
