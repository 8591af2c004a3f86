#include "gui/model/memory_chart_painter.hpp"

#include <QImage>
#include <algorithm>
#include <cmath>

#include "gui/model/palette.hpp"
#include "gui/model/text_format.hpp"
#include "gui/model/timeline_painter.hpp"

namespace pipetune::gui {

namespace {

// One plot's curves, written pixel by pixel into an image of the plot: a filled area under the
// predicted curve, the predicted curve over it, and the measured curve, each two pixels thick.
// Writing pixels a column at a time costs the same for ten samples or a million.
void draw_curves(QImage& image, const MemoryChartGeometry& geometry, int row, double top,
                 const std::vector<MemoryChartGeometry::Column>& predicted,
                 const std::vector<MemoryChartGeometry::Column>& measured, const QColor& background,
                 const QColor& line) {
  image.fill(background);
  const int height = image.height();
  const QRgb fill = palette::mix(background, line, 0.2).rgb();
  const QRgb stroke = line.rgb();
  const QRgb measured_stroke = palette::kMeasuredMemory.rgb();
  auto y_of = [&](std::int64_t bytes) {
    return std::clamp(
        static_cast<int>(std::floor(geometry.to_y(row, static_cast<double>(bytes)) - top)), 0,
        height - 1);
  };
  uchar* bits = image.bits();
  const qsizetype stride = image.bytesPerLine();
  auto paint_column = [&](int x, int from, int to, QRgb colour) {
    for (int y = std::max(from, 0); y <= std::min(to, height - 1); ++y) {
      reinterpret_cast<QRgb*>(bits + y * stride)[x] = colour;
    }
  };
  // A column's stroke reaches back to where the previous column ended, so steps that fall on a
  // column's edge are joined.
  auto paint_curve = [&](const std::vector<MemoryChartGeometry::Column>& columns, QRgb colour,
                         bool filled) {
    const int width = std::min(image.width(), static_cast<int>(columns.size()));
    int previous = -1;
    for (int x = 0; x < width; ++x) {
      const auto& c = columns[x];
      if (!c.drawn) {
        previous = -1;
        continue;
      }
      int high = y_of(c.high), low = y_of(c.low);
      if (filled) paint_column(x, low + 1, height - 1, fill);
      if (previous >= 0) high = std::min(high, previous), low = std::max(low, previous);
      paint_column(x, high - 1, low, colour);
      previous = y_of(c.last);
    }
  };
  paint_curve(predicted, stroke, true);
  paint_curve(measured, measured_stroke, false);
}

}  // namespace

MemoryChartPainter::MemoryChartPainter() {
  name_font_.setPixelSize(12);
  name_font_.setBold(true);
  small_font_.setPixelSize(10);
}

// Row r's plot: its curves, the timeline's ticks, the worst order's peak and the capacity.
void MemoryChartPainter::paint_plot(QPainter& painter, const QRectF& plot,
                                    const TimelineModel& model, int r, const TimeAxis& axis,
                                    const MemoryChartGeometry& geometry, const QColor& background) {
  const TimelineRow& row = model.rows()[r];
  const Band& band = geometry.plot(r);
  const bool fits = row.fits();
  painter.save();
  painter.setClipRect(plot);
  const QColor curve_colour = fits ? palette::kPredictedMemory : palette::kDoesNotFit;
  const int columns = static_cast<int>(std::ceil(plot.width()));
  QImage image(columns, std::max(1, static_cast<int>(band.height)), QImage::Format_RGB32);
  draw_curves(
      image, geometry, r, band.top,
      MemoryChartGeometry::columns(row.predicted_memory, axis, columns, model.predicted_ms()),
      MemoryChartGeometry::columns(row.measured_memory, axis, columns, model.measured_ms()),
      background, curve_colour);
  painter.drawImage(QPointF(plot.left(), band.top), image);
  // The timeline's tick lines, so times line up with the tasks above.
  painter.setPen(QPen(palette::kGrid, 0));
  for (const Tick& tick : axis.ticks(90.0)) {
    if (tick.x >= plot.left()) {
      painter.drawLine(QPointF(std::floor(tick.x) + 0.5, plot.top()),
                       QPointF(std::floor(tick.x) + 0.5, plot.bottom()));
    }
  }
  if (row.worst_order_peak_bytes > row.predicted_peak_bytes) {
    // How high a step whose copies land in the worst order could go: dotted, the prediction's.
    const double y =
        std::round(geometry.to_y(r, static_cast<double>(row.worst_order_peak_bytes))) + 0.5;
    painter.setPen(QPen(palette::kPredictedMemory, 1, Qt::DotLine));
    painter.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y));
  }
  if (row.capacity_bytes > 0) paint_capacity(painter, plot, row, r, geometry, fits);
  painter.restore();
}

// The capacity's dashed line, labelled above it (below where the plot's top is too close).
void MemoryChartPainter::paint_capacity(QPainter& painter, const QRectF& plot,
                                        const TimelineRow& row, int r,
                                        const MemoryChartGeometry& geometry, bool fits) {
  const double y = std::round(geometry.to_y(r, static_cast<double>(row.capacity_bytes))) + 0.5;
  painter.setPen(QPen(fits ? palette::kCapacity : palette::kDoesNotFit, 1, Qt::DashLine));
  painter.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y));
  const QString text = QStringLiteral("capacity ") + format_size(row.capacity_bytes);
  const double width = texts_.size(text, small_font_).width();
  // Above the line, or below it when the plot's top is too close.
  const double label_top = y - 14 >= plot.top() ? y - 14 : y + 2;
  const QRectF label(plot.right() - width - 10, label_top, width + 6, 13);
  painter.fillRect(label, QColor(255, 255, 255, 200));
  painter.setPen(fits ? palette::kMutedText : palette::kDoesNotFit);
  texts_.draw(painter, label, Qt::AlignCenter, text, small_font_);
}

// Row r's gutter: its name, then the peaks.
void MemoryChartPainter::paint_gutter(QPainter& painter, const QRectF& gutter,
                                      const TimelineModel& model, int r,
                                      const MemoryChartGeometry& geometry) {
  const TimelineRow& row = model.rows()[r];
  const Band& band = geometry.plot(r);
  const bool fits = row.fits();
  const QRectF text_area(gutter.left() + 8, band.top + 1, gutter.width() - 14, band.height - 2);
  painter.setPen(fits ? palette::kText : palette::kDoesNotFit);
  texts_.draw(painter, text_area, Qt::AlignLeft | Qt::AlignTop,
              texts_.elided(QString::fromStdString(row.name), name_font_, text_area.width(),
                            Qt::ElideMiddle),
              name_font_);
  const double line = texts_.size(QStringLiteral("Ag"), small_font_).height();
  double y = band.top + 1 + texts_.size(QStringLiteral("Ag"), name_font_).height();
  auto add_line = [&](const QString& text, const QColor& colour) {
    if (y + line > band.bottom() + 1) return;
    painter.setPen(colour);
    texts_.draw(painter, QRectF(text_area.left(), y, text_area.width(), line),
                Qt::AlignLeft | Qt::AlignTop, text, small_font_);
    y += line;
  };
  if (model.has_prediction()) {
    QString peak = QStringLiteral("peak ") + format_size(row.predicted_peak_bytes);
    if (row.capacity_bytes > 0) peak += QStringLiteral(" of ") + format_size(row.capacity_bytes);
    add_line(peak, fits ? palette::kPredictedMemory.darker(130) : palette::kDoesNotFit);
    if (!fits) add_line(QStringLiteral("does not fit"), palette::kDoesNotFit);
    if (row.worst_order_peak_bytes > row.predicted_peak_bytes) {
      add_line(QStringLiteral("worst order ") + format_size(row.worst_order_peak_bytes),
               palette::kPredictedMemory.darker(130));
    }
  }
  if (row.measured_peak_bytes >= 0) {
    add_line(QStringLiteral("measured ") + format_size(row.measured_peak_bytes),
             palette::kMeasuredMemory.darker(140));
  }
}

void MemoryChartPainter::paint(QPainter& painter, const QRectF& area, const TimelineModel& model,
                               const TimeAxis& axis, const MemoryChartGeometry& geometry) {
  painter.save();
  painter.setRenderHint(QPainter::Antialiasing, false);
  painter.fillRect(area, palette::kBackground);
  const QRectF gutter(area.left(), area.top(), TimelineFrame::kGutterWidth, area.height());
  painter.fillRect(gutter, palette::kGutter);
  const auto& rows = model.rows();
  const double plot_left = axis.left();
  const double plot_right = area.right();

  for (int r = 0; r < geometry.plot_count(); ++r) {
    const TimelineRow& row = rows[r];
    const Band& band = geometry.plot(r);
    const QRectF plot(plot_left, band.top, plot_right - plot_left, band.height);
    const bool fits = row.fits();
    const QColor background =
        fits ? (r % 2 ? palette::kRowBackgroundAlternate : palette::kBackground)
             : palette::kDoesNotFitBackground;
    painter.fillRect(plot, background);

    paint_plot(painter, plot, model, r, axis, geometry, background);
    paint_gutter(painter, gutter, model, r, geometry);
  }
  painter.setPen(QPen(palette::kGrid, 0));
  painter.drawLine(QPointF(gutter.right() - 0.5, area.top()),
                   QPointF(gutter.right() - 0.5, area.bottom()));
  painter.drawLine(QPointF(area.left(), area.top() + 0.5), QPointF(area.right(), area.top() + 0.5));
  painter.restore();
}

}  // namespace pipetune::gui
