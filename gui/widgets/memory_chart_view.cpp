#include "gui/widgets/memory_chart_view.hpp"

#include <QCoreApplication>
#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>
#include <QWheelEvent>
#include <algorithm>

#include "gui/model/text_format.hpp"
#include "gui/widgets/timeline_view.hpp"

namespace pipetune::gui {

namespace {

// The value a step curve holds at time t.
std::int64_t value_at(const std::vector<CounterSample>& samples, double t) {
  auto it = std::upper_bound(samples.begin(), samples.end(), t,
                             [](double time, const CounterSample& s) { return time < s.time; });
  return it == samples.begin() ? 0 : (it - 1)->value;
}

}  // namespace

MemoryChartView::MemoryChartView(const TimelineModel& model, TimelineView& timeline,
                                 QWidget* parent)
    : QWidget(parent), model_(model), timeline_(timeline) {
  setMouseTracking(true);
  setAttribute(Qt::WA_OpaquePaintEvent);
  connect(&timeline_, &TimelineView::view_changed, this, qOverload<>(&QWidget::update));
  subscription_ = model_.subscribe([this] { model_changed(); });
}

void MemoryChartView::model_changed() {
  relayout();
  update();
}

void MemoryChartView::relayout() {
  geometry_.build(model_, 4.0, height() - 8.0, 6.0, 24.0);
}

void MemoryChartView::paintEvent(QPaintEvent*) {
  QPainter painter(this);
  painter_.paint(painter, QRectF(rect()), model_, timeline_.axis(), geometry_);
}

void MemoryChartView::resizeEvent(QResizeEvent*) {
  relayout();
}

void MemoryChartView::wheelEvent(QWheelEvent* event) {
  // Zooming here zooms the timeline, whose axis this chart shares.
  QWheelEvent copy(event->position(), event->globalPosition(), event->pixelDelta(),
                   event->angleDelta(), event->buttons(), event->modifiers(), event->phase(),
                   event->inverted());
  QCoreApplication::sendEvent(&timeline_, &copy);
  event->accept();
}

void MemoryChartView::mouseMoveEvent(QMouseEvent* event) {
  const QPointF p = event->position();
  const int row = geometry_.plot_at(p.y());
  const TimeAxis& axis = timeline_.axis();
  if (row < 0 || p.x() < axis.left()) {
    QToolTip::hideText();
    return;
  }
  const TimelineRow& r = model_.rows()[row];
  const double t = axis.to_ms(p.x());
  QString text =
      QStringLiteral("<b>%1</b> at %2").arg(QString::fromStdString(r.name), format_duration(t));
  if (model_.has_prediction()) {
    text += QStringLiteral("<br>predicted %1").arg(format_size(value_at(r.predicted_memory, t)));
  }
  if (!r.measured_memory.empty()) {
    text += QStringLiteral("<br>measured %1").arg(format_size(value_at(r.measured_memory, t)));
  }
  if (r.capacity_bytes > 0)
    text += QStringLiteral("<br>capacity %1").arg(format_size(r.capacity_bytes));
  QToolTip::showText(event->globalPosition().toPoint(), text, this);
}

}  // namespace pipetune::gui
