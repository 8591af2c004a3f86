#pragma once

// Timelines in the Chrome Trace Event format (opens in Perfetto), predicted or measured
// (docs/formats.md). One pid per device, one tid per stream: 0 is compute, 1 + p is the copy
// stream towards the device with pid p.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sim/event_engine.hpp"
#include "sim/plan.hpp"
#include "sim/simulator.hpp"

namespace pipetune {

struct TraceTask {
  TaskKind kind = TaskKind::Forward;
  int stage = 0;
  int micro_batch = 0;
  int device = 0;  ///< pid: index into Trace::devices
  int peer = -1;   ///< copies: receiving device's pid
  double start_ms = 0.0;
  double end_ms = 0.0;
  std::int64_t bytes = 0;
  int step = 0;  ///< measured traces may hold several training steps
  /// Predicted compute tasks from a profile with launch times: the host's launch of the task
  /// (SimTask::launch_start_ms); both -1 otherwise.
  double launch_start_ms = -1.0, launch_end_ms = -1.0;
  /// Measured compute tasks on a CPU device with one intra-op thread: the CPU time its worker
  /// thread ran in the task. Below the task's duration by the time the thread waited for a core
  /// (another thread, another process, or a host that took the VM's core away); -1 otherwise.
  double cpu_ms = -1.0;

  double duration_ms() const { return end_ms - start_ms; }
  std::string label() const;
  int stream() const { return is_compute(kind) ? 0 : 1 + peer; }
};

struct TraceDevice {
  std::string name;
  std::vector<int> stages;
  double busy_ms = 0.0;
  std::int64_t peak_memory_bytes = 0;
  std::int64_t memory_capacity_bytes = 0;
  std::vector<CounterSample> memory;  ///< time (ms) -> allocated bytes
  /// Predicted traces: the peak in the worst arrival order the schedule allows (0: not known).
  std::int64_t worst_order_peak_bytes = 0;
};

struct Trace {
  std::string kind = "predicted";  ///< "predicted" or "measured"
  std::string model;
  std::optional<Plan> plan;
  std::vector<std::int64_t> micro_batch_sizes;
  double iteration_ms = 0.0;
  double throughput_samples_per_s = 0.0;
  double bubble_fraction = 0.0;
  std::vector<TraceDevice> devices;
  std::vector<TraceTask> tasks;
};

/// From the first task's start to the last task's end: what a step took, and where it is
/// aligned (its start goes to 0, as a prediction's). Both 0 without a task.
struct TaskSpan {
  double start_ms = 0.0;
  double end_ms = 0.0;
  double duration_ms() const { return end_ms - start_ms; }
};
TaskSpan task_span(const std::vector<TraceTask>& tasks);

/// The training steps a trace holds, ascending; none without a task.
std::vector<int> trace_steps(const Trace& trace);

/// Over the tasks with a CPU time (TraceTask::cpu_ms): the sum of those times over the sum of
/// their durations, 1 when their threads never waited for a core. -1 when no task has one.
double cpu_share(const std::vector<TraceTask>& tasks);

/// What pairs a predicted task with its measurement: the same kind, stage and micro-batch.
struct TaskKey {
  TaskKind kind = TaskKind::Forward;
  int stage = 0;
  int micro_batch = 0;

  template <typename Task>
  static TaskKey of(const Task& task) {
    return {task.kind, task.stage, task.micro_batch};
  }
  bool operator==(const TaskKey&) const = default;
};

class StepTasks;
/// The one training step `trace` holds (a trace without tasks: step 0, empty). Throws
/// InputError naming `source` when it holds several: a comparison or replay is of one step.
StepTasks only_step(const Trace& trace, const std::string& source);

/// The tasks of one training step of a trace, found by key: how a measured step is aligned and
/// matched to a prediction (compare, calibration, the GUI's overlay).
class StepTasks {
 public:
  StepTasks() = default;
  /// The tasks of `step` among `tasks`. Throws InputError naming `source` when the step holds a
  /// task twice: a step runs each task once.
  StepTasks(const std::vector<TraceTask>& tasks, int step, const std::string& source);

  /// Indices into `tasks` of the step's tasks, in their order there.
  const std::vector<int>& indices() const { return indices_; }
  /// The position in indices() of the task with `key`; -1 when the step has none.
  int find(const TaskKey& key) const;
  TaskSpan span() const { return span_; }

 private:
  std::vector<int> indices_;
  std::unordered_map<std::uint64_t, int> position_of_;
  TaskSpan span_;
};

/// The tasks of two traces of one step each (a prediction and a measurement) paired by key.
struct TaskMatching {
  std::vector<std::pair<int, int>> pairs;  ///< (predicted, measured) indices, predicted order
  std::size_t unmatched = 0;               ///< tasks in one trace only
};

/// SimulationOptions::measured_times from a measured trace of one step: each task's measured
/// start and end (only_step(): InputError naming `source` when the trace holds several steps).
/// Keeps a reference to `measured`, which must outlive the simulation.
std::function<std::optional<std::pair<double, double>>(const SimTask&)> measured_task_times(
    const Trace& measured, const std::string& source);

/// Pairs the tasks of `predicted` and `measured`. Throws InputError naming the trace (the
/// prediction, or `measured_source`) that holds several steps or a task twice.
TaskMatching match_tasks(const Trace& predicted, const Trace& measured,
                         const std::string& measured_source);

inline constexpr std::string_view kTraceFormat = "pipetune.trace/1";

/// The predicted timeline of a simulation (simulate with record_tasks and record_memory).
Trace trace_from_simulation(const SimulationResult& result, const std::string& model);

std::string trace_to_json(const Trace& trace);
Trace parse_trace(std::string_view text, const std::string& source);
Trace load_trace(const std::string& path);
void save_trace(const Trace& trace, const std::string& path);

}  // namespace pipetune
