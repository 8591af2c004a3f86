#pragma once

// Draws the timeline (ruler, device rows, lanes, tasks, overlay, selection) with QPainter onto
// any paint device: the widget, an exported PNG, a benchmark's QImage. Work is bounded by the
// pixels, not the tasks: only visible tasks are visited, and tasks narrower than a pixel column
// share one column.

#include <QFont>
#include <QFontMetricsF>
#include <QPainter>
#include <QStaticText>
#include <optional>
#include <unordered_map>

#include "gui/model/lane_layout.hpp"
#include "gui/model/text_cache.hpp"
#include "gui/model/time_axis.hpp"
#include "gui/model/timeline_model.hpp"

namespace pipetune::gui {

enum class OverlayStyle : std::uint8_t {
  Outline,  ///< predicted tasks as dark outlines over the measured bars
  Ghost     ///< predicted tasks as translucent grey bars over the measured bars
};

struct TimelineStyle {
  int highlighted_micro_batch = -1;  ///< -1: none
  OverlayStyle overlay = OverlayStyle::Outline;
  bool colour_by_error = false;        ///< measured bars coloured by their task's error
  std::optional<TimeRange> selection;  ///< a zoom-to-selection being dragged
  std::optional<TaskRef> hovered;
  double scroll_y = 0.0;  ///< lanes scrolled up by this many pixels
};

/// Sizes shared by the timeline and the memory chart, so their time axes line up.
struct TimelineFrame {
  static constexpr double kGutterWidth = 176.0;
  static constexpr double kRulerHeight = 26.0;
  static constexpr double kRightMargin = 12.0;
};

class TimelinePainter {
 public:
  TimelinePainter();

  /// `area` is the whole widget; the axis must map [area.left + gutter, area.right - margin),
  /// and the layout must start at area.top + ruler height.
  void paint(QPainter& painter, const QRectF& area, const TimelineModel& model,
             const TimeAxis& axis, const LaneLayout& layout, const TimelineStyle& style);

  const QFont& label_font() const { return label_font_; }

 private:
  enum class Pass : std::uint8_t { Bars, Outlines, Labels };
  void paint_lane(QPainter& painter, const TimelineModel& model, const TimeAxis& axis,
                  const Band& band, const TimelineLane& lane, Series series, Pass pass,
                  const TimelineStyle& style);
  const QStaticText& label_text(const TimelineTask& t, bool full);
  void paint_label(QPainter& painter, const TimelineTask& t, Series series, const QRect& rect,
                   const TimelineStyle& style);
  void paint_gutter(QPainter& painter, const QRectF& area, const TimelineModel& model,
                    const LaneLayout& layout, const TimelineStyle& style);
  void paint_ruler(QPainter& painter, const QRectF& area, const TimeAxis& axis,
                   const TimelineModel& model);

  QFont label_font_, name_font_, small_font_;
  QFontMetricsF label_metrics_;
  double digit_width_ = 7.0;
  std::unordered_map<std::uint64_t, QStaticText> labels_;
  TextCache texts_;
};

}  // namespace pipetune::gui
