#include "gui/widgets/timeline_view.hpp"

#include <QKeyEvent>
#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>
#include <QWheelEvent>
#include <cmath>

namespace pipetune::gui {

namespace {
constexpr double kZoomStep = 1.25;
constexpr double kPanStep = 0.2;  // of the view
}  // namespace

TimelineView::TimelineView(const TimelineModel& model, QWidget* parent)
    : QWidget(parent), model_(model), scroll_bar_(new QScrollBar(Qt::Vertical, this)) {
  setFocusPolicy(Qt::StrongFocus);
  setMouseTracking(true);
  setAttribute(Qt::WA_OpaquePaintEvent);
  scroll_bar_->hide();
  connect(scroll_bar_, &QScrollBar::valueChanged, this, [this](int value) {
    style_.scroll_y = value;
    update();
  });
  relayout();
  subscription_ = model_.subscribe([this] { model_changed(); });
}

void TimelineView::model_changed() {
  axis_.set_extent(model_.extent_ms());
  if (style_.hovered &&
      style_.hovered->index >= static_cast<int>(model_.tasks(style_.hovered->series).size())) {
    style_.hovered.reset();
  }
  relayout();
  update();
  emit view_changed();
}

void TimelineView::relayout() {
  axis_.set_pixels(TimelineFrame::kGutterWidth, width() - TimelineFrame::kRightMargin);
  axis_.set_extent(model_.extent_ms());
  layout_.build(model_, lanes_top(), height() - lanes_top());
  update_scroll_bar();
}

void TimelineView::update_scroll_bar() {
  const double visible = height() - lanes_top();
  const int overflow = static_cast<int>(std::ceil(layout_.content_height() - visible));
  if (overflow > 0) {
    scroll_bar_->setGeometry(width() - 11, static_cast<int>(lanes_top()), 11,
                             static_cast<int>(visible));
    scroll_bar_->setRange(0, overflow);
    scroll_bar_->setPageStep(static_cast<int>(visible));
    scroll_bar_->setSingleStep(20);
    scroll_bar_->show();
  } else {
    scroll_bar_->setValue(0);
    scroll_bar_->hide();
  }
  style_.scroll_y = scroll_bar_->isVisible() ? scroll_bar_->value() : 0;
}

void TimelineView::set_overlay_style(OverlayStyle overlay) {
  style_.overlay = overlay;
  update();
}

void TimelineView::set_colour_by_error(bool on) {
  style_.colour_by_error = on;
  update();
}

void TimelineView::highlight_micro_batch(int micro_batch) {
  if (style_.highlighted_micro_batch == micro_batch) return;
  style_.highlighted_micro_batch = micro_batch;
  update();
  emit micro_batch_highlighted(micro_batch);
}

void TimelineView::zoom_at(double factor, double x) {
  axis_.zoom(factor, x);
  update();
  emit view_changed();
}

void TimelineView::zoom_in() {
  zoom_at(kZoomStep, 0.5 * (axis_.left() + axis_.right()));
}
void TimelineView::zoom_out() {
  zoom_at(1.0 / kZoomStep, 0.5 * (axis_.left() + axis_.right()));
}

void TimelineView::pan_by(double fraction_of_view) {
  axis_.pan_pixels(fraction_of_view * (axis_.right() - axis_.left()));
  update();
  emit view_changed();
}

void TimelineView::remember_view() {
  history_.push(axis_.view());
  emit zoom_history_changed();
}

void TimelineView::fit() {
  if (!axis_.fitted()) remember_view();
  axis_.fit();
  update();
  emit view_changed();
}

void TimelineView::zoom_to(const TimeRange& range) {
  remember_view();
  axis_.set_view(range);
  update();
  emit view_changed();
}

void TimelineView::undo_zoom() {
  const auto previous = history_.pop();
  if (!previous) return;
  if (*previous == TimeRange{0.0, axis_.extent_ms()}) {
    axis_.fit();
  } else {
    axis_.set_view(*previous);
  }
  update();
  emit zoom_history_changed();
  emit view_changed();
}

std::optional<TaskRef> TimelineView::task_at(const QPointF& point) const {
  if (point.x() < axis_.left() || point.y() < lanes_top()) return std::nullopt;
  const int lane = layout_.lane_at(point.y() + style_.scroll_y);
  if (lane < 0) return std::nullopt;
  // Within 3 pixels counts, so sub-pixel tasks can be hovered.
  return model_.hit(lane, axis_.to_ms(point.x()), 3.0 / axis_.pixels_per_ms());
}

void TimelineView::paintEvent(QPaintEvent*) {
  QPainter painter(this);
  painter_.paint(painter, QRectF(rect()), model_, axis_, layout_, style_);
  if (!model_.has_prediction() && !model_.has_measured()) {
    painter.setPen(QColor(0x6a, 0x72, 0x7d));
    painter.drawText(rect().adjusted(static_cast<int>(TimelineFrame::kGutterWidth), 0, 0, 0),
                     Qt::AlignCenter,
                     tr("Open a profile (File ▸ Open profile…) or a trace to see a timeline"));
  }
}

void TimelineView::resizeEvent(QResizeEvent*) {
  relayout();
  emit view_changed();
}

void TimelineView::wheelEvent(QWheelEvent* event) {
  const QPointF delta = event->angleDelta();
  const bool horizontal = std::abs(delta.x()) > std::abs(delta.y());
  if (horizontal || event->modifiers() & Qt::ShiftModifier) {
    const double amount = horizontal ? delta.x() : delta.y();
    axis_.pan_pixels(-amount / 120.0 * 0.1 * (axis_.right() - axis_.left()));
    update();
    emit view_changed();
  } else if (event->modifiers() & Qt::AltModifier && scroll_bar_->isVisible()) {
    scroll_bar_->setValue(scroll_bar_->value() - static_cast<int>(delta.y() / 4));
  } else {
    zoom_at(std::pow(kZoomStep, delta.y() / 120.0), event->position().x());
  }
  event->accept();
}

void TimelineView::mousePressEvent(QMouseEvent* event) {
  setFocus(Qt::MouseFocusReason);
  press_point_ = event->position();
  last_drag_x_ = event->position().x();
  moved_ = false;
  if (event->button() == Qt::RightButton ||
      (event->button() == Qt::LeftButton && event->modifiers() & Qt::ShiftModifier)) {
    drag_ = Drag::Select;
    const double t = axis_.to_ms(event->position().x());
    style_.selection = TimeRange{t, t};
  } else if (event->button() == Qt::LeftButton) {
    drag_ = Drag::Pan;
  }
}

void TimelineView::mouseMoveEvent(QMouseEvent* event) {
  const QPointF p = event->position();
  if (std::abs(p.x() - press_point_.x()) + std::abs(p.y() - press_point_.y()) > 3) moved_ = true;
  if (drag_ == Drag::Pan && moved_) {
    setCursor(Qt::ClosedHandCursor);
    axis_.pan_pixels(last_drag_x_ - p.x());
    last_drag_x_ = p.x();
    QToolTip::hideText();
    update();
    emit view_changed();
    return;
  }
  if (drag_ == Drag::Select) {
    const double a = axis_.to_ms(press_point_.x()), b = axis_.to_ms(p.x());
    style_.selection = TimeRange{std::min(a, b), std::max(a, b)};
    update();
    return;
  }
  update_hover(p, event->globalPosition().toPoint());
}

void TimelineView::mouseReleaseEvent(QMouseEvent* event) {
  const Drag drag = drag_;
  drag_ = Drag::None;
  unsetCursor();
  if (drag == Drag::Select) {
    const TimeRange selected = *style_.selection;
    style_.selection.reset();
    if (moved_ && axis_.to_x(selected.end_ms) - axis_.to_x(selected.start_ms) >= 3) {
      zoom_to(selected);
    } else {
      update();
    }
    return;
  }
  if (drag == Drag::Pan && !moved_) {
    // A click: highlight the micro-batch under it, or clear.
    const auto hit = task_at(event->position());
    highlight_micro_batch(hit ? model_.task(*hit).micro_batch : -1);
  }
}

void TimelineView::keyPressEvent(QKeyEvent* event) {
  const bool ctrl = event->modifiers() & Qt::ControlModifier;
  switch (event->key()) {
    case Qt::Key_W:
    case Qt::Key_Plus:
    case Qt::Key_Equal:
      zoom_in();
      break;
    case Qt::Key_S:
    case Qt::Key_Minus:
      zoom_out();
      break;
    case Qt::Key_A:
    case Qt::Key_Left:
      pan_by(-kPanStep);
      break;
    case Qt::Key_D:
    case Qt::Key_Right:
      pan_by(kPanStep);
      break;
    case Qt::Key_Up:
      scroll_bar_->setValue(scroll_bar_->value() - 30);
      break;
    case Qt::Key_Down:
      scroll_bar_->setValue(scroll_bar_->value() + 30);
      break;
    case Qt::Key_0:
    case Qt::Key_Home:
      fit();
      break;
    case Qt::Key_Backspace:
      undo_zoom();
      break;
    case Qt::Key_Z:
      if (ctrl) {
        undo_zoom();
      } else {
        QWidget::keyPressEvent(event);
      }
      break;
    case Qt::Key_Escape:
      highlight_micro_batch(-1);
      style_.selection.reset();
      update();
      break;
    default:
      QWidget::keyPressEvent(event);
  }
}

void TimelineView::leaveEvent(QEvent*) {
  if (style_.hovered) {
    style_.hovered.reset();
    update();
  }
}

void TimelineView::update_hover(const QPointF& point, const QPoint& global) {
  const auto hit = task_at(point);
  if (hit != style_.hovered) {
    style_.hovered = hit;
    update();
  }
  if (hit) {
    QToolTip::showText(global, describe_task(model_, *hit), this);
  } else {
    QToolTip::hideText();
  }
}

}  // namespace pipetune::gui
