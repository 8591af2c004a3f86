#include "sim/compare.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "sim/critical_path.hpp"
#include "sim/error.hpp"
#include "sim/replay.hpp"
#include "sim/simulator.hpp"

namespace pipetune {

namespace {

std::vector<std::string> compute_path(const Trace& trace, const std::string& source) {
  const ReplayResult replay = replay_trace(trace, source);
  std::vector<std::string> out;
  for (int t : critical_path(replay.timeline)) {
    if (is_compute(replay.timeline.tasks[t].kind)) out.push_back(replay.timeline.tasks[t].label());
  }
  return out;
}

double fraction_error(double predicted, double measured) {
  if (measured == 0.0) return predicted == 0.0 ? 0.0 : 1.0;
  return (predicted - measured) / measured;
}

}  // namespace

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

std::size_t median_step(const std::vector<double>& step_ms) {
  if (step_ms.empty()) return 0;
  std::vector<std::size_t> order(step_ms.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return step_ms[a] < step_ms[b]; });
  return order[(order.size() - 1) / 2];
}

Link link_from_copies(const std::vector<double>& small_ms, std::int64_t small_bytes,
                      const std::vector<double>& large_ms, std::int64_t large_bytes) {
  const double fixed = median(small_ms);
  const double per_byte =
      std::max(kLeastCopyMsPerByte,
               (median(large_ms) - fixed) / static_cast<double>(large_bytes - small_bytes));
  Link link;
  link.latency_ms = fixed;
  link.bandwidth_bytes_per_s = 1e3 / per_byte;
  return link;
}

std::string TaskComparison::label() const {
  return task_label(kind, stage, micro_batch);
}

double TaskComparison::duration_error() const {
  return fraction_error(predicted_ms(), measured_ms());
}

std::vector<TaskComparison> TraceComparison::most_mispredicted(std::size_t count) const {
  std::vector<TaskComparison> out = tasks;
  std::stable_sort(out.begin(), out.end(), [](const TaskComparison& a, const TaskComparison& b) {
    return std::abs(a.predicted_ms() - a.measured_ms()) >
           std::abs(b.predicted_ms() - b.measured_ms());
  });
  if (out.size() > count) out.resize(count);
  return out;
}

TraceComparison compare_traces(const Trace& predicted, const Trace& measured,
                               const std::string& measured_source, double measured_ms) {
  if (predicted.plan && measured.plan &&
      (predicted.plan->balance != measured.plan->balance ||
       predicted.plan->chunks != measured.plan->chunks ||
       predicted.plan->checkpoint != measured.plan->checkpoint ||
       predicted.plan->schedule != measured.plan->schedule)) {
    throw InputError(fmt::format("{}: measured {}, but the prediction is of {}", measured_source,
                                 describe_plan(*measured.plan), describe_plan(*predicted.plan)));
  }
  if (predicted.devices.size() != measured.devices.size()) {
    throw InputError(fmt::format("{}: measured on {} devices, predicted for {}", measured_source,
                                 measured.devices.size(), predicted.devices.size()));
  }
  TraceComparison c;
  c.predicted_ms = predicted.iteration_ms;
  c.measured_ms = measured_ms > 0 ? measured_ms : measured.iteration_ms;
  c.time_error = fraction_error(c.predicted_ms, c.measured_ms);
  // Devices are paired by the stages they hold: the simulator lists them in the hardware's
  // order, the executor in the order stages first use them.
  const bool worst_order_known =
      !predicted.devices.empty() &&
      std::all_of(predicted.devices.begin(), predicted.devices.end(),
                  [](const TraceDevice& d) { return d.worst_order_peak_bytes > 0; });
  for (std::size_t d = 0; d < predicted.devices.size(); ++d) {
    std::size_t m = d;
    for (std::size_t k = 0; k < measured.devices.size(); ++k) {
      if (!predicted.devices[d].stages.empty() &&
          measured.devices[k].stages == predicted.devices[d].stages)
        m = k;
    }
    c.devices.push_back(measured.devices[m].name);
    c.predicted_peak_bytes.push_back(predicted.devices[d].peak_memory_bytes);
    if (worst_order_known) {
      c.worst_order_peak_bytes.push_back(predicted.devices[d].worst_order_peak_bytes);
    }
    c.measured_peak_bytes.push_back(measured.devices[m].peak_memory_bytes);
    c.memory_error.push_back(
        fraction_error(static_cast<double>(predicted.devices[d].peak_memory_bytes),
                       static_cast<double>(measured.devices[m].peak_memory_bytes)));
  }
  // Both traces start their iteration at their first task.
  const double po = task_span(predicted.tasks).start_ms, mo = task_span(measured.tasks).start_ms;
  const TaskMatching matching = match_tasks(predicted, measured, measured_source);
  c.unmatched = matching.unmatched;
  std::vector<double> errors;
  for (const auto& [predicted_index, measured_index] : matching.pairs) {
    const TraceTask& p = predicted.tasks[predicted_index];
    const TraceTask& m = measured.tasks[measured_index];
    TaskComparison tc;
    tc.kind = p.kind;
    tc.stage = p.stage;
    tc.micro_batch = p.micro_batch;
    tc.device = p.device;
    tc.predicted_start_ms = p.start_ms - po;
    tc.predicted_end_ms = p.end_ms - po;
    tc.measured_start_ms = m.start_ms - mo;
    tc.measured_end_ms = m.end_ms - mo;
    if (is_compute(p.kind)) errors.push_back(std::abs(tc.duration_error()));
    c.tasks.push_back(tc);
  }
  c.median_abs_duration_error = median(errors);

  c.predicted_critical_path = compute_path(predicted, "the prediction");
  c.measured_critical_path = compute_path(measured, measured_source);
  c.same_critical_path = c.predicted_critical_path == c.measured_critical_path;
  const std::set<std::string> on_predicted(c.predicted_critical_path.begin(),
                                           c.predicted_critical_path.end());
  std::size_t shared = 0;
  for (const auto& label : c.measured_critical_path) shared += on_predicted.count(label);
  c.critical_path_agreement = c.measured_critical_path.empty()
                                  ? 1.0
                                  : static_cast<double>(shared) / c.measured_critical_path.size();
  return c;
}

namespace {

// measured = scale * predicted + overhead, fitted robustly: the line through the medians of the
// shorter and the longer half of the tasks (Wald's two-group method), so a few slow outliers do
// not move it. When the tasks are all about as long, only the ratio can be told: no overhead.
std::pair<double, double> fit_scale_and_overhead(std::vector<std::pair<double, double>> pairs) {
  std::sort(pairs.begin(), pairs.end());
  const std::size_t half = pairs.size() / 2;
  auto medians = [&](std::size_t from, std::size_t to) {
    std::vector<double> p, m;
    for (std::size_t k = from; k < to; ++k)
      p.push_back(pairs[k].first), m.push_back(pairs[k].second);
    return std::pair{median(p), median(m)};
  };
  if (half >= 2) {
    const auto [p_lo, m_lo] = medians(0, half);
    const auto [p_hi, m_hi] = medians(pairs.size() - half, pairs.size());
    if (p_hi >= 1.5 * p_lo) {
      const double slope = (m_hi - m_lo) / (p_hi - p_lo);
      const double intercept = m_lo - slope * p_lo;
      if (slope > 0 && intercept > 0) return {slope, intercept};
    }
  }
  std::vector<double> ratios;
  for (auto [p, m] : pairs) ratios.push_back(m / p);
  return {median(ratios), 0.0};
}

}  // namespace

Calibration fit_calibration(const std::vector<std::pair<Trace, Trace>>& runs,
                            const std::vector<std::string>& plan_names) {
  Calibration cal;
  std::map<int, std::vector<std::pair<double, double>>>
      compute;                                    // busy devices -> (predicted, measured)
  std::vector<std::pair<double, double>> copies;  // (bytes, ms)
  for (std::size_t run = 0; run < runs.size(); ++run) {
    const auto& [predicted, measured] = runs[run];
    const int devices = static_cast<int>(predicted.devices.size());
    const std::string source = run < plan_names.size() ? "the measurement of " + plan_names[run]
                                                       : fmt::format("measured run {}", run + 1);
    for (const auto& [predicted_index, measured_index] :
         match_tasks(predicted, measured, source).pairs) {
      const TraceTask& p = predicted.tasks[predicted_index];
      const TraceTask& m = measured.tasks[measured_index];
      if (is_compute(p.kind)) {
        if (p.duration_ms() > 1e-6) compute[devices].emplace_back(p.duration_ms(), m.duration_ms());
      } else {
        copies.emplace_back(static_cast<double>(m.bytes), m.duration_ms());
      }
    }
  }
  // One overhead for the machine (the median of what each device count suggests), then each
  // count's scale given that overhead.
  std::vector<double> overheads;
  for (const auto& [devices, pairs] : compute)
    overheads.push_back(fit_scale_and_overhead(pairs).second);
  cal.task_overhead_ms = median(overheads);
  for (const auto& [devices, pairs] : compute) {
    std::vector<double> ratios;
    for (auto [p, m] : pairs) ratios.push_back((m - cal.task_overhead_ms) / p);
    cal.compute_scale[devices] = median(ratios);
  }
  // Copies: least squares of time against bytes, the slope at least kLeastCopyMsPerByte. Copies
  // whose time does not grow with their size (between processes whose I/O threads wait for a
  // core, the wait dwarfs the bytes) give a constant: their mean time, on a very fast link.
  if (copies.size() >= 2) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (auto [x, y] : copies) sx += x, sy += y, sxx += x * x, sxy += x * y;
    const double n = static_cast<double>(copies.size());
    const double var = sxx - sx * sx / n;
    const double slope =
        std::max(kLeastCopyMsPerByte, var > 0 ? (sxy - sx * sy / n) / var : 0.0);  // ms per byte
    Link link;
    link.bandwidth_bytes_per_s = 1e3 / slope;
    link.latency_ms = std::max(0.0, (sy - slope * sx) / n);
    cal.copy = link;
  }
  cal.fitted_on = plan_names;
  return cal;
}

namespace {

double mean_abs(const std::vector<double>& errors) {
  double sum = 0.0;
  for (double e : errors) sum += std::abs(e);
  return errors.empty() ? 0.0 : sum / static_cast<double>(errors.size());
}

std::string percent(double e) {
  return fmt::format("{:.1f} %", 100.0 * std::abs(e));
}

// A calibration keeps only some of its parts: compute (scale and per-task overhead), copies (the
// link), or both. On a machine where one part carries over between plans and the other does not
// (copies between processes slowed by scheduling, compute steady; or the other way round), the
// part that does can still be used.
enum class CalibrationParts { Compute, Copies, Both };

Calibration keep_parts(Calibration c, CalibrationParts parts) {
  if (parts == CalibrationParts::Copies) {
    c.compute_scale.clear();
    c.task_overhead_ms = 0.0;
  }
  if (parts == CalibrationParts::Compute) c.copy.reset();
  return c;
}

const char* parts_name(CalibrationParts parts) {
  switch (parts) {
    case CalibrationParts::Compute:
      return " (compute only)";
    case CalibrationParts::Copies:
      return " (copies only)";
    case CalibrationParts::Both:
      return "";
  }
  return "";
}

}  // namespace

double measurement_noise(const std::vector<double>& steps) {
  if (steps.size() < 2) return 0.0;
  auto median_of = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  };
  const double m = median_of(steps);
  if (m <= 0.0) return 0.0;
  std::vector<double> deviations;
  for (double t : steps) deviations.push_back(std::abs(t - m));
  const double sigma = 1.4826 * median_of(deviations);
  return 1.96 * 1.253 * sigma / std::sqrt(static_cast<double>(steps.size())) / m;
}

namespace {

// A calibration's plans, predicted and measured: fits on all or all but one of them, and the
// time error each calibration leaves on them.
class CalibrationRuns {
 public:
  CalibrationRuns(const Profile& profile, const Hardware& hardware,
                  const std::vector<CalibrationRun>& runs)
      : profile_(profile), hardware_(hardware), runs_(runs) {
    for (const auto& r : runs) {
      predicted_.push_back(
          trace_from_simulation(Simulator(profile, hardware).run(r.plan), profile.model));
      names_.push_back(describe_plan(r.plan));
    }
  }
  std::size_t size() const { return runs_.size(); }
  const std::string& name(std::size_t k) const { return names_[k]; }

  // The time error of every run (or of run `only`) predicted with `calibration`.
  std::vector<double> errors_with(const Calibration& calibration,
                                  std::size_t only = SIZE_MAX) const {
    std::vector<double> out;
    Hardware calibrated = hardware_;
    calibrated.calibration = calibration;
    for (std::size_t k = 0; k < runs_.size(); ++k) {
      if (only != SIZE_MAX && k != only) continue;
      const double ms = Simulator(profile_, calibrated).run(runs_[k].plan).iteration_ms;
      out.push_back(fraction_error(ms, runs_[k].measured_ms));
    }
    return out;
  }
  // Fitted on every run but `leave_out` (SIZE_MAX: on all).
  Calibration fit(std::size_t leave_out = SIZE_MAX) const {
    std::vector<std::pair<Trace, Trace>> pairs;
    std::vector<std::string> fitted_names;
    for (std::size_t k = 0; k < runs_.size(); ++k) {
      if (k == leave_out) continue;
      pairs.emplace_back(predicted_[k], runs_[k].measured);
      fitted_names.push_back(names_[k]);
    }
    return fit_calibration(pairs, fitted_names);
  }
  // The runs' own noise, on average.
  double noise() const {
    double noise = 0.0;
    for (const auto& r : runs_) noise += r.noise / static_cast<double>(runs_.size());
    return noise;
  }

 private:
  const Profile& profile_;
  const Hardware& hardware_;
  const std::vector<CalibrationRun>& runs_;
  std::vector<Trace> predicted_;
  std::vector<std::string> names_;
};

// A choice of a calibration's parts, judged as the whole is: out of sample, then on every plan
// it was fitted on. Its `rejection` says why it is not used ("" when it may be).
struct CalibrationCandidate {
  CalibrationParts parts;
  double held_out = 0.0;
  std::vector<double> out_of_sample, in_sample;
  std::string rejection;
};

CalibrationCandidate judge_parts(CalibrationParts parts, const CalibrationRuns& runs,
                                 const CalibrationChoice& choice,
                                 const std::vector<Calibration>& held_out_fits) {
  const std::size_t n = runs.size();
  const double without = mean_abs(choice.uncalibrated_error);
  const double noise = runs.noise();
  CalibrationCandidate c{parts, 0.0, {}, {}, {}};
  for (std::size_t k = 0; k < n; ++k)
    c.out_of_sample.push_back(runs.errors_with(keep_parts(held_out_fits[k], parts), k).front());
  c.held_out = mean_abs(c.out_of_sample);
  c.in_sample = parts == CalibrationParts::Both
                    ? choice.in_sample_error
                    : runs.errors_with(keep_parts(choice.fitted, parts));
  if (c.held_out >= without) {
    c.rejection =
        fmt::format("on plans it was not fitted on it is off by {} on average, uncalibrated {}",
                    percent(c.held_out), percent(without));
  } else if (without - c.held_out <= noise) {
    c.rejection = fmt::format(
        "on plans it was not fitted on it is off by {} on average, uncalibrated {}: a gain "
        "within the runs' own noise (±{})",
        percent(c.held_out), percent(without), percent(noise));
  }
  for (std::size_t k = 0; k < n && c.rejection.empty(); ++k) {
    if (std::abs(c.in_sample[k]) > std::abs(choice.uncalibrated_error[k])) {
      c.rejection =
          fmt::format("on {}, a plan it was fitted on, it is off by {}, uncalibrated {}",
                      runs.name(k), percent(c.in_sample[k]), percent(choice.uncalibrated_error[k]));
    }
  }
  return c;
}

}  // namespace

CalibrationChoice choose_calibration(const Profile& profile, const Hardware& hardware,
                                     const std::vector<CalibrationRun>& run_list) {
  CalibrationChoice choice;
  const CalibrationRuns runs(profile, hardware, run_list);
  const std::size_t n = runs.size();
  if (n == 0) {
    choice.reason = "no run to fit it on";
    return choice;
  }
  choice.fitted = runs.fit();
  choice.uncalibrated_error = runs.errors_with({});
  choice.in_sample_error = runs.errors_with(choice.fitted);
  if (choice.fitted.empty()) {
    choice.reason = "the runs gave nothing to fit";
    return choice;
  }
  if (n < 2) {
    choice.reason = "one run leaves none to judge it on";
    return choice;
  }
  std::vector<Calibration> held_out_fits;
  for (std::size_t k = 0; k < n; ++k) held_out_fits.push_back(runs.fit(k));
  for (std::size_t k = 0; k < n; ++k)
    choice.out_of_sample_error.push_back(runs.errors_with(held_out_fits[k], k).front());

  // The whole calibration first, so that a part alone wins only by being strictly better; the
  // parts only when both were fitted (else either is the whole).
  std::vector<CalibrationParts> choices{CalibrationParts::Both};
  if (!choice.fitted.compute_scale.empty() && choice.fitted.copy)
    choices.insert(choices.end(), {CalibrationParts::Compute, CalibrationParts::Copies});
  std::vector<CalibrationCandidate> passed;
  std::string rejection;
  for (CalibrationParts parts : choices) {
    CalibrationCandidate c = judge_parts(parts, runs, choice, held_out_fits);
    if (parts == CalibrationParts::Both) rejection = c.rejection;
    if (c.rejection.empty()) passed.push_back(std::move(c));
  }
  if (passed.empty()) {
    choice.reason = "not used: " + rejection;
    return choice;
  }
  const CalibrationCandidate* best = &passed.front();
  for (const CalibrationCandidate& c : passed) {
    if (c.held_out < best->held_out) best = &c;
  }
  choice.used = true;
  choice.fitted = keep_parts(choice.fitted, best->parts);
  choice.in_sample_error = best->in_sample;
  choice.out_of_sample_error = best->out_of_sample;
  choice.reason = fmt::format(
      "used{}: on plans it was not fitted on it is off by {} on average, uncalibrated {}; "
      "no worse on any plan it was fitted on",
      parts_name(best->parts), percent(best->held_out),
      percent(mean_abs(choice.uncalibrated_error)));
  return choice;
}

}  // namespace pipetune
