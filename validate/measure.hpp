#pragma once

// Plans run for real on the executor, for validation: several plans, interleaved in rounds so
// that a machine that slows down or speeds up mid-run (thermal limits, a noisy neighbour) moves
// every plan's numbers alike instead of favouring the plan that happened to run first.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sim/plan.hpp"
#include "sim/trace.hpp"

namespace pipetune::models {
struct Model;
}

namespace pipetune::validate {

struct RunSettings {
  std::string device = "cpu";  ///< cpu or cuda
  std::int64_t batch = 32;
  int steps = 10;  ///< measured steps per plan, spread over the rounds
  int warmup = 1;  ///< unmeasured steps at the start of every round
  int rounds = 2;
  int threads = 0;  ///< intra-op threads per CPU device (0: cores / devices)
  std::uint64_t seed = 0;
  std::string optimizer = "sgd";  ///< sgd, momentum, adam or none
  double learning_rate = 0.01;
  bool float64 = false;  ///< the batch's dtype (the model's must match)
  /// > 0 (cuda): the devices are this many equal shares of cuda:0's SMs (ExecutorOptions).
  int sm_partitions = 0;
};

/// What one plan measured over its steps.
struct MeasuredRun {
  Plan plan;
  std::vector<double> pipeline_ms, step_ms, losses;  ///< per measured step, in the order run
  std::vector<std::int64_t> peak_memory_bytes;       ///< per device, the largest over the steps
  std::vector<std::int64_t> library_memory_bytes;    ///< per device, the largest over the steps
  Trace trace;  ///< the step whose pipeline time is the median; peaks as above
  std::vector<std::int64_t> traced_step_peak_bytes;  ///< per device, the traced step's own peak
  /// The host's pace (profiler/host_pace.hpp) on the plan's first device, taken before each
  /// round of its steps: what a profile's launch times are set beside.
  std::vector<double> host_pace_us;
  /// Per measured step where the compute threads' CPU time was measured (TraceTask::cpu_ms: CPU
  /// devices with one intra-op thread), else empty: the share of their tasks' time the threads
  /// ran (cpu_share), and the step replayed at those CPU times (replay_on_cpu_ms), the time it
  /// had taken had no thread waited for a core.
  std::vector<double> cpu_share, on_cpu_ms;

  double median_pipeline_ms() const;
  double median_step_ms() const;
  /// The median absolute deviation of the pipeline times: how much one step's time says.
  double spread_ms() const;
  /// The median of host_pace_us; 0 when none was taken.
  double median_host_pace_us() const;
  /// The medians of cpu_share and on_cpu_ms; -1 when not measured.
  double median_cpu_share() const;
  double median_on_cpu_ms() const;
};

/// One plan's runs of several calls of measure_plans (rounds with something between them) as one
/// run: steps in the order run, each device's largest peaks, and the trace of the round whose
/// median step is nearest the median over every step, its devices' peaks set to the largest.
/// `rounds` holds at least one run.
MeasuredRun merge_rounds(std::vector<MeasuredRun> rounds);

/// Adds one measured step's CPU-time figures (cpu_share, on_cpu_ms) to `run`, where its trace has
/// them.
void add_cpu_times(MeasuredRun& run, const Trace& step);

/// Runs every plan for `settings.steps` measured steps. Throws InputError for a plan the
/// executor refuses and exec::ExecutorError when a stage fails. `progress(done, total)` counts
/// steps, warm-up included.
std::vector<MeasuredRun> measure_plans(
    models::Model& model, const std::vector<Plan>& plans, const RunSettings& settings,
    const std::function<void(std::size_t, std::size_t)>& progress = {});

}  // namespace pipetune::validate
