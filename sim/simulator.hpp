#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sim/cost_model.hpp"
#include "sim/event_engine.hpp"
#include "sim/hardware.hpp"
#include "sim/plan.hpp"
#include "sim/profile.hpp"
#include "sim/schedule.hpp"

namespace pipetune {

struct TaskGraph;

enum class TaskKind : std::uint8_t {
  Forward,
  Recompute,
  Backward,
  SendActivation,
  SendGradient,
  InputGrad,  ///< I: the backward w.r.t. the stage input
  WeightGrad  ///< W: the backward w.r.t. the stage's weights
};

/// "forward", "recompute", "backward", "send_activation", "send_gradient", "backward_input",
/// "backward_weight"
std::string_view to_string(TaskKind kind);
bool is_compute(TaskKind kind);
/// A task's name in IR form: "2F0" for compute tasks, "2>3 act 0" / "3>2 grad 0" for copies
/// (`stage` being the sender's). Predicted, measured and compared tasks are all named by it.
std::string task_label(TaskKind kind, int stage, int micro_batch);

/// One simulated task. Compute tasks run on `device`; copies go from `device` to `peer`.
struct SimTask {
  TaskKind kind = TaskKind::Forward;
  int stage = 0;  ///< for copies: the sending stage
  int micro_batch = 0;
  int device = 0;
  int peer = -1;
  double start_ms = 0.0;
  double end_ms = 0.0;
  std::int64_t bytes = 0;  ///< copies only
  /// Compute tasks where the profile has launch times: when the host's launch of the task began
  /// and ended (docs/architecture.md, "Launch-bound tasks"); both -1 otherwise.
  double launch_start_ms = -1.0, launch_end_ms = -1.0;

  double duration_ms() const { return end_ms - start_ms; }
  /// IR form for compute tasks ("2F0"); "2>3 act 0" / "3>2 grad 0" for copies.
  std::string label() const;
};

struct DeviceReport {
  std::string name;
  int index = 0;  ///< in the hardware's device list
  std::vector<int> stages;
  double busy_ms = 0.0;  ///< compute time
  std::int64_t peak_memory_bytes = 0;
  double peak_time_ms = 0.0;
  /// The highest peak any arrival order the schedule allows can reach (worst_order_peaks()),
  /// when asked for; 0 otherwise.
  std::int64_t worst_order_peak_bytes = 0;
  /// The peak with every task at the times SimulationOptions::measured_times gives (a measured
  /// step's order), when asked for and known for every task; 0 otherwise.
  std::int64_t measured_order_peak_bytes = 0;
  std::int64_t memory_capacity_bytes = 0;  ///< 0: unknown
  std::vector<CounterSample> memory;       ///< time (ms) -> allocated bytes, when recorded
  /// Where this device is one of two or more shares of one GPU's SMs (HardwareDevice::share_of):
  /// that GPU. Its memory (peak, history) is then the GPU's, every share's tensors together.
  std::string share_of;

  bool fits() const {
    return memory_capacity_bytes == 0 || peak_memory_bytes <= memory_capacity_bytes;
  }
};

struct SimulationResult {
  Plan plan;
  std::vector<std::int64_t> micro_batch_sizes;  ///< as tensor.chunk splits the batch
  double iteration_ms = 0.0;
  double throughput_samples_per_s = 0.0;
  double bubble_fraction = 0.0;            ///< idle share of the devices that hold stages
  std::vector<DeviceReport> devices;       ///< only devices that hold stages, in hardware order
  std::size_t task_count = 0;              ///< compute tasks and copies simulated
  std::vector<SimTask> tasks;              ///< when recorded; compute tasks, then copies
  std::vector<std::pair<int, int>> edges;  ///< when recorded: task dependencies and stream order

  bool fits() const;
  std::int64_t max_peak_memory_bytes() const;
};

struct SimulationOptions {
  bool record_tasks = true;
  bool record_memory = true;  ///< memory history per device (the peak is always computed)
  bool record_edges = false;  ///< needed by critical_path()
  /// DeviceReport::worst_order_peak_bytes: one max-flow per device over the task graph.
  bool worst_order_peaks = false;
  /// Where set, a task's start and end in a measured step (ms, any common origin; nullopt: not
  /// measured), for DeviceReport::measured_order_peak_bytes: the memory model's bytes in the
  /// run's own order, which tells its error apart from the order's (arrival order follows the
  /// timings, which move between the profile and the run).
  std::function<std::optional<std::pair<double, double>>(const SimTask&)> measured_times;
  /// Every compute task at its time plus this many standard deviations of its layers' measured
  /// spread (LayerProfile::forward_ms_spread), relative to their times: one factor for the whole
  /// step, as a machine that runs slow runs every task slow. 0: the times themselves (sim/
  /// interval.hpp takes the interval's ends this way).
  double spread_z = 0.0;
};

/// Predicts one training iteration of a plan: the schedule IR run on a discrete-event engine
/// with a compute stream per device and a copy channel per link direction, and the memory model
/// of docs/memory-model.md. A hardware calibration, if any, applies to every plan (compute scaled
/// for the number of devices the plan keeps busy, the copy link measured under load); clear
/// hardware.calibration to predict without it. Keeps interpolated costs between runs, so reuse one
/// Simulator for many plans of the same profile and hardware. Not thread-safe.
class Simulator {
 public:
  Simulator(const Profile& profile, const Hardware& hardware);
  ~Simulator();

  /// The plan must have passed check_plan() against the same profile and hardware.
  SimulationResult run(const Plan& plan, const SimulationOptions& options = {}) const;
  /// The plan's balance, chunks, devices and optimizer state with a given schedule (read from
  /// a file) instead of the plan's own: one stage per balance entry, as many micro-batches as
  /// the plan's chunks give, each programme on the device the plan names for its stages (or
  /// programme r on device r). Throws InputError when the shapes disagree.
  SimulationResult run(const Plan& plan, const Schedule& schedule,
                       const SimulationOptions& options = {}) const;

  const Profile& profile() const { return profile_; }
  const Hardware& hardware() const { return hardware_; }
  const CostModel& costs() const { return costs_; }
  /// Layers walked for stages' memory so far, over every run: a stage walked in an earlier run
  /// (the same layers, micro-batch size and place) is not walked again.
  std::uint64_t memory_walk_layers() const;
  /// Runs of the event engine so far, over every run: one a simulation, more where co-run or
  /// after-idle times settle the durations by a fixed point (up to 33).
  std::uint64_t engine_runs() const { return engine_runs_; }

 private:
  // The task graph of the last plan's shape (schedule, checkpoint mode, micro-batch count and
  // stage placement). Balances, sizes and links only change durations and memory effects, so a
  // planner that tries many balances of one shape builds the graph once.
  struct Graph {
    bool valid = false;
    bool given = false;  // the schedule came from run(plan, schedule)
    ScheduleKind kind{};
    CheckpointMode checkpoint{};
    int micro_batches = 0;
    int stages_per_device = 1;
    std::vector<int> device_of;
    std::unique_ptr<TaskGraph> graph;  // made by the constructor: TaskGraph is incomplete here
  };
  Graph& graph_for(const Plan& plan, const std::vector<int>& device_of, int micro_batches) const;
  Graph& graph_for(const Schedule& schedule, const std::vector<int>& device_of) const;
  void share_gpu_counters(Graph& g) const;
  SimulationResult simulate(const Plan& plan, const std::vector<int>& device_of,
                            const SimulationOptions& options) const;

  const Profile& profile_;
  const Hardware& hardware_;
  CostModel costs_;
  std::vector<const Link*> links_;  // links_[from * devices + to]
  // By device: shared_gpus(), the GPU it is a share of where two or more devices are shares
  // of it; else -1. Its backwards' launches take turns on one thread, and its memory is the
  // GPU's, one counter for all of its shares.
  std::vector<int> shared_gpu_;
  std::vector<int> device_memory_;  // device_memories(): the counter each device's tensors use
  mutable Graph graph_;
  mutable std::uint64_t engine_runs_ = 0;
  // Each stage's memory walk by its layers, micro-batch size and place (the planner's moves of
  // one stage end change two stages of a plan; the walks were a tenth of its time).
  struct StageMemoryCache;
  std::unique_ptr<StageMemoryCache> stage_memory_;
};

}  // namespace pipetune
