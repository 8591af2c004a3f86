#include "gui/model/cost_strip_painter.hpp"

#include "gui/model/palette.hpp"
#include "gui/model/text_format.hpp"

namespace pipetune::gui {

CostStripPainter::CostStripPainter() {
  name_font_.setPixelSize(12);
  name_font_.setBold(true);
  small_font_.setPixelSize(10);
}

// The gutter: the strip's name, its caption and how to use it.
void CostStripPainter::paint_gutter(QPainter& painter, const QRectF& gutter,
                                    const CostStripStyle& style) {
  painter.setPen(palette::kText);
  texts_.draw(painter, gutter.adjusted(8, 4, -6, -4), Qt::AlignLeft | Qt::AlignTop,
              QStringLiteral("layers"), name_font_);
  painter.setPen(palette::kMutedText);
  const double line = texts_.size(QStringLiteral("Ag"), small_font_).height();
  double y = gutter.top() + 20;
  for (const QString& text :
       (style.caption + QStringLiteral("\ndrag a boundary\nto move layers")).split('\n')) {
    if (y + line > gutter.bottom()) break;
    texts_.draw(painter, QRectF(gutter.left() + 8, y, gutter.width() - 14, line),
                Qt::AlignLeft | Qt::AlignTop, texts_.elided(text, small_font_, gutter.width() - 14),
                small_font_);
    y += line;
  }
}

// Each stage's shade and label, shortened until it fits.
void CostStripPainter::paint_stages(QPainter& painter, const QRectF& area,
                                    const CostStripGeometry& geometry,
                                    const CostStripStyle& style) {
  const double label_top = area.top();
  for (int s = 0; s < geometry.stage_count(); ++s) {
    const QRectF span = geometry.stage_span(s);
    const bool fits = s < static_cast<int>(style.stage_fits.size()) ? style.stage_fits[s] : true;
    const QColor shade = !fits   ? palette::kDoesNotFitBackground
                         : s % 2 ? palette::kStageShadeAlternate
                                 : palette::kStageShade;
    painter.fillRect(QRectF(span.left(), label_top, span.width(), area.bottom() - label_top),
                     shade);
    // "stage 1 · 3 layers · 4.52 ms", shortened until it fits.
    const int layers = geometry.balance()[s];
    const QString ms = format_duration(geometry.stage_ms(s));
    const QStringList candidates = {QStringLiteral("stage %1 · %2 layer%3 · %4")
                                        .arg(s)
                                        .arg(layers)
                                        .arg(layers == 1 ? "" : "s")
                                        .arg(ms),
                                    QStringLiteral("stage %1 · %2").arg(s).arg(ms),
                                    QStringLiteral("S%1 · %2").arg(s).arg(ms),
                                    QStringLiteral("S%1").arg(s)};
    painter.setPen(fits ? palette::kText : palette::kDoesNotFit);
    for (const QString& text : candidates) {
      if (texts_.size(text, small_font_).width() + 8 <= span.width()) {
        texts_.draw(painter, QRectF(span.left(), label_top, span.width(), kStageLabelHeight),
                    Qt::AlignCenter, text, small_font_);
        break;
      }
    }
  }
}

// Each layer's bar, and its name where it fits under it.
void CostStripPainter::paint_layers(QPainter& painter, const CostStripGeometry& geometry,
                                    const CostStripStyle& style) {
  const QRectF& plot = geometry.plot();
  for (int l = 0; l < geometry.layer_count(); ++l) {
    const QRectF bar = geometry.bar(l);
    painter.fillRect(bar, palette::kLayerBar);
    if (l < static_cast<int>(style.layer_names.size())) {
      const QRectF column = geometry.column(l);
      const QString& name = style.layer_names[l];
      if (texts_.size(name, small_font_).width() + 4 <= column.width()) {
        painter.setPen(palette::kMutedText);
        texts_.draw(painter,
                    QRectF(column.left(), plot.bottom(), column.width(), kLayerLabelHeight),
                    Qt::AlignCenter, name, small_font_);
      }
    }
  }
}

// The boundaries between stages, each with a grip; the hovered or dragged one highlighted.
void CostStripPainter::paint_boundaries(QPainter& painter, const QRectF& area,
                                        const CostStripGeometry& geometry,
                                        const CostStripStyle& style) {
  const QRectF& plot = geometry.plot();
  const double label_top = area.top();
  for (int b = 0; b + 1 < geometry.stage_count(); ++b) {
    const double x = geometry.boundary_x(b);
    const bool active = b == style.hovered_boundary || b == style.dragged_boundary;
    const QColor colour = active ? QColor(0x1d, 0x5f, 0xc4) : palette::kBoundary;
    painter.fillRect(
        QRectF(x - (active ? 1.5 : 1.0), label_top, active ? 3.0 : 2.0, area.bottom() - label_top),
        colour);
    // A grip in the middle says "drag me".
    const QRectF grip(x - 4, plot.center().y() - 10, 8, 20);
    painter.setRenderHint(QPainter::Antialiasing, true);
    painter.setPen(QPen(colour, 1));
    painter.setBrush(active ? QColor(0xdc, 0xe8, 0xfa) : QColor(Qt::white));
    painter.drawRoundedRect(grip, 3, 3);
    painter.setRenderHint(QPainter::Antialiasing, false);
    painter.setPen(QPen(colour, 1));
    for (int k = -1; k <= 1; ++k) {
      const double y = grip.center().y() + 4 * k;
      painter.drawLine(QPointF(x - 2, y), QPointF(x + 2, y));
    }
  }
}

void CostStripPainter::paint(QPainter& painter, const QRectF& area,
                             const CostStripGeometry& geometry, const CostStripStyle& style) {
  painter.save();
  painter.fillRect(area, palette::kBackground);
  const QRectF& plot = geometry.plot();
  const QRectF gutter(area.left(), area.top(), plot.left() - area.left(), area.height());
  painter.fillRect(gutter, palette::kGutter);
  paint_gutter(painter, gutter, style);

  paint_stages(painter, area, geometry, style);
  paint_layers(painter, geometry, style);
  paint_boundaries(painter, area, geometry, style);
  painter.setPen(QPen(palette::kGrid, 0));
  painter.drawLine(QPointF(gutter.right() - 0.5, area.top()),
                   QPointF(gutter.right() - 0.5, area.bottom()));
  painter.drawLine(QPointF(area.left(), area.bottom() - 0.5),
                   QPointF(area.right(), area.bottom() - 0.5));
  painter.restore();
}

}  // namespace pipetune::gui
