#include "gui/widgets/cost_strip_view.hpp"

#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>

#include "gui/model/text_format.hpp"
#include "gui/model/timeline_painter.hpp"

namespace pipetune::gui {

namespace {
constexpr double kGrabTolerance = 6.0;
}

CostStripView::CostStripView(PlanEditor& editor, QWidget* parent)
    : QWidget(parent), editor_(editor) {
  setMouseTracking(true);
  setAttribute(Qt::WA_OpaquePaintEvent);
  relayout();
}

void CostStripView::refresh() {
  relayout();
  update();
}

void CostStripView::relayout() {
  const QRectF plot(
      TimelineFrame::kGutterWidth, CostStripPainter::kStageLabelHeight,
      width() - TimelineFrame::kGutterWidth - TimelineFrame::kRightMargin,
      height() - CostStripPainter::kStageLabelHeight - CostStripPainter::kLayerLabelHeight);
  if (!editor_.has_profile()) {
    geometry_.build({}, {}, plot);
    return;
  }
  geometry_.build(editor_.layer_ms(), editor_.plan().balance, plot, editor_.stage_ms());
  const auto& plan = editor_.plan();
  const auto& result = editor_.result();
  const std::vector<int> device_of = stage_devices(plan, editor_.hardware());
  style_.stage_fits.assign(plan.stages(), true);
  for (int s = 0; s < plan.stages(); ++s) {
    for (const auto& d : result.devices) {
      if (d.index == device_of[s]) style_.stage_fits[s] = d.fits();
    }
  }
  style_.layer_names.clear();
  for (const auto& layer : editor_.profile().layers) {
    style_.layer_names.push_back(QString::fromStdString(layer.name));
  }
  const auto sizes = split_batch(editor_.profile().batch_size, plan.chunks);
  style_.caption = tr("forward + backward\nper micro-batch of %1").arg(sizes.front());
}

void CostStripView::paintEvent(QPaintEvent*) {
  QPainter painter(this);
  painter_.paint(painter, QRectF(rect()), geometry_, style_);
}

void CostStripView::resizeEvent(QResizeEvent*) {
  relayout();
}

void CostStripView::mousePressEvent(QMouseEvent* event) {
  if (event->button() != Qt::LeftButton) return;
  style_.dragged_boundary = geometry_.boundary_at(event->position().x(), kGrabTolerance);
  update();
}

void CostStripView::mouseMoveEvent(QMouseEvent* event) {
  const double x = event->position().x();
  if (style_.dragged_boundary >= 0) {
    // Every step of the drag re-simulates; the editor ignores steps that move nothing.
    editor_.move_boundary(style_.dragged_boundary, geometry_.gap_at(x));
    return;
  }
  const int boundary = geometry_.boundary_at(x, kGrabTolerance);
  if (boundary != style_.hovered_boundary) {
    style_.hovered_boundary = boundary;
    setCursor(boundary >= 0 ? Qt::SplitHCursor : Qt::ArrowCursor);
    update();
  }
  const int layer = geometry_.layer_at(x);
  if (boundary < 0 && layer >= 0 && editor_.has_profile()) {
    const auto& l = editor_.profile().layers[layer];
    // Frozen parameters hold their weights only: say how much of them trains.
    const QString parameters =
        l.trained_bytes() == l.param_bytes
            ? format_size(l.param_bytes)
            : tr("%1 (%2 train)").arg(format_size(l.param_bytes), format_size(l.trained_bytes()));
    QToolTip::showText(event->globalPosition().toPoint(),
                       tr("<b>layer %1</b> (%2)<br>forward + backward %3<br>parameters %4")
                           .arg(layer)
                           .arg(QString::fromStdString(l.name),
                                format_duration(geometry_.layer_ms()[layer]), parameters),
                       this);
  } else {
    QToolTip::hideText();
  }
}

void CostStripView::mouseReleaseEvent(QMouseEvent*) {
  style_.dragged_boundary = -1;
  update();
}

void CostStripView::leaveEvent(QEvent*) {
  if (style_.dragged_boundary < 0 && style_.hovered_boundary >= 0) {
    style_.hovered_boundary = -1;
    unsetCursor();
    update();
  }
}

}  // namespace pipetune::gui
