#pragma once

// Draws the memory chart: per device, the predicted allocation over the iteration, the measured
// one when a measured trace is open, and the device's capacity as a dashed line. A device whose
// predicted peak exceeds its capacity is drawn in red, before anything has run.

#include <QFont>
#include <QPainter>

#include "gui/model/memory_chart_geometry.hpp"
#include "gui/model/text_cache.hpp"
#include "gui/model/time_axis.hpp"
#include "gui/model/timeline_model.hpp"

namespace pipetune::gui {

class MemoryChartPainter {
 public:
  MemoryChartPainter();
  /// `area` is the whole chart; the axis maps the same pixels as the timeline's.
  void paint(QPainter& painter, const QRectF& area, const TimelineModel& model,
             const TimeAxis& axis, const MemoryChartGeometry& geometry);

 private:
  void paint_plot(QPainter& painter, const QRectF& plot, const TimelineModel& model, int r,
                  const TimeAxis& axis, const MemoryChartGeometry& geometry,
                  const QColor& background);
  void paint_capacity(QPainter& painter, const QRectF& plot, const TimelineRow& row, int r,
                      const MemoryChartGeometry& geometry, bool fits);
  void paint_gutter(QPainter& painter, const QRectF& gutter, const TimelineModel& model, int r,
                    const MemoryChartGeometry& geometry);

  QFont name_font_, small_font_;
  TextCache texts_;
};

}  // namespace pipetune::gui
