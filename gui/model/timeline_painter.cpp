#include "gui/model/timeline_painter.hpp"

#include <QPainterPath>
#include <algorithm>
#include <cmath>

#include "gui/model/palette.hpp"
#include "gui/model/text_format.hpp"

namespace pipetune::gui {

namespace {

QFont pixel_font(int pixels, bool bold = false) {
  QFont font;
  font.setPixelSize(pixels);
  font.setBold(bold);
  return font;
}

QString row_stages_text(const TimelineRow& row) {
  QStringList parts;
  for (int s : row.stages) parts << QString::number(s);
  return (row.stages.size() == 1 ? QStringLiteral("stage ") : QStringLiteral("stages ")) +
         parts.join(QStringLiteral(", "));
}

// The fill of a task: its kind's colour, or its error's when measured bars show errors; faded
// when another micro-batch is highlighted.
QColor fill_of(const TimelineTask& t, Series series, const TimelineStyle& style) {
  QColor colour = series == Series::Measured && style.colour_by_error ? palette::error(t.error)
                                                                      : palette::task(t.kind);
  if (style.highlighted_micro_batch >= 0 && t.micro_batch != style.highlighted_micro_batch) {
    colour = palette::faded(colour);
  }
  return colour;
}

}  // namespace

TimelinePainter::TimelinePainter()
    : label_font_(pixel_font(11)),
      name_font_(pixel_font(12, true)),
      small_font_(pixel_font(10)),
      label_metrics_(label_font_) {
  digit_width_ = label_metrics_.horizontalAdvance(QLatin1Char('0'));
}

void TimelinePainter::paint(QPainter& painter, const QRectF& area, const TimelineModel& model,
                            const TimeAxis& axis, const LaneLayout& layout,
                            const TimelineStyle& style) {
  painter.save();
  painter.setRenderHint(QPainter::Antialiasing, false);
  painter.fillRect(area, palette::kBackground);
  const QRectF lanes_area(axis.left(), area.top() + TimelineFrame::kRulerHeight,
                          area.right() - axis.left(), area.height() - TimelineFrame::kRulerHeight);
  const bool overlay = model.has_measured() && model.has_prediction();

  painter.save();
  painter.setClipRect(QRectF(area.left(), lanes_area.top(), area.width(), lanes_area.height()));
  painter.translate(0, -style.scroll_y);
  const double visible_top = lanes_area.top() + style.scroll_y;
  const double visible_bottom = lanes_area.bottom() + style.scroll_y;

  // Row bands, alternating, and the grid under the tasks.
  for (int r = 0; r < layout.row_count(); ++r) {
    const Band& b = layout.row(r);
    if (b.bottom() < visible_top || b.top > visible_bottom) continue;
    QColor shade = r % 2 ? palette::kRowBackgroundAlternate : palette::kBackground;
    if (!model.rows()[r].fits()) shade = palette::kDoesNotFitBackground;
    if (shade == palette::kBackground) continue;  // already filled
    painter.fillRect(QRectF(lanes_area.left(), b.top, lanes_area.width(), b.height), shade);
  }
  painter.setPen(QPen(palette::kGrid, 0));
  for (const Tick& tick : axis.ticks(90.0)) {
    if (tick.x < lanes_area.left() || tick.x > lanes_area.right()) continue;
    painter.drawLine(QPointF(std::floor(tick.x) + 0.5, visible_top),
                     QPointF(std::floor(tick.x) + 0.5, visible_bottom));
  }

  // Where 80 % of a run's steps should end: under the tasks, over every lane.
  if (const auto interval = model.predicted_interval()) {
    const double x0 = std::max(lanes_area.left(), axis.to_x(interval->first));
    const double x1 = std::min(lanes_area.right(), axis.to_x(interval->second));
    if (x1 > x0)
      painter.fillRect(QRectF(x0, visible_top, x1 - x0, visible_bottom - visible_top),
                       palette::kIntervalBand);
  }

  painter.setClipRect(
      QRectF(lanes_area.left(), visible_top, lanes_area.width(), lanes_area.height()));
  painter.setFont(label_font_);
  const auto& lanes = model.lanes();
  for (int l = 0; l < layout.lane_count(); ++l) {
    const Band& band = layout.lane(l);
    if (band.bottom() < visible_top || band.top > visible_bottom) continue;
    // Overlaid, the measured bars go under the predicted outlines and their labels on top.
    const Series solid = overlay || !model.has_prediction() ? Series::Measured : Series::Predicted;
    paint_lane(painter, model, axis, band, lanes[l], solid, Pass::Bars, style);
    if (overlay)
      paint_lane(painter, model, axis, band, lanes[l], Series::Predicted, Pass::Outlines, style);
    paint_lane(painter, model, axis, band, lanes[l], solid, Pass::Labels, style);
  }
  if (style.hovered && style.hovered->index >= 0) {
    const TimelineTask& t = model.task(*style.hovered);
    if (t.lane >= 0 && t.lane < layout.lane_count()) {
      const Band& b = layout.lane(t.lane);
      const double x0 = axis.to_x(t.start_ms), x1 = std::max(axis.to_x(t.end_ms), x0 + 1);
      painter.setPen(QPen(palette::kHighlight, 2));
      painter.setBrush(Qt::NoBrush);
      painter.drawRect(QRectF(x0, b.top, x1 - x0, b.height).adjusted(-1, -1, 1, 1));
    }
  }
  painter.restore();

  if (style.selection) {
    const double x0 = std::max(axis.to_x(style.selection->start_ms), lanes_area.left());
    const double x1 = std::min(axis.to_x(style.selection->end_ms), lanes_area.right());
    if (x1 > x0) {
      const QRectF band(x0, lanes_area.top(), x1 - x0, lanes_area.height());
      painter.fillRect(band, palette::kSelection);
      painter.setPen(QPen(palette::kSelection.darker(250), 1));
      painter.drawLine(band.topLeft(), band.bottomLeft());
      painter.drawLine(band.topRight(), band.bottomRight());
    }
  }
  paint_gutter(painter, area, model, layout, style);
  paint_ruler(painter, area, axis, model);
  painter.restore();
}

void TimelinePainter::paint_lane(QPainter& painter, const TimelineModel& model,
                                 const TimeAxis& axis, const Band& band, const TimelineLane& lane,
                                 Series series, Pass pass, const TimelineStyle& style) {
  const auto& list = lane.of(series);
  const auto& tasks = model.tasks(series);
  if (list.empty()) return;
  const TimeRange& view = axis.view();
  // Tasks on one stream do not overlap, so ends are sorted too: the first visible task is the
  // first ending after the view starts.
  auto first = std::lower_bound(list.begin(), list.end(), view.start_ms,
                                [&tasks](int k, double t) { return tasks[k].end_ms < t; });
  const int top = static_cast<int>(band.top);
  const int height = static_cast<int>(band.height);
  const bool outlines = pass == Pass::Outlines;
  if (pass == Pass::Labels && height < 10) return;
  int last_column = std::numeric_limits<int>::min();

  for (auto it = first; it != list.end(); ++it) {
    const TimelineTask& t = tasks[*it];
    if (t.start_ms > view.end_ms) break;
    const double fx0 = axis.to_x(t.start_ms), fx1 = axis.to_x(t.end_ms);
    const int x0 = static_cast<int>(std::floor(fx0));
    const int x1 = static_cast<int>(std::floor(fx1));
    const int width = x1 - x0;
    if (pass == Pass::Labels) {
      if (width >= digit_width_ + 6)
        paint_label(painter, t, series, QRect(x0, top, width, height), style);
      continue;
    }
    if (width < 2) {
      // Sub-pixel tasks: one column each, and only the first task that lands in a column.
      if (x0 <= last_column) continue;
      last_column = x0;
      if (outlines) {
        painter.fillRect(x0, top, 1, 2, palette::kPredictedOutline);
      } else {
        painter.fillRect(x0, top, 1, height, fill_of(t, series, style));
      }
      continue;
    }
    last_column = x1 - 1;
    const QRect rect(x0, top, width, height);
    if (outlines && width < 5) {
      // Too narrow for a box that leaves the bar under it visible: a tick where it starts.
      painter.fillRect(x0, top, 1, height, QColor(0x1a, 0x1a, 0x1a, 0xa0));
      continue;
    }
    if (outlines) {
      if (style.overlay == OverlayStyle::Outline) {
        const bool faded =
            style.highlighted_micro_batch >= 0 && t.micro_batch != style.highlighted_micro_batch;
        const QColor edge =
            faded ? palette::faded(palette::kPredictedOutline) : palette::kPredictedOutline;
        // Four filled edges, two pixels wide: much cheaper than stroking a rectangle.
        painter.fillRect(x0, top, width, 2, edge);
        painter.fillRect(x0, top + height - 2, width, 2, edge);
        painter.fillRect(x0, top, 2, height, edge);
        painter.fillRect(x0 + width - 2, top, 2, height, edge);
      } else {
        painter.fillRect(rect.adjusted(0, 0, -1, 0), QColor(0x30, 0x30, 0x30, 0x55));
        painter.fillRect(QRect(x0, top, width - 1, 2), QColor(0x30, 0x30, 0x30, 0xb0));
      }
      continue;
    }
    const QColor fill = fill_of(t, series, style);
    // A one-pixel gap on the right keeps neighbours apart.
    painter.fillRect(width >= 4 ? rect.adjusted(0, 0, -1, 0) : rect, fill);
    if (style.highlighted_micro_batch == t.micro_batch && width >= 3) {
      painter.setPen(QPen(palette::kHighlight, 1));
      painter.setBrush(Qt::NoBrush);
      painter.drawRect(rect.adjusted(0, 0, -2, -1));
    }
  }
}

const QStaticText& TimelinePainter::label_text(const TimelineTask& t, bool full) {
  // Laid-out labels are cached: shaping text on every frame costs more than drawing the bars.
  const std::uint64_t key = full ? (static_cast<std::uint64_t>(t.kind) + 1) << 56 |
                                       static_cast<std::uint64_t>(t.stage) << 28 |
                                       static_cast<std::uint64_t>(t.micro_batch)
                                 : static_cast<std::uint64_t>(t.micro_batch);
  auto it = labels_.find(key);
  if (it == labels_.end()) {
    QStaticText text(full ? QString::fromStdString(t.label()) : QString::number(t.micro_batch));
    text.setTextFormat(Qt::PlainText);
    text.setPerformanceHint(QStaticText::AggressiveCaching);
    text.prepare(QTransform(), label_font_);
    it = labels_.emplace(key, std::move(text)).first;
  }
  return it->second;
}

void TimelinePainter::paint_label(QPainter& painter, const TimelineTask& t, Series series,
                                  const QRect& rect, const TimelineStyle& style) {
  // The IR label when there is room, else just the micro-batch.
  const QStaticText* text = nullptr;
  if (!t.is_copy() && rect.width() >= digit_width_ * 6 + 8) text = &label_text(t, true);
  if (!text || text->size().width() + 6 > rect.width()) {
    text = &label_text(t, false);
    if (text->size().width() + 6 > rect.width()) return;
  }
  const bool faded =
      style.highlighted_micro_batch >= 0 && t.micro_batch != style.highlighted_micro_batch;
  QColor ink = series == Series::Measured && style.colour_by_error ? palette::kText
                                                                   : palette::task_text(t.kind);
  if (faded) ink = palette::faded(ink);
  painter.setPen(ink);
  const QSizeF size = text->size();
  painter.drawStaticText(QPointF(std::round(rect.left() + (rect.width() - 1 - size.width()) / 2),
                                 std::round(rect.top() + (rect.height() - size.height()) / 2)),
                         *text);
}

void TimelinePainter::paint_gutter(QPainter& painter, const QRectF& area,
                                   const TimelineModel& model, const LaneLayout& layout,
                                   const TimelineStyle& style) {
  const QRectF gutter(area.left(), area.top() + TimelineFrame::kRulerHeight,
                      TimelineFrame::kGutterWidth, area.height() - TimelineFrame::kRulerHeight);
  painter.save();
  painter.setClipRect(gutter);
  painter.fillRect(gutter, palette::kGutter);
  painter.translate(0, -style.scroll_y);
  const auto& rows = model.rows();
  const auto& lanes = model.lanes();
  const double name_height = texts_.size(QStringLiteral("Ag"), name_font_).height();
  for (int r = 0; r < layout.row_count(); ++r) {
    const Band& b = layout.row(r);
    if (b.bottom() < gutter.top() + style.scroll_y || b.top > gutter.bottom() + style.scroll_y)
      continue;
    const TimelineRow& row = rows[r];
    const QRectF text_area(area.left() + 8, b.top + 2, TimelineFrame::kGutterWidth - 14,
                           b.height - 4);
    painter.setPen(row.fits() ? palette::kText : palette::kDoesNotFit);
    texts_.draw(painter, text_area, Qt::AlignLeft | Qt::AlignTop,
                texts_.elided(QString::fromStdString(row.name), name_font_,
                              text_area.width() * 0.55, Qt::ElideMiddle),
                name_font_);
    painter.setPen(palette::kMutedText);
    const double second_line = b.top + 2 + name_height;
    if (second_line + 10 < b.bottom()) {
      texts_.draw(painter, QRectF(text_area.left(), second_line, text_area.width() * 0.6, 14),
                  Qt::AlignLeft | Qt::AlignTop, row_stages_text(row), small_font_);
    }
    // Lane names on the right edge of the gutter.
    for (int l = row.first_lane; l < row.first_lane + row.lane_count; ++l) {
      const Band& lane_band = layout.lane(l);
      if (lane_band.height < 9) continue;
      const QString name = lanes[l].copy ? QStringLiteral("→ ") +
                                               QString::fromStdString(rows[lanes[l].peer_row].name)
                                         : QStringLiteral("compute");
      const QRectF lane_text(area.left() + TimelineFrame::kGutterWidth * 0.55, lane_band.top,
                             TimelineFrame::kGutterWidth * 0.45 - 6, lane_band.height);
      texts_.draw(painter, lane_text, Qt::AlignRight | Qt::AlignVCenter,
                  texts_.elided(name, small_font_, lane_text.width()), small_font_);
    }
    painter.setPen(QPen(palette::kGrid, 0));
    painter.drawLine(QPointF(area.left(), b.bottom() + 0.5),
                     QPointF(area.right(), b.bottom() + 0.5));
  }
  painter.restore();
  painter.setPen(QPen(palette::kGrid, 0));
  painter.drawLine(QPointF(gutter.right() - 0.5, gutter.top()),
                   QPointF(gutter.right() - 0.5, gutter.bottom()));
}

void TimelinePainter::paint_ruler(QPainter& painter, const QRectF& area, const TimeAxis& axis,
                                  const TimelineModel& model) {
  const QRectF ruler(area.left(), area.top(), area.width(), TimelineFrame::kRulerHeight);
  painter.fillRect(ruler, palette::kGutter);
  const double step = axis.tick_step(90.0);
  for (const Tick& tick : axis.ticks(90.0)) {
    if (tick.x < axis.left() - 0.5 || tick.x > area.right()) continue;
    const double x = std::floor(tick.x) + 0.5;
    painter.setPen(QPen(palette::kMutedText, 0));
    painter.drawLine(QPointF(x, ruler.bottom() - 7), QPointF(x, ruler.bottom()));
    painter.setPen(palette::kText);
    texts_.draw(painter, QRectF(x + 3, ruler.top(), 90, ruler.height() - 4),
                Qt::AlignLeft | Qt::AlignVCenter, format_tick(tick.ms, step), small_font_);
  }
  // Minor ticks, a fifth of a step apart.
  painter.setPen(QPen(palette::kGrid.darker(115), 0));
  const double minor = step / 5.0;
  const double first = std::ceil(axis.view().start_ms / minor) * minor;
  for (double ms = first; ms <= axis.view().end_ms; ms += minor) {
    const double x = std::floor(axis.to_x(ms)) + 0.5;
    if (x >= axis.left())
      painter.drawLine(QPointF(x, ruler.bottom() - 3), QPointF(x, ruler.bottom()));
  }
  painter.setPen(QPen(palette::kGrid, 0));
  painter.drawLine(QPointF(ruler.left(), ruler.bottom() - 0.5),
                   QPointF(ruler.right(), ruler.bottom() - 0.5));

  // The legend sits over the gutter.
  const QRectF corner(ruler.left(), ruler.top(), TimelineFrame::kGutterWidth, ruler.height());
  painter.fillRect(corner, palette::kGutter);
  double x = corner.left() + 8;
  const double y = corner.center().y();
  auto key_name = [](TaskKind kind) {
    switch (kind) {
      case TaskKind::Forward:
        return QStringLiteral("F");
      case TaskKind::Recompute:
        return QStringLiteral("R");
      case TaskKind::Backward:
        return QStringLiteral("B");
      case TaskKind::InputGrad:
        return QStringLiteral("I");
      case TaskKind::WeightGrad:
        return QStringLiteral("W");
      case TaskKind::SendActivation:
      case TaskKind::SendGradient:
        break;
    }
    return QStringLiteral("copy");
  };
  const std::vector<TaskKind> kinds = legend_kinds(model);
  // Six keys only just fit the gutter: close up the gaps rather than drop one.
  double keys_width = 0;
  for (TaskKind kind : kinds) keys_width += 13 + texts_.size(key_name(kind), small_font_).width();
  const double free_width = corner.width() - 8 - 4 - keys_width;
  const double gap = std::clamp(free_width / static_cast<double>(kinds.size()), 2.0, 7.0);
  painter.setPen(palette::kText);
  for (TaskKind kind : kinds) {
    painter.fillRect(QRectF(x, y - 5, 10, 10), palette::task(kind));
    const QString name = key_name(kind);
    texts_.draw(painter, QRectF(x + 13, corner.top(), 60, corner.height()),
                Qt::AlignLeft | Qt::AlignVCenter, name, small_font_);
    x += 13 + texts_.size(name, small_font_).width() + gap;
  }
  if (model.has_measured() && model.has_prediction()) {
    // Overlaid: measured tasks are the solid bars, predicted ones the outlines.
    const QString name = QStringLiteral("pred.");
    if (x + 13 + texts_.size(name, small_font_).width() <= corner.right() - 4) {
      painter.fillRect(QRectF(x, y - 5, 10, 2), palette::kPredictedOutline);
      painter.fillRect(QRectF(x, y + 3, 10, 2), palette::kPredictedOutline);
      painter.fillRect(QRectF(x, y - 5, 2, 10), palette::kPredictedOutline);
      painter.fillRect(QRectF(x + 8, y - 5, 2, 10), palette::kPredictedOutline);
      texts_.draw(painter, QRectF(x + 13, corner.top(), 60, corner.height()),
                  Qt::AlignLeft | Qt::AlignVCenter, name, small_font_);
    }
  }
  painter.setPen(QPen(palette::kGrid, 0));
  painter.drawLine(QPointF(corner.right() - 0.5, corner.top()),
                   QPointF(corner.right() - 0.5, corner.bottom()));
}

}  // namespace pipetune::gui
