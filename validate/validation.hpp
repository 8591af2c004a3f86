#pragma once

// Predict, run, compare: the loop pipetune exists for, shared by `pipetune validate` and
// `pipetune demo`.
//
//   profile   the model's layers on the device (or a profile given to reuse); with K profile
//             rounds, again before each round of the runs, pooled (sim/profile_pool.hpp) so
//             that the predictions and the runs see the machine's drift alike
//   hardware  the devices and links probed (or a hardware.json given), and its calibration:
//             reused when the file has one, else fitted on a few plans run briefly that are
//             not among those validated, and used only where it earns its place
//             (choose_calibration), so its accuracy is judged on plans it never saw
//   plan      the planner's N best (or the plans given)
//   predict   each plan with the calibration and without
//   run       each plan on the executor, interleaved in rounds
//   compare   time, memory, every task, the critical path, the ranking
//
// The header is free of LibTorch so reports can be built and tested from plain data.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "sim/compare.hpp"
#include "sim/hardware.hpp"
#include "sim/interval.hpp"
#include "sim/planner/planner.hpp"
#include "sim/profile.hpp"
#include "validate/measure.hpp"

namespace pipetune::validate {

struct ValidationOptions {
  std::string model_spec;
  bool deferred_batch_norm = false;
  RunSettings run;            ///< device, batch, steps, … (run.float64: the model's dtype too)
  int devices = 2;            ///< pipeline devices: CPU worker threads, or the first CUDA devices
  std::string profile_path;   ///< reuse this profile ("" : profile now)
  std::string hardware_path;  ///< reuse these devices and links, and their calibration
  /// Validate these plans instead of the planner's best, with their files for error messages.
  std::vector<Plan> plans;
  std::vector<std::string> plan_sources;
  int top = 3;                ///< how many of the planner's best plans to validate
  PlannerOptions planner;     ///< chunk counts, modes and schedules the planner may choose
  int calibration_plans = 2;  ///< plans run to fit a calibration; 0: none
  int calibration_steps = 4;
  bool recalibrate = false;  ///< fit anew even when the hardware file has a calibration
  int profile_repeats = 5, profile_warmup = 2;
  /// > 1: profile this many times, once before each of as many rounds of the runs (which then
  /// replace run.rounds), and predict from the profiles pooled; the later rounds time only the
  /// sizes the plans' micro-batches read. Needs a profile taken now, and run.steps ≥ this.
  int profile_rounds = 1;
  /// CPU: the co-runners each layer is also timed beside (profiler::ProfileOptions); -1: one
  /// per other device (devices - 1); 0: none, the simulator then uses solo times alone.
  int co_runners = -1;
  std::string out_dir;  ///< everything is written here
  /// Where the plans run. Unset: in this process (measure_plans). `pipetune validate
  /// --distributed` runs each plan as one process per device instead (cli/distributed_runs).
  std::function<std::vector<MeasuredRun>(
      const std::vector<Plan>& plans, const RunSettings& settings,
      const std::function<void(std::size_t, std::size_t)>& progress)>
      measure;
  /// The devices and links when no hardware file is given, for a model of `layers` layers.
  /// Unset: probed in this process.
  std::function<Hardware(int layers)> probe;
  /// Long work reports here: a phase ("profile", "plan", "calibrate", "run"), then its progress.
  std::function<void(const std::string& phase, std::size_t done, std::size_t total)> progress;
};

/// One plan: its predictions, what it measured, how they compare, and where the traces are.
struct PlanValidation {
  MeasuredRun measured;
  Trace predicted;             ///< without calibration
  Trace predicted_calibrated;  ///< with the calibration (= predicted when there is none)
  TraceComparison uncalibrated, calibrated;
  std::string plan_path, measured_trace_path, predicted_trace_path, calibrated_trace_path;
  int predicted_rank = 0, measured_rank = 0;  ///< 1 = best, among the plans validated
  /// Per device of the measured trace (paired by stages), the prediction's peak with every task
  /// at its time in the traced step (SimulationOptions::measured_times): the memory model's
  /// bytes in that step's own arrival order, against MeasuredRun::traced_step_peak_bytes. Empty
  /// when a task or a device is not in the trace.
  std::vector<std::int64_t> measured_order_peak_bytes;
  /// The headline prediction's 80 % interval (sim/interval.hpp), and how many of the measured
  /// steps (MeasuredRun::pipeline_ms) fell inside it.
  IterationInterval interval;
  std::size_t steps_inside = 0;
  const Plan& plan() const { return measured.plan; }
};

struct Validation {
  std::string model, model_spec, device;
  std::int64_t batch = 0;
  std::string profile_path;
  bool profiled = false;         ///< the profile was taken by this run (else reused)
  double profile_seconds = 0.0;  ///< every round's together
  /// With profile rounds (ValidationOptions::profile_rounds > 1): each round's profile, and the
  /// sizes the later ones timed; profile_path is then their pool.
  std::vector<std::string> round_profile_paths;
  std::vector<std::int64_t> reprofiled_sizes;
  std::string hardware_path;  ///< the hardware (calibration included) as written
  Hardware hardware;
  bool calibration_fitted = false;  ///< fitted by this run and used (else reused, or none)
  /// Why this run's calibration is used or not (choose_calibration); "" when none was fitted.
  std::string calibration_reason;
  Calibration unused_calibration;  ///< fitted by this run but not used (empty otherwise)
  std::vector<PlanValidation> calibration_runs;  ///< the plans it was fitted on
  std::vector<PlanValidation> plans;             ///< the plans validated, planner's order
  /// Over every plan: the measured steps inside their plan's interval, and all of them.
  std::size_t steps_inside() const;
  std::size_t steps_measured() const;
  bool planner_proven = true;  ///< the first plan is optimal under the model (when planned)
  std::string planner_space;   ///< over what (search_space_text), when planned
  double seconds = 0.0;

  bool has_calibration() const { return !hardware.calibration.empty(); }
  /// The comparison that counts: calibrated when there is a calibration.
  static const TraceComparison& headline(const PlanValidation& p, bool calibrated) {
    return calibrated ? p.calibrated : p.uncalibrated;
  }
  const TraceComparison& headline(const PlanValidation& p) const {
    return headline(p, has_calibration());
  }
  /// Index of the plan predicted fastest, and of the plan measured fastest.
  std::size_t predicted_best() const;
  std::size_t measured_best() const;
  /// The predicted-best plan's measured time is within the step-to-step spread of the
  /// measured best's (true when they are the same plan).
  bool predicted_best_within_noise() const;
};

/// Runs the whole loop; throws InputError for bad options or inputs, exec::ExecutorError when a
/// stage fails. Nothing is written outside out_dir.
Validation run_validation(const ValidationOptions& options);

/// The calibration plans for a validation: the time-balanced split at a few chunk counts (the
/// validated plans' fewest and most first) and checkpoint modes, first in the validated plans'
/// layouts (schedule, stages per device, devices) in turn, then one stage per device over
/// `stages` devices in GPipe and 1F1B; none of them `validated`, all fitting the hardware's
/// memory.
std::vector<Plan> calibration_plans(const Profile& profile, const Hardware& hardware, int stages,
                                    const std::vector<Plan>& validated, int count);

/// Why a calibration fitted on plans `fitted_on` must not predict `predicted` (a batch of
/// `batch` samples split as tensor.chunk does): some micro-batch of `predicted` is smaller or
/// larger than every one it was fitted on, where its out-of-sample check says nothing. Nothing
/// when inside.
std::optional<std::string> outside_fitted_sizes(const std::vector<Plan>& fitted_on,
                                                const std::vector<Plan>& predicted,
                                                std::int64_t batch);

}  // namespace pipetune::validate
