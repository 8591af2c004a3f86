#include "cli/report.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/table.hpp"
#include "sim/compare.hpp"
#include "sim/cost_model.hpp"
#include "sim/planner/one_choice_away.hpp"
#include "sim/units.hpp"

namespace pipetune::cli {

using nlohmann::ordered_json;

double tidy(double value) {
  if (!std::isfinite(value)) return value;
  return std::round(value * 1e6) / 1e6;
}

std::string format_ms(double ms) {
  return fmt::format("{:.3f}", ms);
}
std::string format_percent(double fraction) {
  return fmt::format("{:.1f} %", fraction * 100.0);
}
namespace {

std::string micro_batch_summary(const std::vector<std::int64_t>& sizes) {
  if (sizes.size() > 1 && sizes.back() != sizes.front()) {
    return fmt::format("{} micro-batches of {} (last {})", sizes.size(), sizes.front(),
                       sizes.back());
  }
  return fmt::format("{} micro-batch{} of {}", sizes.size(), sizes.size() == 1 ? "" : "es",
                     sizes.front());
}

std::string capacity_text(std::int64_t bytes) {
  return bytes == 0 ? "-" : format_bytes(bytes);
}

// "1f1b", or "interleaved-1f1b, 2/device" where a device runs several stages.
std::string schedule_label(const Plan& plan) {
  if (plan.stages_per_device == 1) return std::string(to_string(plan.schedule));
  return fmt::format("{}, {}/device", to_string(plan.schedule), plan.stages_per_device);
}

}  // namespace

// One line per tied tensor: where `plan` puts it. `which` names the plan ("plan 1: ") or is empty.
std::string tied_text(const Profile& profile, const Plan& plan, const std::string& which = "") {
  std::string out;
  for (const TiedTensor& t : profile.tied) {
    const std::vector<int> stages = stages_holding(t, plan.balance);
    out += fmt::format(
        "tied        {} (layers {}, {}): {}{}\n", t.name, fmt::join(t.layers, ", "),
        format_bytes(t.bytes), which,
        stages.size() == 1
            ? fmt::format("one tensor on stage {}", stages[0])
            : fmt::format("a copy on each of stages {} (their gradients summed before each step)",
                          fmt::join(stages, ", ")));
  }
  return out;
}

// One line where some parameters are frozen: how many bytes train (a tied tensor once), and the
// layers at the start that have no backward (their input is data); empty otherwise.
std::string frozen_text(const Profile& profile) {
  const CostModel costs(profile);
  if (!costs.has_frozen()) return "";
  const int layers = costs.layer_count();
  int stem = 0;
  while (stem < layers && costs.trained_bytes_of(stem) == 0) ++stem;
  return fmt::format(
      "frozen      {} of the layers' {} of parameters train (no gradient or optimizer state for "
      "the rest){}\n",
      format_bytes(costs.trained_bytes(0, layers)), format_bytes(costs.param_bytes(0, layers)),
      stem == 0 ? std::string()
                : fmt::format("; {} before any that trains: no backward",
                              stem == 1 ? std::string("layer 0 comes")
                                        : fmt::format("layers 0-{} come", stem - 1)));
}

std::string simulation_text(const Profile& profile, const SimulationResult& r,
                            const std::vector<int>& path, const std::string& schedule_csv,
                            const IterationInterval* interval) {
  std::string out;
  out += fmt::format("model       {} ({}, {}), batch {}\n", profile.model, profile.device.type,
                     profile.dtype, profile.batch_size);
  if (schedule_csv.empty()) {
    out += fmt::format("plan        {}: {}\n", describe_plan(r.plan),
                       micro_batch_summary(r.micro_batch_sizes));
  } else {
    // The plan's own schedule kind is a placeholder then: the CSV's rows are the programmes.
    out += fmt::format("plan        {} x{} {}: {}\n", format_balance(r.plan.balance), r.plan.chunks,
                       to_string(r.plan.checkpoint), micro_batch_summary(r.micro_batch_sizes));
    out += fmt::format("schedule    from {} (torch compute-only CSV)\n", schedule_csv);
  }
  out += tied_text(profile, r.plan);
  out += frozen_text(profile);
  out += fmt::format("iteration   {} ms\n", format_ms(r.iteration_ms));
  if (interval) out += fmt::format("interval    {}\n", interval_text(*interval));
  out += fmt::format("throughput  {:.1f} samples/s\n", r.throughput_samples_per_s);
  out += fmt::format("bubble      {}\n\n", format_percent(r.bubble_fraction));

  TextTable table;
  table.add_column("device");
  table.add_column("stages");
  table.add_column("busy ms", TextTable::Align::Right);
  table.add_column("idle", TextTable::Align::Right);
  table.add_column("peak memory", TextTable::Align::Right);
  table.add_column("worst order", TextTable::Align::Right);
  table.add_column("capacity", TextTable::Align::Right);
  table.add_column("fits");
  for (const auto& d : r.devices) {
    const double idle = r.iteration_ms > 0 ? 1.0 - d.busy_ms / r.iteration_ms : 0.0;
    table.add_row({d.name, fmt::format("{}", fmt::join(d.stages, ",")), format_ms(d.busy_ms),
                   format_percent(idle), format_bytes(d.peak_memory_bytes),
                   d.worst_order_peak_bytes > 0 ? format_bytes(d.worst_order_peak_bytes) : "-",
                   capacity_text(d.memory_capacity_bytes), d.fits() ? "yes" : "NO"});
  }
  out += table.render();
  if (!r.devices.empty() && r.devices.front().worst_order_peak_bytes > 0) {
    out +=
        "worst order: the peak if copies land in the worst order the schedule allows; a real\n"
        "step's timing moves its peak between the two\n";
  }
  std::map<std::string, std::vector<std::string>> shares;  // GPU -> its shares in the plan
  for (const auto& d : r.devices) {
    if (!d.share_of.empty()) shares[d.share_of].push_back(d.name);
  }
  for (const auto& [gpu, names] : shares) {
    out += fmt::format("{}: shares of {}'s SMs, one memory: each share's peak is the GPU's\n",
                       fmt::join(names, ", "), gpu);
  }

  if (!path.empty()) {
    double compute = 0, copies = 0;
    std::vector<std::string> labels;
    for (int t : path) {
      const SimTask& task = r.tasks[t];
      (is_compute(task.kind) ? compute : copies) += task.duration_ms();
      labels.push_back(task.label());
    }
    // Long paths are shortened to their ends: the start and finish say where time goes.
    std::string shown;
    constexpr std::size_t kEnds = 6;
    if (labels.size() <= 2 * kEnds + 1) {
      shown = fmt::format("{}", fmt::join(labels, " "));
    } else {
      shown = fmt::format("{} ... {}", fmt::join(labels.begin(), labels.begin() + kEnds, " "),
                          fmt::join(labels.end() - kEnds, labels.end(), " "));
    }
    out += fmt::format("\ncritical path  {} tasks, {} ms compute, {} ms copies\n  {}\n",
                       path.size(), format_ms(compute), format_ms(copies), shown);
  }
  if (!r.fits()) {
    out += "\nThe plan does not fit: a device's predicted peak memory exceeds its capacity.\n";
  }
  return out;
}

std::string interval_text(const IterationInterval& interval) {
  if (!interval.known()) {
    return "none: the profile has no spreads of its layers' times (profile again for them) and "
           "the hardware no model_error (validate writes it)";
  }
  const char* from = interval.from_spreads && interval.from_model_error
                         ? "the layers' measured spread and the model's error here"
                     : interval.from_spreads ? "the layers' measured spread"
                                             : "the model's error here";
  return fmt::format("{:.0f} % of steps in {} - {} ms ({:.1f} % wide; {})",
                     100.0 * interval.central, format_ms(interval.low_ms),
                     format_ms(interval.high_ms), 100.0 * interval.width(), from);
}

std::string simulation_json(const SimulationResult& r, const std::vector<int>& path,
                            const IterationInterval* interval) {
  ordered_json root;
  root["iteration_ms"] = tidy(r.iteration_ms);
  if (interval && interval->known()) {
    root["interval_central"] = interval->central;
    root["iteration_low_ms"] = tidy(interval->low_ms);
    root["iteration_high_ms"] = tidy(interval->high_ms);
  }
  root["throughput_samples_per_s"] = tidy(r.throughput_samples_per_s);
  root["bubble_fraction"] = tidy(r.bubble_fraction);
  ordered_json devices = ordered_json::array();
  for (const auto& d : r.devices) {
    devices.push_back({{"name", d.name},
                       {"stages", d.stages},
                       {"busy_ms", tidy(d.busy_ms)},
                       {"peak_memory_bytes", d.peak_memory_bytes},
                       {"worst_order_peak_bytes", d.worst_order_peak_bytes},
                       {"memory_capacity_bytes", d.memory_capacity_bytes},
                       {"fits", d.fits()}});
    if (!d.share_of.empty()) devices.back()["share_of"] = d.share_of;
  }
  root["devices"] = std::move(devices);
  root["micro_batch_sizes"] = r.micro_batch_sizes;
  ordered_json labels = ordered_json::array();
  for (int t : path) labels.push_back(r.tasks[t].label());
  root["critical_path"] = std::move(labels);
  return root.dump() + "\n";
}

std::string sweep_table(const std::vector<SweepRow>& rows) {
  TextTable table;
  table.add_column("devices", TextTable::Align::Right);
  table.add_column("link");
  table.add_column("schedule");
  table.add_column("checkpoint");
  table.add_column("chunks", TextTable::Align::Right);
  table.add_column("balance");
  table.add_column("iteration ms", TextTable::Align::Right);
  table.add_column("samples/s", TextTable::Align::Right);
  table.add_column("bubble", TextTable::Align::Right);
  table.add_column("max peak", TextTable::Align::Right);
  table.add_column("fits");
  for (const auto& row : rows) {
    std::string chunks = std::to_string(row.plan.chunks);
    if (row.micro_batches != row.plan.chunks) chunks += fmt::format(" ({})", row.micro_batches);
    std::int64_t peak = 0;
    for (auto p : row.peak_memory_bytes) peak = std::max(peak, p);
    table.add_row({std::to_string(row.devices), format_bandwidth(row.bandwidth_bytes_per_s),
                   schedule_label(row.plan), std::string(to_string(row.plan.checkpoint)), chunks,
                   format_balance(row.plan.balance), format_ms(row.iteration_ms),
                   fmt::format("{:.1f}", row.throughput_samples_per_s),
                   format_percent(row.bubble_fraction), format_bytes(peak),
                   row.fits ? "yes" : "NO"});
  }
  return table.render();
}

std::string sweep_csv(const std::vector<SweepRow>& rows) {
  std::string out =
      "devices,bandwidth_bytes_per_s,schedule,stages_per_device,checkpoint,chunks,micro_batches,"
      "balance,iteration_ms,throughput_samples_per_s,bubble_fraction,peak_memory_bytes,fits\n";
  for (const auto& row : rows) {
    out += fmt::format(
        "{},{},{},{},{},{},{},{},{},{},{},{},{}\n", row.devices,
        std::isinf(row.bandwidth_bytes_per_s) ? std::string("inf")
                                              : fmt::format("{}", row.bandwidth_bytes_per_s),
        to_string(row.plan.schedule), row.plan.stages_per_device, to_string(row.plan.checkpoint),
        row.plan.chunks, row.micro_batches, fmt::join(row.plan.balance, " "),
        tidy(row.iteration_ms), tidy(row.throughput_samples_per_s), tidy(row.bubble_fraction),
        fmt::join(row.peak_memory_bytes, " "), row.fits ? "true" : "false");
  }
  return out;
}

std::string sweep_json(const std::vector<SweepRow>& rows) {
  ordered_json list = ordered_json::array();
  for (const auto& row : rows) {
    ordered_json bandwidth = nullptr;
    if (!std::isinf(row.bandwidth_bytes_per_s)) bandwidth = row.bandwidth_bytes_per_s;
    list.push_back({{"devices", row.devices},
                    {"bandwidth_bytes_per_s", bandwidth},
                    {"balance", row.plan.balance},
                    {"chunks", row.plan.chunks},
                    {"micro_batches", row.micro_batches},
                    {"checkpoint", to_string(row.plan.checkpoint)},
                    {"schedule", to_string(row.plan.schedule)},
                    {"stages_per_device", row.plan.stages_per_device},
                    {"iteration_ms", tidy(row.iteration_ms)},
                    {"throughput_samples_per_s", tidy(row.throughput_samples_per_s)},
                    {"bubble_fraction", tidy(row.bubble_fraction)},
                    {"peak_memory_bytes", row.peak_memory_bytes},
                    {"fits", row.fits}});
  }
  ordered_json root;
  root["rows"] = std::move(list);
  return root.dump() + "\n";
}

}  // namespace pipetune::cli

namespace pipetune::cli {

namespace {

std::string peaks_text(const std::vector<std::int64_t>& peaks) {
  std::vector<std::string> parts;
  for (auto p : peaks) parts.push_back(format_bytes(p));
  return fmt::format("{}", fmt::join(parts, ", "));
}

// Where the gap comes from: the configurations left open, and the one whose bound is the least
// (often one whose search never started, its bound then the balance-free one).
std::string unfinished_text(const PlannerStats& s) {
  const ConfigurationStats* least = nullptr;
  std::size_t open = 0;
  for (const ConfigurationStats& c : s.per_configuration) {
    if (c.closed) continue;
    ++open;
    if (!least || c.lower_bound_ms < least->lower_bound_ms) least = &c;
  }
  if (!least) return "";
  const std::string v = least->stages_per_device > 1
                            ? fmt::format(" ({} stages/device)", least->stages_per_device)
                            : "";
  const char* state = !least->evaluated    ? ": its root bound not yet computed"
                      : least->slices == 0 ? ": not yet searched"
                                           : "";
  return fmt::format(
      "            {} of {} configurations left open, the lowest bound x{} {} {}{}{}\n", open,
      s.per_configuration.size(), least->chunks, to_string(least->checkpoint),
      to_string(least->schedule), v, state);
}

// Where multi-stage schedules were searched too: what GPipe and 1F1B alone, searched first with
// the whole budget, ended with (the answer is never slower).
std::string one_stage_text(const PlanSearchResult::OneStageAnswer& a) {
  if (!a.best) {
    return a.proven ? "            GPipe and 1F1B alone (searched first): no plan fits\n"
                    : "            GPipe and 1F1B alone (searched first): no fitting plan found\n";
  }
  const double gap = a.best->iteration_ms > 0.0
                         ? (a.best->iteration_ms - a.lower_bound_ms) / a.best->iteration_ms
                         : 0.0;
  return fmt::format("            GPipe and 1F1B alone (searched first): {} ms, {}, {}\n",
                     format_ms(a.best->iteration_ms), describe_plan(a.best->plan),
                     a.proven ? std::string("optimal among them")
                              : fmt::format("within {:.2f} % of their optimum", 100.0 * gap));
}

std::string search_summary(const PlannerStats& s, const std::string& space, bool found) {
  std::string out = fmt::format(
      "searched    {} configurations ({} ruled out by bounds), {} partial balances, {} plans "
      "timed, "
      "{} simulated\n",
      s.configurations, s.configurations_skipped, s.nodes, s.sweeps, s.simulations);
  if (!found) return out;
  if (s.proven) {
    out += fmt::format(
        "            the best plan is optimal under the model over {}: no fitting plan there is "
        "faster\n",
        space);
  } else {
    out += fmt::format(
        "            search budget spent: no fitting plan is faster than {} ms, so the best is "
        "within "
        "{:.2f} % of the optimum (raise --budget to close the gap)\n",
        format_ms(s.lower_bound_ms), 100.0 * s.gap());
    out += unfinished_text(s);
  }
  return out;
}

}  // namespace

std::string calibration_summary(const Calibration& c) {
  std::vector<std::string> parts;
  for (const auto& [devices, scale] : c.compute_scale) {
    parts.push_back(fmt::format("compute x{:.3f} on {} busy device{}", scale, devices,
                                devices == 1 ? "" : "s"));
  }
  if (c.task_overhead_ms > 0)
    parts.push_back(fmt::format("+{:.3f} ms per task", c.task_overhead_ms));
  if (c.copy && is_flat_copy_link(*c.copy)) {
    parts.push_back(fmt::format("copies {:.3f} ms each", c.copy->latency_ms));
  } else if (c.copy) {
    parts.push_back(fmt::format("copies {} + {:.3f} ms",
                                format_bandwidth(c.copy->bandwidth_bytes_per_s),
                                c.copy->latency_ms));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::string plan_text(const Profile& profile, const Hardware& hardware,
                      const PlanSearchResult& result,
                      const std::vector<IterationInterval>& intervals) {
  std::string out;
  out += fmt::format("model       {} ({}, {}), batch {}, {} layers\n", profile.model,
                     profile.device.type, profile.dtype, profile.batch_size, profile.layer_count());
  std::vector<std::string> devices;
  for (const auto& d : hardware.devices) {
    devices.push_back(fmt::format(
        "{} ({})", d.name, d.memory_bytes ? format_bytes(d.memory_bytes) : "no memory limit"));
  }
  out += fmt::format("devices     {}; links {}\n", fmt::join(devices, ", "),
                     format_bandwidth(hardware.link.bandwidth_bytes_per_s));
  out += search_summary(result.stats, result.search_space, !result.ranked.empty());
  if (result.one_stage && !result.ranked.empty()) out += one_stage_text(*result.one_stage);
  if (result.ranked.empty()) {
    out += result.none_fits_proven
               ? "\nno plan fits in the devices' memory.\n"
               : "\nno fitting plan found before the search budget ran out (raise --budget: a "
                 "plan may fit).\n";
    if (result.leanest) {
      const auto& c = *result.leanest;
      std::vector<std::string> need;
      for (std::size_t d = 0; d < c.peak_memory_bytes.size(); ++d) {
        need.push_back(fmt::format("{} on {} (has {})", format_bytes(c.peak_memory_bytes[d]),
                                   hardware.devices[d].name,
                                   format_bytes(c.memory_capacity_bytes[d])));
      }
      out += fmt::format("the leanest plan, {}, needs {}.\n", describe_plan(c.plan),
                         fmt::join(need, ", "));
      const char* proof = result.leanest_proven
                              ? "; no plan needs less"
                              : " (the search budget ran out: a leaner plan may exist)";
      if (c.worst_order_peak_bytes.empty()) {
        out += fmt::format("with {} per device it would fit{}.\n",
                           format_bytes(c.max_peak_memory_bytes()), proof);
      } else {
        // --memory-order worst: the leanest plan is leanest as predicted; in every order it needs
        // more.
        const std::int64_t worst =
            *std::max_element(c.worst_order_peak_bytes.begin(), c.worst_order_peak_bytes.end());
        out += fmt::format(
            "with {} per device it would fit as predicted{}; in every arrival order it needs {}.\n",
            format_bytes(c.max_peak_memory_bytes()), proof, format_bytes(worst));
      }
    }
    return out;
  }
  out += "\n";
  TextTable table;
  table.add_column("rank", TextTable::Align::Right);
  table.add_column("iteration ms", TextTable::Align::Right);
  const bool with_intervals =
      intervals.size() == result.ranked.size() && !intervals.empty() && intervals.front().known();
  if (with_intervals) table.add_column("80 % interval", TextTable::Align::Right);
  table.add_column("samples/s", TextTable::Align::Right);
  table.add_column("bubble", TextTable::Align::Right);
  table.add_column("chunks", TextTable::Align::Right);
  table.add_column("checkpoint");
  table.add_column("schedule");
  table.add_column("balance");
  table.add_column("peak memory per device");
  for (std::size_t k = 0; k < result.ranked.size(); ++k) {
    const auto& c = result.ranked[k];
    std::vector<std::string> row{std::to_string(k + 1), format_ms(c.iteration_ms)};
    if (with_intervals) {
      row.push_back(
          fmt::format("{} - {}", format_ms(intervals[k].low_ms), format_ms(intervals[k].high_ms)));
    }
    row.insert(row.end(), {fmt::format("{:.1f}", c.throughput_samples_per_s),
                           format_percent(c.bubble_fraction), std::to_string(c.plan.chunks),
                           std::string(to_string(c.plan.checkpoint)), schedule_label(c.plan),
                           format_balance(c.plan.balance), peaks_text(c.peak_memory_bytes)});
    table.add_row(row);
  }
  out += table.render();
  if (!profile.tied.empty())
    out += "\n" + tied_text(profile, result.ranked.front().plan, "plan 1: ");
  if (const std::string frozen = frozen_text(profile); !frozen.empty()) out += "\n" + frozen;
  return out;
}

namespace {

// The explanation's bottleneck line: the device that computes longest, and the others' times.
std::string bottleneck_line(const PlanCandidate& best, const Hardware& hardware,
                            const std::vector<int>& device_of, int devices) {
  const int stages = static_cast<int>(best.plan.balance.size());
  auto device_label = [&](int d) {
    std::vector<int> held;
    for (int s = 0; s < stages; ++s) {
      if (device_of[s] == d) held.push_back(s);
    }
    if (held.empty()) return hardware.devices[d].name;
    return held.size() == 1
               ? fmt::format("stage {} on {}", held.front(), hardware.devices[d].name)
               : fmt::format("{} (stages {})", hardware.devices[d].name, fmt::join(held, ","));
  };
  int bottleneck = 0;
  for (int d = 1; d < devices; ++d) {
    if (best.busy_ms[d] > best.busy_ms[bottleneck]) bottleneck = d;
  }
  std::vector<std::string> others;
  for (int d = 0; d < devices; ++d) {
    if (d == bottleneck) continue;
    others.push_back(
        best.plan.stages_per_device == 1
            ? fmt::format("{} {}", d, format_ms(best.busy_ms[d]))
            : fmt::format("{} {}", hardware.devices[d].name, format_ms(best.busy_ms[d])));
  }
  return fmt::format("  bottleneck  {} computes {} ms, {} of the iteration{}{}\n",
                     device_label(bottleneck), format_ms(best.busy_ms[bottleneck]),
                     format_percent(best.busy_ms[bottleneck] / best.iteration_ms),
                     others.empty()                     ? ""
                     : best.plan.stages_per_device == 1 ? "; other stages: "
                                                        : "; other devices: ",
                     fmt::join(others, ", "));
}

// The explanation's bubble line: the idle share, and what fill and drain alone would leave.
std::string bubble_lines(const PlanCandidate& best, int devices) {
  const double m = best.micro_batches, k = devices, v = best.plan.stages_per_device;
  std::string out;
  if (splits_backward(best.plan.schedule)) {
    out += fmt::format(
        "  bubble      {} of device time idle; the weight gradients (W) fill what fill and\n"
        "              drain would leave idle\n",
        format_percent(best.bubble_fraction));
  } else if (v > 1) {
    out += fmt::format(
        "  bubble      {} of device time idle; fill and drain alone, with equal stages, {} per\n"
        "              device, equal micro-batches and free copies, idle (K-1)/(vM+K-1) = {}\n",
        format_percent(best.bubble_fraction), best.plan.stages_per_device,
        format_percent((k - 1) / (v * m + k - 1)));
  } else {
    out += fmt::format(
        "  bubble      {} of device time idle; fill and drain alone, with equal stages, equal\n"
        "              micro-batches and free copies, idle (K-1)/(M+K-1) = {}\n",
        format_percent(best.bubble_fraction), format_percent((k - 1) / (m + k - 1)));
  }
  return out;
}

// Each device's peak against its capacity: the worst arrival order's where it is known.
std::string memory_lines(const PlanCandidate& best, const Hardware& hardware, int devices) {
  std::string out;
  for (int d = 0; d < devices; ++d) {
    const auto cap = best.memory_capacity_bytes[d];
    // With the worst arrival order known, it is the peak the cap must hold.
    const bool ordered = !best.worst_order_peak_bytes.empty();
    const std::int64_t binding =
        ordered ? best.worst_order_peak_bytes[d] : best.peak_memory_bytes[d];
    const std::string worst =
        ordered ? fmt::format(", worst arrival order {}", format_bytes(binding)) : "";
    const std::string limit =
        cap == 0
            ? " (no limit given)"
            : fmt::format(
                  "{} of {}, headroom {}", ordered ? ";" : "", format_bytes(cap),
                  format_percent(1.0 - static_cast<double>(binding) / static_cast<double>(cap)));
    out += fmt::format("  memory      {}: peak {}{}{}\n", hardware.devices[d].name,
                       format_bytes(best.peak_memory_bytes[d]), worst, limit);
  }

  return out;
}

// The plans one choice away from the best, each re-planned.
std::string one_choice_away_table(const Profile& profile, const Hardware& hardware,
                                  const PlannerOptions& options, const PlanCandidate& best) {
  std::string out;
  out += "  one choice away, each re-planned:\n";
  TextTable table;
  table.add_column("    change");
  table.add_column("iteration ms", TextTable::Align::Right);
  table.add_column("time", TextTable::Align::Right);
  table.add_column("max peak", TextTable::Align::Right);
  table.add_column("memory", TextTable::Align::Right);
  table.add_column("balance");
  const double best_peak = static_cast<double>(best.max_peak_memory_bytes());
  for (const auto& a : one_choice_away(profile, hardware, options, best)) {
    if (!a.best) {
      table.add_row({"    " + a.change, "-", "-", "-", "-",
                     a.refused.empty() ? std::string("does not fit") : a.refused});
      continue;
    }
    const auto& c = *a.best;
    table.add_row(
        {"    " + a.change, format_ms(c.iteration_ms),
         fmt::format("{:+.1f} %", 100.0 * (c.iteration_ms / best.iteration_ms - 1.0)),
         format_bytes(c.max_peak_memory_bytes()),
         best_peak > 0
             ? fmt::format("{:+.1f} %", 100.0 * (c.max_peak_memory_bytes() / best_peak - 1.0))
             : "-",
         format_balance(c.plan.balance)});
  }
  out += table.render();
  return out;
}

}  // namespace

std::string plan_explanation(const Profile& profile, const Hardware& hardware,
                             const PlannerOptions& options, const PlanSearchResult& result) {
  const PlanCandidate& best = result.ranked.front();
  std::string out = fmt::format("\nwhy {}:\n", describe_plan(best.plan));
  out += fmt::format("  time        {} ms per iteration; {}\n", format_ms(best.iteration_ms),
                     result.stats.proven ? "no fitting plan is faster (the search finished)"
                                         : fmt::format("no fitting plan is faster than {} ms",
                                                       format_ms(result.stats.lower_bound_ms)));
  // busy_ms and the peaks are per device; a device holds several stages under the
  // interleaved, looped and V schedules.
  const std::vector<int> device_of = stage_devices(best.plan, hardware);
  // Devices past the last stage's (`--stages` fewer than devices) hold nothing.
  const int devices = std::min(static_cast<int>(best.busy_ms.size()),
                               *std::max_element(device_of.begin(), device_of.end()) + 1);
  out += bottleneck_line(best, hardware, device_of, devices);
  out += bubble_lines(best, devices);
  out += memory_lines(best, hardware, devices);
  out += one_choice_away_table(profile, hardware, options, best);
  return out;
}

}  // namespace pipetune::cli
