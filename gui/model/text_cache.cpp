#include "gui/model/text_cache.hpp"

#include <QFontMetricsF>
#include <cmath>

namespace pipetune::gui {

const QStaticText& TextCache::get(const QString& text, const QFont& font) {
  const QString key = font.key() + QChar(0x1f) + text;
  auto it = texts_.find(key);
  if (it == texts_.end()) {
    if (texts_.size() >= kLimit) texts_.clear();
    QStaticText laid_out(text);
    laid_out.setTextFormat(Qt::PlainText);
    laid_out.setPerformanceHint(QStaticText::AggressiveCaching);
    laid_out.prepare(QTransform(), font);
    it = texts_.insert(key, laid_out);
  }
  return *it;
}

QSizeF TextCache::size(const QString& text, const QFont& font) {
  return get(text, font).size();
}

void TextCache::draw(QPainter& painter, const QRectF& box, Qt::Alignment alignment,
                     const QString& text, const QFont& font) {
  if (text.isEmpty()) return;
  const QStaticText& laid_out = get(text, font);
  const QSizeF size = laid_out.size();
  double x = box.left(), y = box.top();
  if (alignment & Qt::AlignRight) x = box.right() - size.width();
  if (alignment & Qt::AlignHCenter) x = box.left() + (box.width() - size.width()) / 2;
  if (alignment & Qt::AlignBottom) y = box.bottom() - size.height();
  if (alignment & Qt::AlignVCenter) y = box.top() + (box.height() - size.height()) / 2;
  painter.setFont(font);
  painter.drawStaticText(QPointF(std::round(x), std::round(y)), laid_out);
}

QString TextCache::elided(const QString& text, const QFont& font, double width,
                          Qt::TextElideMode mode) {
  const QString key = font.key() + QChar(0x1f) + QString::number(std::floor(width)) + QChar(0x1f) +
                      QString::number(static_cast<int>(mode)) + QChar(0x1f) + text;
  auto it = elided_.find(key);
  if (it == elided_.end()) {
    if (elided_.size() >= kLimit) elided_.clear();
    it = elided_.insert(key, QFontMetricsF(font).elidedText(text, mode, width));
  }
  return *it;
}

}  // namespace pipetune::gui
