#include "cli/validate_report.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/report.hpp"
#include "cli/table.hpp"
#include "sim/units.hpp"

namespace pipetune::cli {

using validate::PlanValidation;
using validate::Validation;

namespace {

std::string signed_percent(double fraction) {
  return fmt::format("{:+.1f} %", fraction * 100.0);
}

// The device whose memory is mispredicted most (by |error|).
std::size_t worst_memory_device(const TraceComparison& c) {
  std::size_t worst = 0;
  for (std::size_t d = 0; d < c.memory_error.size(); ++d) {
    if (std::abs(c.memory_error[d]) > std::abs(c.memory_error[worst])) worst = d;
  }
  return worst;
}

// Of the measured peaks more than 0.5 % above their prediction, how many the worst arrival order
// covers: those are the steps' own order, not the memory model (empty when no prediction has the
// bound).
std::string arrival_order_sentence(const Validation& v) {
  int above = 0, covered = 0;
  for (const PlanValidation& p : v.plans) {
    const TraceComparison& c = v.headline(p);
    if (c.worst_order_peak_bytes.size() != c.measured_peak_bytes.size()) return "";
    for (std::size_t d = 0; d < c.measured_peak_bytes.size(); ++d) {
      // Half a percent either way is the model's own small terms, not an arrival.
      if (static_cast<double>(c.measured_peak_bytes[d]) <=
          1.005 * static_cast<double>(c.predicted_peak_bytes[d]))
        continue;
      ++above;
      if (static_cast<double>(c.measured_peak_bytes[d]) <=
          1.005 * static_cast<double>(c.worst_order_peak_bytes[d]))
        ++covered;
    }
  }
  if (above == 0) return "no device peaked more than 0.5 % above its prediction";
  return fmt::format(
      "{} device peak{} more than 0.5 % above the prediction, {} of them at most 0.5 % above the "
      "worst arrival order's",
      above, above == 1 ? "" : "s", covered);
}

// The memory model's peaks with every task at its time in the traced step, against that step's
// own peaks: its bytes without the arrival order, which the step's timings decided (empty when
// no plan has them).
std::string own_order_sentence(const Validation& v) {
  std::vector<double> errors;
  for (const PlanValidation& p : v.plans) {
    const auto& predicted = p.measured_order_peak_bytes;
    const auto& measured = p.measured.traced_step_peak_bytes;
    if (predicted.size() != measured.size()) continue;
    for (std::size_t d = 0; d < measured.size(); ++d) {
      if (measured[d] > 0)
        errors.push_back(
            std::abs(static_cast<double>(predicted[d]) / static_cast<double>(measured[d]) - 1.0));
    }
  }
  if (errors.empty()) return "";
  std::sort(errors.begin(), errors.end());
  return fmt::format(
      "in each traced step's own order of tasks, the memory model's peaks: median |error| {:.1f} "
      "%, worst "
      "{:.1f} % over {} devices",
      100.0 * errors[errors.size() / 2], 100.0 * errors.back(), errors.size());
}

// How much of their tasks' time the compute threads ran, and the steps replayed without the
// waits for a core: on a machine whose cores are shared (another process, a VM's host) the
// measured time holds waits no profile of the plan can know (empty when not measured).
std::string cores_sentence(const Validation& v) {
  std::vector<std::string> shares, on_cpu, errors;
  for (const PlanValidation& p : v.plans) {
    const double share = p.measured.median_cpu_share();
    const double replayed = p.measured.median_on_cpu_ms();
    if (share < 0 || replayed <= 0) return "";
    shares.push_back(fmt::format("{:.0f} %", 100.0 * share));
    on_cpu.push_back(format_ms(replayed));
    errors.push_back(signed_percent(v.headline(p).predicted_ms / replayed - 1.0));
  }
  if (shares.empty()) return "";
  return fmt::format(
      "the compute threads ran {} of their tasks' time (median step; the rest they waited for a "
      "core); replayed without those waits the steps take {} ms, time error against them {}",
      fmt::join(shares, ", "), fmt::join(on_cpu, ", "), fmt::join(errors, ", "));
}

std::string ordinal(int n) {
  const char* suffix = n % 100 / 10 == 1 ? "th"
                       : n % 10 == 1     ? "st"
                       : n % 10 == 2     ? "nd"
                       : n % 10 == 3     ? "rd"
                                         : "th";
  return fmt::format("{}{}", n, suffix);
}

std::string ranking_sentence(const Validation& v) {
  if (v.plans.size() < 2) return "one plan run: nothing to rank";
  const std::size_t p = v.predicted_best(), m = v.measured_best();
  const PlanValidation& pb = v.plans[p];
  if (p == m) {
    return fmt::format("the predicted best (plan {}) measured best of the {} plans run", p + 1,
                       v.plans.size());
  }
  const double slower =
      pb.measured.median_pipeline_ms() / v.plans[m].measured.median_pipeline_ms() - 1.0;
  return fmt::format("the predicted best (plan {}) measured {}, {:.1f} % slower than plan {}: {}",
                     p + 1, ordinal(pb.measured_rank), slower * 100.0, m + 1,
                     v.predicted_best_within_noise() ? "within the step-to-step spread"
                                                     : "beyond the step-to-step spread");
}

// The table shared by the terminal and markdown reports.
std::vector<std::string> headers(bool calibrated) {
  std::vector<std::string> h{"#", "plan", "predicted ms"};
  if (calibrated) h.push_back("calibrated ms");
  h.insert(h.end(), {"measured ms", "time error"});
  if (calibrated) h.push_back("error calibrated");
  h.insert(h.end(), {"80 % interval", "steps in"});
  h.insert(h.end(), {"peak predicted", "peak measured", "memory error", "critical path", "rank"});
  return h;
}

std::vector<std::string> cells(const Validation& v, const PlanValidation& p, std::size_t index) {
  const bool cal = v.has_calibration();
  const TraceComparison& h = v.headline(p);
  const std::size_t d = worst_memory_device(h);
  std::vector<std::string> row{fmt::format("{}", index + 1), describe_plan(p.plan()),
                               format_ms(p.uncalibrated.predicted_ms)};
  if (cal) row.push_back(format_ms(p.calibrated.predicted_ms));
  row.push_back(fmt::format("{} ± {}", format_ms(p.measured.median_pipeline_ms()),
                            format_ms(p.measured.spread_ms())));
  row.push_back(signed_percent(p.uncalibrated.time_error));
  if (cal) row.push_back(signed_percent(p.calibrated.time_error));
  row.push_back(p.interval.known() ? fmt::format("{} - {}", format_ms(p.interval.low_ms),
                                                 format_ms(p.interval.high_ms))
                                   : "-");
  row.push_back(fmt::format("{} / {}", p.steps_inside, p.measured.pipeline_ms.size()));
  row.push_back(h.predicted_peak_bytes.empty() ? "-" : format_bytes(h.predicted_peak_bytes[d]));
  row.push_back(h.measured_peak_bytes.empty() ? "-" : format_bytes(h.measured_peak_bytes[d]));
  row.push_back(h.memory_error.empty() ? "-" : signed_percent(h.memory_error[d]));
  row.push_back(h.same_critical_path
                    ? "same"
                    : fmt::format("{:.0f} % shared", 100.0 * h.critical_path_agreement));
  row.push_back(fmt::format("{} / {}", p.predicted_rank, p.measured_rank));
  return row;
}

std::vector<std::string> task_lines(const Validation& v, const PlanValidation& p,
                                    std::size_t count) {
  std::vector<std::string> out;
  for (const auto& t : v.headline(p).most_mispredicted(count)) {
    out.push_back(
        fmt::format("{} predicted {} ms, measured {} ms ({:+.3f} ms); starts {:+.3f} ms off",
                    t.label(), format_ms(t.predicted_ms()), format_ms(t.measured_ms()),
                    t.predicted_ms() - t.measured_ms(), t.start_offset_ms()));
  }
  return out;
}

// Where the measured steps fell against the predicted intervals, over every plan.
std::string coverage_sentence(const Validation& v) {
  if (v.plans.empty()) return "";
  if (!v.plans.front().interval.known())
    return "none: the profile has no spreads of its layers' times (profile again for them)";
  const std::string from = v.hardware.model_error > 0
                               ? fmt::format(", the model's error here ±{:.1f} % among them",
                                             100.0 * v.hardware.model_error)
                               : "";
  std::vector<double> widths;
  for (const auto& p : v.plans) widths.push_back(p.interval.width());
  std::sort(widths.begin(), widths.end());
  const std::size_t in = v.steps_inside(), all = v.steps_measured();
  return fmt::format(
      "{} of {} measured steps inside their plan's 80 % interval ({:.0f} %; 70-90 % is right), "
      "median width {:.1f} %{}",
      in, all, all ? 100.0 * static_cast<double>(in) / static_cast<double>(all) : 0.0,
      100.0 * widths[widths.size() / 2], from);
}

std::string calibration_fit_line(const Validation& v) {
  std::vector<std::string> errors;
  for (const auto& c : v.calibration_runs) {
    errors.push_back(
        fmt::format("{} {}", describe_plan(c.plan()), signed_percent(c.calibrated.time_error)));
  }
  return fmt::format("{}", fmt::join(errors, ", "));
}

// How the profile was taken: now (in rounds between the runs, pooled) or reused.
std::string profile_origin(const Validation& v) {
  if (!v.profiled) return "reused";
  if (v.round_profile_paths.empty()) return fmt::format("taken now, {:.1f} s", v.profile_seconds);
  return fmt::format(
      "pooled from {} profiles, one before each round of the runs, {:.1f} s; sizes {} retimed",
      v.round_profile_paths.size(), v.profile_seconds, fmt::join(v.reprofiled_sizes, ", "));
}

std::string gui_command(const Validation& v, const PlanValidation& p) {
  return fmt::format("pipetune-gui {} {} {} {}", v.profile_path, v.hardware_path, p.plan_path,
                     p.measured_trace_path);
}

}  // namespace

std::string validation_text(const Validation& v) {
  std::string out;
  out += fmt::format("model       {} ({}), batch {} on {}\n", v.model, v.model_spec, v.batch,
                     v.device);
  out += fmt::format("profile     {} ({})\n", v.profile_path, profile_origin(v));
  out += fmt::format("hardware    {}: {} devices, link {}, {:.3f} ms\n", v.hardware_path,
                     v.hardware.devices.size(),
                     format_bandwidth(v.hardware.link.bandwidth_bytes_per_s),
                     v.hardware.link.latency_ms);
  if (v.has_calibration()) {
    out += fmt::format("calibration {} ({} on {})\n", calibration_summary(v.hardware.calibration),
                       v.calibration_fitted ? "fitted now" : "reused",
                       fmt::join(v.hardware.calibration.fitted_on, "; "));
    if (!v.calibration_runs.empty())
      out +=
          fmt::format("            on the plans it was fitted on: {}\n", calibration_fit_line(v));
    if (!v.calibration_reason.empty()) out += fmt::format("            {}\n", v.calibration_reason);
  } else if (!v.calibration_reason.empty()) {
    out +=
        fmt::format("calibration none: {}{}\n", v.calibration_reason,
                    v.unused_calibration.empty()
                        ? ""
                        : fmt::format(" (it was {})", calibration_summary(v.unused_calibration)));
  } else {
    out += "calibration none\n";
  }
  out += "\n";
  TextTable table;
  const bool cal = v.has_calibration();
  for (const auto& h : headers(cal)) {
    table.add_column(
        h, h == "plan" || h == "critical path" ? TextTable::Align::Left : TextTable::Align::Right);
  }
  for (std::size_t k = 0; k < v.plans.size(); ++k) table.add_row(cells(v, v.plans[k], k));
  out += table.render();
  out += "\n";
  out += fmt::format(
      "time        iteration (first task to last) predicted vs the median over {} measured steps\n",
      v.plans.empty() ? 0 : v.plans.front().measured.pipeline_ms.size());
  out +=
      fmt::format("memory      the device mispredicted most; peaks measured by the {} allocator\n",
                  v.device == "cpu" ? "counting" : "CUDA caching");
  if (const std::string order = arrival_order_sentence(v); !order.empty()) {
    out += fmt::format("            {}\n", order);
  }
  if (const std::string own = own_order_sentence(v); !own.empty()) {
    out += fmt::format("            {}\n", own);
  }
  if (const std::string coverage = coverage_sentence(v); !coverage.empty())
    out += fmt::format("interval    {}\n", coverage);
  if (const std::string cores = cores_sentence(v); !cores.empty())
    out += fmt::format("cores       {}\n", cores);
  out += fmt::format("ranking     {}\n", ranking_sentence(v));
  for (std::size_t k = 0; k < v.plans.size(); ++k) {
    const auto lines = task_lines(v, v.plans[k], 3);
    for (std::size_t i = 0; i < lines.size(); ++i) {
      out += fmt::format("{:<12}{}\n", i == 0 ? fmt::format("tasks {}", k + 1) : "", lines[i]);
    }
  }
  out += fmt::format("traces      {}/plan-N.{{predicted,{}measured}}.trace.json\n",
                     std::filesystem::path(v.hardware_path).parent_path().string(),
                     cal ? "calibrated," : "");
  if (!v.plans.empty()) out += fmt::format("open        {}\n", gui_command(v, v.plans.front()));
  return out;
}

std::string validation_markdown(const Validation& v) {
  std::string out;
  out += fmt::format("# pipetune validate: {} on {}\n\n", v.model, v.device);
  out += fmt::format("- model: `{}`, batch {}\n", v.model_spec, v.batch);
  out += fmt::format("- profile: `{}` ({})\n", v.profile_path,
                     !v.profiled                     ? "reused"
                     : v.round_profile_paths.empty() ? "taken by this run"
                                                     : profile_origin(v));
  out += fmt::format("- hardware: `{}`, {} devices, link {}, {:.3f} ms\n", v.hardware_path,
                     v.hardware.devices.size(),
                     format_bandwidth(v.hardware.link.bandwidth_bytes_per_s),
                     v.hardware.link.latency_ms);
  if (v.has_calibration()) {
    out += fmt::format("- calibration ({}): {}; fitted on {}\n",
                       v.calibration_fitted ? "fitted by this run" : "reused",
                       calibration_summary(v.hardware.calibration),
                       fmt::join(v.hardware.calibration.fitted_on, "; "));
  } else if (!v.calibration_reason.empty()) {
    out += fmt::format("- calibration: none, {}\n", v.calibration_reason);
  } else {
    out += "- calibration: none\n";
  }
  out += fmt::format("- ranking: {}\n", ranking_sentence(v));
  if (const std::string coverage = coverage_sentence(v); !coverage.empty())
    out += fmt::format("- interval: {}\n", coverage);
  if (const std::string cores = cores_sentence(v); !cores.empty())
    out += fmt::format("- cores: {}\n", cores);
  if (const std::string order = arrival_order_sentence(v); !order.empty()) {
    out += fmt::format("- memory: {}\n", order);
  }
  if (const std::string own = own_order_sentence(v); !own.empty()) {
    out += fmt::format("- memory: {}\n", own);
  }
  out += "\n";
  const auto h = headers(v.has_calibration());
  out += fmt::format("| {} |\n", fmt::join(h, " | "));
  std::vector<std::string> rule(h.size(), "---");
  out += fmt::format("|{}|\n", fmt::join(rule, "|"));
  for (std::size_t k = 0; k < v.plans.size(); ++k)
    out += fmt::format("| {} |\n", fmt::join(cells(v, v.plans[k], k), " | "));
  out += "\nMost mispredicted tasks:\n\n";
  for (std::size_t k = 0; k < v.plans.size(); ++k) {
    for (const auto& line : task_lines(v, v.plans[k], 3))
      out += fmt::format("- plan {}: {}\n", k + 1, line);
  }
  return out;
}

namespace {

using nlohmann::ordered_json;

std::vector<double> tidied(const std::vector<double>& values) {
  std::vector<double> out;
  for (double v : values) out.push_back(tidy(v));
  return out;
}

// A prediction against the measurement: time, memory, tasks and the critical path.
ordered_json comparison_json(const TraceComparison& c) {
  ordered_json j;
  j["predicted_ms"] = tidy(c.predicted_ms);
  j["measured_ms"] = tidy(c.measured_ms);
  j["time_error"] = tidy(c.time_error);
  j["predicted_peak_bytes"] = c.predicted_peak_bytes;
  j["measured_peak_bytes"] = c.measured_peak_bytes;
  j["memory_error"] = tidied(c.memory_error);
  if (!c.worst_order_peak_bytes.empty()) j["worst_order_peak_bytes"] = c.worst_order_peak_bytes;
  j["median_abs_task_error"] = tidy(c.median_abs_duration_error);
  j["same_critical_path"] = c.same_critical_path;
  j["critical_path_agreement"] = tidy(c.critical_path_agreement);
  j["predicted_critical_path"] = c.predicted_critical_path;
  j["measured_critical_path"] = c.measured_critical_path;
  ordered_json worst = ordered_json::array();
  for (const auto& t : c.most_mispredicted(5)) {
    worst.push_back({{"task", t.label()},
                     {"predicted_start_ms", tidy(t.predicted_start_ms)},
                     {"predicted_end_ms", tidy(t.predicted_end_ms)},
                     {"measured_start_ms", tidy(t.measured_start_ms)},
                     {"measured_end_ms", tidy(t.measured_end_ms)}});
  }
  j["most_mispredicted"] = worst;
  return j;
}

// A validated plan: its files, measured steps and both comparisons.
ordered_json plan_validation_json(const PlanValidation& p) {
  ordered_json j;
  j["plan"] = describe_plan(p.plan());
  j["plan_file"] = p.plan_path;
  j["measured_trace"] = p.measured_trace_path;
  j["predicted_trace"] = p.predicted_trace_path;
  if (!p.calibrated_trace_path.empty()) j["calibrated_trace"] = p.calibrated_trace_path;
  j["measured_pipeline_ms"] = tidied(p.measured.pipeline_ms);
  j["measured_median_ms"] = tidy(p.measured.median_pipeline_ms());
  j["measured_spread_ms"] = tidy(p.measured.spread_ms());
  j["measured_step_ms"] = tidy(p.measured.median_step_ms());
  // The compute threads' share of their tasks' time on a core, and the steps replayed at
  // their CPU times (null where not measured: a GPU, or several intra-op threads a device).
  if (const double share = p.measured.median_cpu_share(); share >= 0) {
    j["measured_cpu_share"] = tidy(share);
    j["measured_on_cpu_ms"] = tidy(p.measured.median_on_cpu_ms());
  } else {
    j["measured_cpu_share"] = nullptr;
    j["measured_on_cpu_ms"] = nullptr;
  }
  // The host's pace before each round of the plan's steps, beside the profile's
  // meta.host_pace_us.
  j["host_pace_us"] = tidied(p.measured.host_pace_us);
  // Part of the measured peaks: what the libraries keep (cuBLAS workspaces; 0 on CPU devices).
  j["measured_library_bytes"] = p.measured.library_memory_bytes;
  // The median step's own peaks, and the memory model's at that step's task times.
  j["traced_step_peak_bytes"] = p.measured.traced_step_peak_bytes;
  if (!p.measured_order_peak_bytes.empty())
    j["measured_order_peak_bytes"] = p.measured_order_peak_bytes;
  j["uncalibrated"] = comparison_json(p.uncalibrated);
  j["calibrated"] = comparison_json(p.calibrated);
  if (p.interval.known()) {
    j["interval"] = {{"central", p.interval.central},
                     {"low_ms", tidy(p.interval.low_ms)},
                     {"high_ms", tidy(p.interval.high_ms)},
                     {"width", tidy(p.interval.width())},
                     {"steps_inside", p.steps_inside}};
  }
  j["predicted_rank"] = p.predicted_rank;
  j["measured_rank"] = p.measured_rank;
  return j;
}

// The "runs" contract of docs/cli.md, one entry per validated plan: the headline prediction (the
// calibrated one when a calibration was applied) against the measurement.
ordered_json run_json(const PlanValidation& p, bool calibrated) {
  const TraceComparison& c = calibrated ? p.calibrated : p.uncalibrated;
  const Plan& plan = p.plan();
  ordered_json j;
  j["plan"] = {{"balance", plan.balance},
               {"chunks", plan.chunks},
               {"checkpoint", std::string(to_string(plan.checkpoint))},
               {"schedule", std::string(to_string(plan.schedule))}};
  j["predicted_ms"] = tidy(c.predicted_ms);
  j["measured_ms"] = tidy(c.measured_ms);
  j["time_error"] = tidy(c.time_error);
  j["predicted_peak_memory_bytes"] = c.predicted_peak_bytes;
  j["measured_peak_memory_bytes"] = c.measured_peak_bytes;
  j["memory_error"] = tidied(c.memory_error);
  return j;
}

}  // namespace

std::string validation_json(const Validation& v, const ValidationThresholds& thresholds,
                            const std::vector<std::string>& failures) {
  ordered_json out;
  out["format"] = "pipetune.validation/1";
  out["model"] = v.model;
  out["model_spec"] = v.model_spec;
  out["batch_size"] = v.batch;
  out["device"] = v.device;
  out["profile"] = v.profile_path;
  out["profiled"] = v.profiled;
  if (!v.round_profile_paths.empty()) {
    out["round_profiles"] = v.round_profile_paths;
    out["reprofiled_sizes"] = v.reprofiled_sizes;
  }
  out["hardware"] = v.hardware_path;
  out["calibration"] = v.has_calibration() ? (v.calibration_fitted ? "fitted" : "reused") : "none";
  if (!v.calibration_reason.empty()) out["calibration_reason"] = v.calibration_reason;
  out["calibration_runs"] = ordered_json::array();
  for (const auto& c : v.calibration_runs)
    out["calibration_runs"].push_back(plan_validation_json(c));
  out["runs"] = ordered_json::array();
  for (const auto& p : v.plans) out["runs"].push_back(run_json(p, v.has_calibration()));
  out["plans"] = ordered_json::array();
  for (const auto& p : v.plans) out["plans"].push_back(plan_validation_json(p));
  out["predicted_best"] = v.plans.empty() ? 0 : v.predicted_best() + 1;
  out["measured_best"] = v.plans.empty() ? 0 : v.measured_best() + 1;
  out["predicted_best_within_noise"] = v.predicted_best_within_noise();
  ordered_json t;
  if (thresholds.time_error) t["time_error"] = *thresholds.time_error;
  if (thresholds.memory_error) t["memory_error"] = *thresholds.memory_error;
  t["require_best"] = thresholds.require_best;
  out["thresholds"] = t;
  out["failures"] = failures;
  out["passed"] = failures.empty();
  out["seconds"] = tidy(v.seconds);
  return out.dump(2) + "\n";
}

std::vector<std::string> threshold_failures(const Validation& v,
                                            const ValidationThresholds& thresholds) {
  std::vector<std::string> out;
  for (std::size_t k = 0; k < v.plans.size(); ++k) {
    const TraceComparison& c = v.headline(v.plans[k]);
    const std::string name = fmt::format("plan {} ({})", k + 1, describe_plan(v.plans[k].plan()));
    if (thresholds.time_error && std::abs(c.time_error) > *thresholds.time_error) {
      out.push_back(fmt::format("{}: iteration time error {} exceeds --max-time-error {:.1f} %",
                                name, signed_percent(c.time_error),
                                *thresholds.time_error * 100.0));
    }
    if (thresholds.memory_error) {
      for (std::size_t d = 0; d < c.memory_error.size(); ++d) {
        if (std::abs(c.memory_error[d]) > *thresholds.memory_error) {
          out.push_back(fmt::format(
              "{}: peak memory error on {} {} exceeds --max-memory-error {:.1f} %", name,
              c.devices[d], signed_percent(c.memory_error[d]), *thresholds.memory_error * 100.0));
        }
      }
    }
  }
  if (thresholds.require_best && !v.plans.empty() && v.predicted_best() != v.measured_best() &&
      !v.predicted_best_within_noise()) {
    out.push_back(fmt::format("--require-best: {}", ranking_sentence(v)));
  }
  return out;
}

}  // namespace pipetune::cli
