#pragma once

// The timeline widget: draws the TimelineModel with TimelinePainter and turns mouse and keys
// into view changes. Wheel: zoom at the cursor (Shift+wheel pans). Drag: pan. Shift+drag or
// right-drag: select a time range and zoom to it. Click a task: highlight its micro-batch.
// Keys: W/S or +/− zoom, A/D or ←/→ pan, ↑/↓ scroll, 0 or Home fit, Backspace or Ctrl+Z undo
// the last zoom, Esc clear the highlight.

#include <QPoint>
#include <QScrollBar>
#include <QWidget>
#include <optional>

#include "gui/model/lane_layout.hpp"
#include "gui/model/time_axis.hpp"
#include "gui/model/timeline_model.hpp"
#include "gui/model/timeline_painter.hpp"

namespace pipetune::gui {

class TimelineView : public QWidget {
  Q_OBJECT

 public:
  /// Follows the model's changes by itself (TimelineModel::subscribe).
  explicit TimelineView(const TimelineModel& model, QWidget* parent = nullptr);

  /// The model was rebuilt: re-lay the lanes, keep the view (refit it if it was fitted).
  void model_changed();

  const TimeAxis& axis() const { return axis_; }
  const LaneLayout& layout() const { return layout_; }
  const TimelineStyle& style() const { return style_; }
  bool can_undo_zoom() const { return !history_.empty(); }

  void set_overlay_style(OverlayStyle overlay);
  void set_colour_by_error(bool on);
  void highlight_micro_batch(int micro_batch);

  void zoom_in();
  void zoom_out();
  void zoom_at(double factor, double x);
  void pan_by(double fraction_of_view);
  void fit();
  /// Zooms to a time range, remembering the current view for undo_zoom().
  void zoom_to(const TimeRange& range);
  void undo_zoom();

  /// The task under a point in widget coordinates.
  std::optional<TaskRef> task_at(const QPointF& point) const;

  QSize sizeHint() const override { return {900, 420}; }
  QSize minimumSizeHint() const override { return {320, 120}; }

 signals:
  void view_changed();
  void micro_batch_highlighted(int micro_batch);
  void zoom_history_changed();

 protected:
  void paintEvent(QPaintEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;
  void wheelEvent(QWheelEvent* event) override;
  void mousePressEvent(QMouseEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void mouseReleaseEvent(QMouseEvent* event) override;
  void keyPressEvent(QKeyEvent* event) override;
  void leaveEvent(QEvent* event) override;

 private:
  void relayout();
  void update_scroll_bar();
  void update_hover(const QPointF& point, const QPoint& global);
  void remember_view();
  double lanes_top() const { return TimelineFrame::kRulerHeight; }

  const TimelineModel& model_;
  TimeAxis axis_;
  LaneLayout layout_;
  TimelineStyle style_;
  TimelinePainter painter_;
  ZoomHistory history_;
  QScrollBar* scroll_bar_;

  enum class Drag { None, Pan, Select };
  Drag drag_ = Drag::None;
  QPointF press_point_;
  double last_drag_x_ = 0.0;
  bool moved_ = false;
  Listeners::Subscription subscription_;  // last: ends before the members it calls
};

}  // namespace pipetune::gui
