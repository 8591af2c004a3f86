#pragma once

#include <cstddef>

#include "sim/trace.hpp"

namespace pipetune {

struct ReplayResult {
  double iteration_ms = 0.0;  ///< the programme's makespan with the measured task durations
  std::size_t tasks = 0;
  /// The replayed timeline: every task with its replayed times, and the task graph's edges
  /// (for critical_path()).
  SimulationResult timeline;
};

/// Runs a measured step's programme again on the event engine, every task (compute and copy)
/// taking exactly as long as it was measured to: the iteration the executor would have taken
/// had its runtime added no waiting of its own. Measured over replayed time is the executor's
/// overhead. Throws InputError when the trace has no plan, holds several steps, holds a task
/// twice in its step or lacks a task of the programme.
ReplayResult replay_trace(const Trace& measured, const std::string& source);

/// The step replayed with each compute task taking the CPU time its thread ran in it
/// (TraceTask::cpu_ms) where measured, its whole duration otherwise (copies): the iteration had
/// no compute thread waited for a core, which is what a profile times. -1 when no task has a
/// CPU time. Throws as replay_trace.
double replay_on_cpu_ms(const Trace& measured, const std::string& source);

}  // namespace pipetune
