#pragma once

// When a layer's backward is done with its peak, from the allocator's level over time.
//
// The memory model holds a backward's peak until its peak layer is done and then drops to what
// the rest of the walk reaches (docs/memory-model.md). A coarse layer (a residual block, a
// transformer block) is done with its own peak long before it ends: its convolutions' gradients
// and workspaces come and go early, and a tensor that arrives on the device later stacks on a
// level a block output or more below the peak. The model has one such step per task, so the
// layer gets one too: a share of its backward's time and how far the level has dropped from
// then on, chosen from the allocator's record of the backward (every change, with its time).
// Plain C++, so the choice is tested with fabricated records.

#include <cstdint>
#include <span>
#include <vector>

#include "sim/event_engine.hpp"  // CounterSample

namespace pipetune::profiler {

/// The allocated bytes over one backward: each change (ms since the backward began, the level
/// after it; any common origin for the levels), and how long the backward took.
struct LevelRecord {
  std::vector<CounterSample> samples;
  double duration_ms = 0.0;
};

/// From `share` of the backward's time on, the level stays at least `drop` bytes below the
/// backward's peak. share 1 and drop 0: nothing known (the peak lasts to the end).
struct PeakRelease {
  double share = 1.0;
  std::int64_t drop = 0;
};

/// One release for several records of the same layer (its backward measured the first time and
/// later, at a stage's end and inside one), true for each of them: from the share on, every
/// record stays `drop` below its own peak. Of the shares after every record's peak, the one
/// that leaves the least unused between the step and the records' real levels: the largest
/// drop × (1 − share), which for an arrival at a uniformly random time is the most it saves.
/// Changes recorded after a record's duration count as at its end; a record of no duration
/// makes the answer share 1, drop 0.
PeakRelease peak_release(std::span<const LevelRecord> records);

}  // namespace pipetune::profiler
