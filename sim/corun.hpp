#pragma once

// The co-run slowdown (docs/architecture.md, "The simulator"): devices that share a machine's
// cores, caches and memory bandwidth (CPU devices, or stages on one GPU) run a task slower while
// the others compute. A compute task's duration is its solo time plus its share of co-running
// times the difference to its co-run time; the share depends on the timeline, so the simulator
// settles it by iterating (corun_shares on one run's timeline, durations set, run again).

#include <span>
#include <vector>

namespace pipetune {

/// One compute task as a run placed it: the device whose stream ran it, and when.
struct ComputeSpan {
  int device = 0;
  double start_ms = 0.0;
  double end_ms = 0.0;
};

/// Per task, the time average over its span of min(1, other devices computing / co_runners):
/// 0 when nothing else computes meanwhile, 1 when at least `co_runners` other devices compute
/// throughout (the condition the co-run times were measured in). A device's tasks must not
/// overlap one another (one compute stream per device); a task of zero length has share 0.
/// co_runners ≥ 1.
std::vector<double> corun_shares(std::span<const ComputeSpan> tasks, int co_runners);

}  // namespace pipetune
