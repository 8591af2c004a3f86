#pragma once

// Prediction against measurement: what `pipetune validate` reports, and what calibration fits.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "sim/hardware.hpp"
#include "sim/plan.hpp"
#include "sim/profile.hpp"
#include "sim/trace.hpp"

namespace pipetune {

/// The median of `values`: the mean of the middle two for an even count, 0 for none. Measured
/// steps, task errors and calibration fits all take theirs this way.
double median(std::vector<double> values);

/// Which measured step a report shows as "the median step": the index of the lower median of
/// the steps' times (a step that happened, never the mean of two), so that `run --trace` and
/// `validate` show the same step of the same run. Ties go to the earlier step; 0 for none.
std::size_t median_step(const std::vector<double>& step_ms);

/// One task of the programme, as predicted and as measured (times from the iteration's start).
struct TaskComparison {
  TaskKind kind = TaskKind::Forward;
  int stage = 0, micro_batch = 0, device = 0;
  double predicted_start_ms = 0, predicted_end_ms = 0;
  double measured_start_ms = 0, measured_end_ms = 0;

  std::string label() const;
  double predicted_ms() const { return predicted_end_ms - predicted_start_ms; }
  double measured_ms() const { return measured_end_ms - measured_start_ms; }
  double duration_error() const;  ///< (predicted - measured) / measured; 0 when both are 0
  double start_offset_ms() const { return predicted_start_ms - measured_start_ms; }
  double end_offset_ms() const { return predicted_end_ms - measured_end_ms; }
};

struct TraceComparison {
  double predicted_ms = 0.0, measured_ms = 0.0;
  double time_error = 0.0;  ///< (predicted - measured) / measured
  std::vector<std::string> devices;
  std::vector<std::int64_t> predicted_peak_bytes, measured_peak_bytes;
  std::vector<double> memory_error;  ///< per device, (predicted - measured) / measured
  /// Per device, the predicted peak in the worst arrival order (empty when the prediction has
  /// none): a measured peak above the predicted one but not above this is arrival order.
  std::vector<std::int64_t> worst_order_peak_bytes;
  std::vector<TaskComparison> tasks;  ///< every task found in both traces
  std::size_t unmatched = 0;          ///< tasks in one trace only
  double median_abs_duration_error = 0.0;
  /// The compute tasks on each critical path (longest path through the task graph with each
  /// trace's own durations), in order.
  std::vector<std::string> predicted_critical_path, measured_critical_path;
  /// Share of the measured critical path's compute tasks that the predicted one has too.
  double critical_path_agreement = 0.0;
  bool same_critical_path = false;

  /// The tasks whose predicted duration is furthest from the measured one, worst first.
  std::vector<TaskComparison> most_mispredicted(std::size_t count) const;
};

/// Compares a predicted trace with a measured one of the same plan. `measured_ms`, when
/// positive, replaces the measured trace's own iteration time (a median over steps, say).
/// Throws InputError when the two are not of the same plan and devices.
TraceComparison compare_traces(const Trace& predicted, const Trace& measured,
                               const std::string& measured_source, double measured_ms = 0.0);

/// The least time per byte a link fitted from copies is given (its bandwidth at most 1e15 B/s):
/// copies whose time does not grow with their size still give a finite link, a very fast one.
inline constexpr double kLeastCopyMsPerByte = 1e-12;

/// Whether a link fitted from copies sits at (or within 10x of) kLeastCopyMsPerByte: copies that
/// took about the same time whatever their size, which reports show as a time per copy.
inline bool is_flat_copy_link(const Link& fitted) {
  return 1e3 / fitted.bandwidth_bytes_per_s <= 10.0 * kLeastCopyMsPerByte;
}

/// A link from copies timed at two sizes: the latency is the small copies' median time, the
/// bandwidth what the large copies' median adds per byte (at least kLeastCopyMsPerByte, so a
/// large copy measured no slower than a small one gives a finite, very fast link). The link probes
/// of one process (threads, CUDA devices) and of several (ranks) both fit this way.
Link link_from_copies(const std::vector<double>& small_ms, std::int64_t small_bytes,
                      const std::vector<double>& large_ms, std::int64_t large_bytes);

/// A calibration fitted from runs: pairs of (prediction without calibration, measurement),
/// each of a different plan. Compute tasks give the time scale per number of busy devices
/// (median of measured over predicted durations); copies a link, by least squares of time
/// against bytes with a slope of at least kLeastCopyMsPerByte (copies whose time does not grow
/// with their size give their mean time as a latency, on a very fast link).
/// `plan_names` go into fitted_on.
Calibration fit_calibration(const std::vector<std::pair<Trace, Trace>>& runs,
                            const std::vector<std::string>& plan_names);

/// A run a calibration may be fitted on: a plan and its measurement (`measured_ms`, the median
/// step, is what the time error is taken against).
struct CalibrationRun {
  Plan plan;
  Trace measured;
  double measured_ms = 0.0;
  /// The measurement's own noise, relative to measured_ms: the half-width of a 95 % interval of
  /// the median step (measurement_noise()); 0 where not known.
  double noise = 0.0;
};

/// The half-width of a 95 % interval of the median of `steps` measured times, relative to that
/// median: 1.96 standard errors, a median's being 1.253 σ / √n with σ = 1.4826 × the median
/// absolute deviation. 0 for fewer than two steps or a median of 0.
double measurement_noise(const std::vector<double>& steps);

/// Whether a calibration earns its place, and the one to use.
struct CalibrationChoice {
  Calibration fitted;  ///< fitted on every run, only the parts used when used (empty with no run)
  bool used = false;   ///< apply `fitted`; else predict uncalibrated
  std::string reason;  ///< one line: why it is used or not, with the errors behind it
  /// Per run, signed time errors: uncalibrated; with `fitted` (in sample); with a calibration
  /// fitted on the other runs alone, the same parts kept (out of sample; empty with fewer than
  /// two runs).
  std::vector<double> uncalibrated_error, in_sample_error, out_of_sample_error;
};

/// Fits a calibration on `runs` and uses it only where it helps: out of sample (each run
/// predicted by a fit on the others) its mean |error| must be below the uncalibrated one by
/// more than the runs' mean noise (CalibrationRun::noise: a gain inside it is luck), and
/// in sample it may be worse than uncalibrated on no run. Its compute part alone and its copy
/// part alone are judged the same way, and the one off least out of sample is used (the whole
/// calibration on a tie), so a part that carries over between plans is kept without the other.
/// `hardware` carries no calibration.
CalibrationChoice choose_calibration(const Profile& profile, const Hardware& hardware,
                                     const std::vector<CalibrationRun>& runs);

}  // namespace pipetune
