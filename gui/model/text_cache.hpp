#pragma once

// Laid-out text for the painters. Shaping a string costs more than drawing a hundred bars, and
// the same labels (device names, ruler ticks, stage totals) come back every frame, so each is
// laid out once and drawn from the cache.

#include <QFont>
#include <QHash>
#include <QPainter>
#include <QStaticText>
#include <QString>

namespace pipetune::gui {

class TextCache {
 public:
  /// Draws `text` in `font` inside `box` with `alignment` (left/right/centre, top/centre).
  void draw(QPainter& painter, const QRectF& box, Qt::Alignment alignment, const QString& text,
            const QFont& font);
  /// Shortened with "…" in the middle (`Qt::ElideMiddle`) or at the end to fit `width`.
  QString elided(const QString& text, const QFont& font, double width,
                 Qt::TextElideMode mode = Qt::ElideRight);
  QSizeF size(const QString& text, const QFont& font);

  static constexpr qsizetype kLimit = 8192;  ///< entries before the cache starts over

 private:
  const QStaticText& get(const QString& text, const QFont& font);

  QHash<QString, QStaticText> texts_;
  QHash<QString, QString> elided_;
};

}  // namespace pipetune::gui
