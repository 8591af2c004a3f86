#pragma once

// Every colour the app draws with, in one place so the timeline, the memory chart, the legend and
// the tests agree. Task colours follow the Tableau 10 set, which stays distinct for most readers
// with a colour-vision deficiency; errors use a diverging blue-white-red scale.

#include <QColor>

#include "sim/simulator.hpp"

namespace pipetune::gui::palette {

QColor task(TaskKind kind);       ///< forward blue, recompute orange, backward green, copy purple
QColor task_text(TaskKind kind);  ///< label colour that reads on task(kind)
/// Blue when the prediction is too short (negative error), red when too long, white at 0;
/// saturated at ±`saturation` (a fraction).
QColor error(double fraction, double saturation = 0.5);
/// a + (b − a) t, channel by channel (opaque).
QColor mix(const QColor& a, const QColor& b, double t);
/// A colour faded towards the background (tasks outside the highlighted micro-batch).
QColor faded(const QColor& colour);

inline const QColor kBackground{0xff, 0xff, 0xff};
inline const QColor kRowBackgroundAlternate{0xf5, 0xf6, 0xf8};
inline const QColor kGutter{0xee, 0xf0, 0xf3};
inline const QColor kGrid{0xdd, 0xe0, 0xe5};
/// The prediction's 80 % interval at the iteration's end: a light wash under the tasks.
inline const QColor kIntervalBand{0x1f, 0x77, 0xb4, 0x26};
inline const QColor kText{0x20, 0x24, 0x2a};
inline const QColor kMutedText{0x6a, 0x72, 0x7d};
inline const QColor kPredictedOutline{0x1a, 0x1a, 0x1a};
inline const QColor kHighlight{0x11, 0x11, 0x11};
inline const QColor kSelection{0x3d, 0x7e, 0xd8, 0x40};
inline const QColor kPredictedMemory{0x4e, 0x79, 0xa7};
inline const QColor kMeasuredMemory{0xf2, 0x8e, 0x2b};
inline const QColor kCapacity{0x55, 0x5b, 0x63};
inline const QColor kDoesNotFit{0xd6, 0x27, 0x28};
inline const QColor kDoesNotFitBackground{0xfd, 0xe8, 0xe8};
inline const QColor kStageShade{0xe8, 0xee, 0xf6};
inline const QColor kStageShadeAlternate{0xf6, 0xf1, 0xe7};
inline const QColor kLayerBar{0x76, 0x8f, 0xb0};
inline const QColor kBoundary{0x2b, 0x2f, 0x36};

}  // namespace pipetune::gui::palette
