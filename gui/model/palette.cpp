#include "gui/model/palette.hpp"

#include <algorithm>
#include <cmath>

namespace pipetune::gui::palette {

QColor mix(const QColor& a, const QColor& b, double t) {
  auto channel = [t](int x, int y) { return static_cast<int>(std::lround(x + (y - x) * t)); };
  return QColor(channel(a.red(), b.red()), channel(a.green(), b.green()),
                channel(a.blue(), b.blue()));
}

QColor task(TaskKind kind) {
  switch (kind) {
    case TaskKind::Forward:
      return QColor(0x4e, 0x79, 0xa7);
    case TaskKind::Recompute:
      return QColor(0xf2, 0x8e, 0x2b);
    case TaskKind::Backward:
      return QColor(0x59, 0xa1, 0x4f);
    case TaskKind::SendActivation:
      return QColor(0xb0, 0x7a, 0xa1);
    case TaskKind::SendGradient:
      return QColor(0x9c, 0x6b, 0x8f);
    // The backward's halves: green's neighbours, so B, I and W read as one family.
    case TaskKind::InputGrad:
      return QColor(0x2f, 0x8a, 0x7e);
    case TaskKind::WeightGrad:
      return QColor(0x6b, 0x8e, 0x23);
  }
  return QColor(Qt::gray);
}

QColor task_text(TaskKind kind) {
  // Dark text on the light orange, white on the rest (WCAG contrast above 3:1 for both).
  return kind == TaskKind::Recompute ? QColor(0x2a, 0x1a, 0x05) : QColor(Qt::white);
}

QColor error(double fraction, double saturation) {
  if (!std::isfinite(fraction)) return QColor(0xbb, 0xbb, 0xbb);
  const double t = std::clamp(fraction / saturation, -1.0, 1.0);
  static const QColor kTooShort(0x2c, 0x7b, 0xb6), kExact(0xf7, 0xf7, 0xf7),
      kTooLong(0xd7, 0x19, 0x1c);
  return t < 0 ? mix(kExact, kTooShort, -t) : mix(kExact, kTooLong, t);
}

QColor faded(const QColor& colour) {
  return mix(colour, kBackground, 0.72);
}

}  // namespace pipetune::gui::palette
