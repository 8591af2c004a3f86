#pragma once

#include <cstdint>
#include <vector>

#include "sim/event_engine.hpp"

namespace pipetune {

/// The highest value each counter of `engine` can reach over every order of its tasks' events
/// that the graph allows (dependencies and each resource's order), whatever the durations.
///
/// The simulated peak is the value at one order, the one the durations give. A real run's
/// durations move from step to step, so a receiver can hold a tensor that in the simulation
/// arrived after its peak: the peak a device reaches depends on arrival order, and this is its
/// least upper bound. Each task contributes up to four events (start, the two steps down from
/// its transient peak, end), each changing counters by its effect; a state the run can be in is a
/// set of events closed under "happens before", and the largest sum over such a set is a
/// maximum-weight closure, found as a minimum cut (Picard, 1976): one max-flow per counter.
///
/// Indexed by counter; each value is at least the counter's initial value and at least its
/// simulated peak (the simulated order is one of the orders).
std::vector<std::int64_t> worst_order_peaks(const EventEngine& engine);

/// Each counter's peak when every task of `engine` (after a run) starts and ends at the times
/// given, per task, in `start` and `finish` (a measured step's) instead of the run's: the same
/// effects in another order. A transient peak ends at the same share of the task's given span
/// as of its duration in the engine (under launch pacing the engine puts it at that offset from
/// the start instead). At one instant the events come in the engine's order: the frees of tasks
/// that take time, then tasks that take none (each one's events in turn), then starts.
std::vector<std::int64_t> peaks_at_times(const EventEngine& engine,
                                         const std::vector<double>& start,
                                         const std::vector<double>& finish);

}  // namespace pipetune
