#pragma once

// The memory chart under the timeline, on the timeline's time axis: it follows the timeline's
// zoom and pan, and the wheel over it zooms the timeline. Hover shows the memory at that time.

#include <QWidget>

#include "gui/model/memory_chart_geometry.hpp"
#include "gui/model/memory_chart_painter.hpp"
#include "gui/model/timeline_model.hpp"

namespace pipetune::gui {

class TimelineView;

class MemoryChartView : public QWidget {
  Q_OBJECT

 public:
  /// Follows the model's changes by itself (TimelineModel::subscribe).
  MemoryChartView(const TimelineModel& model, TimelineView& timeline, QWidget* parent = nullptr);

  void model_changed();
  const MemoryChartGeometry& geometry() const { return geometry_; }

  QSize sizeHint() const override { return {900, 200}; }
  QSize minimumSizeHint() const override { return {320, 60}; }

 protected:
  void paintEvent(QPaintEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;
  void wheelEvent(QWheelEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;

 private:
  void relayout();

  const TimelineModel& model_;
  TimelineView& timeline_;
  MemoryChartGeometry geometry_;
  MemoryChartPainter painter_;
  Listeners::Subscription subscription_;  // last: ends before the members it calls
};

}  // namespace pipetune::gui
