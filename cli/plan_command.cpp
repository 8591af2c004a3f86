#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/inputs.hpp"
#include "cli/number_flags.hpp"
#include "cli/progress.hpp"
#include "cli/report.hpp"
#include "sim/error.hpp"
#include "sim/limits.hpp"
#include "sim/planner/planner.hpp"
#include "sim/planner/runtime_support.hpp"
#include "sim/units.hpp"

namespace pipetune::cli {

namespace {

struct PlanFlagsSet {
  std::string profile;
  HardwareFlags hardware;
  std::vector<int> chunks;
  std::vector<std::string> checkpoints{"all"};
  std::vector<std::string> schedules{"all"};
  std::vector<int> stages_per_device{2};
  double optimizer_state_factor = 0.0;
  int stages = 0;
  int top = 5;
  std::uint64_t budget = PlannerOptions{}.search_budget;
  std::string memory_order = "predicted";
  std::string output;
  std::string schedule_csv;
  bool json = false;
  bool explain = false;
  std::string objective = "median";
};

// Where an unproven answer's gap comes from: each configuration the budget left open, the lowest
// bound first, with its best fitting plan so far (null: none found yet).
nlohmann::ordered_json open_configurations_json(const PlannerStats& stats) {
  std::vector<const ConfigurationStats*> open;
  for (const ConfigurationStats& c : stats.per_configuration)
    if (!c.closed) open.push_back(&c);
  std::stable_sort(open.begin(), open.end(), [](const auto* x, const auto* y) {
    return x->lower_bound_ms < y->lower_bound_ms;
  });
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const ConfigurationStats* c : open) {
    nlohmann::ordered_json entry{{"chunks", c->chunks},
                                 {"micro_batches", c->micro_batches},
                                 {"checkpoint", to_string(c->checkpoint)},
                                 {"schedule", to_string(c->schedule)},
                                 {"stages_per_device", c->stages_per_device},
                                 {"lower_bound_ms", tidy(c->lower_bound_ms)},
                                 {"best_ms", nullptr}};
    if (c->best_ms > 0.0) entry["best_ms"] = tidy(c->best_ms);
    out.push_back(std::move(entry));
  }
  return out;
}

std::string plan_json(const Profile& profile, const PlanSearchResult& result,
                      const std::vector<IterationInterval>& intervals) {
  using nlohmann::ordered_json;
  auto candidate_json = [&](const PlanCandidate& c, const IterationInterval* interval) {
    ordered_json out{{"balance", c.plan.balance},
                     {"chunks", c.plan.chunks},
                     {"checkpoint", to_string(c.plan.checkpoint)},
                     {"schedule", to_string(c.plan.schedule)},
                     {"iteration_ms", tidy(c.iteration_ms)}};
    if (interval && interval->known()) {
      out["iteration_low_ms"] = tidy(interval->low_ms);
      out["iteration_high_ms"] = tidy(interval->high_ms);
    }
    out.update(ordered_json{{"throughput_samples_per_s", tidy(c.throughput_samples_per_s)},
                            {"bubble_fraction", tidy(c.bubble_fraction)},
                            {"peak_memory_bytes", c.peak_memory_bytes}});
    if (!c.worst_order_peak_bytes.empty()) out["worst_order_peak_bytes"] = c.worst_order_peak_bytes;
    if (c.plan.stages_per_device != 1) out["stages_per_device"] = c.plan.stages_per_device;
    for (const TiedTensor& t : profile.tied) {
      out["tied_parameters"].push_back(
          {{"name", t.name}, {"layers", t.layers}, {"stages", stages_holding(t, c.plan.balance)}});
    }
    return out;
  };
  ordered_json root;
  ordered_json plans = ordered_json::array();
  for (std::size_t k = 0; k < result.ranked.size(); ++k) {
    plans.push_back(
        candidate_json(result.ranked[k], k < intervals.size() ? &intervals[k] : nullptr));
  }
  root["plans"] = std::move(plans);
  root["proven_optimal"] = result.stats.proven;
  root["search_space"] = result.search_space;
  root["lower_bound_ms"] = tidy(result.stats.lower_bound_ms);
  if (result.ranked.empty()) root["none_fits_proven"] = result.none_fits_proven;
  if (result.leanest) {
    root["leanest"] = candidate_json(*result.leanest, nullptr);
    root["leanest_proven"] = result.leanest_proven;
  }
  if (!result.stats.proven) root["open_configurations"] = open_configurations_json(result.stats);
  if (const auto& a = result.one_stage) {
    // GPipe and 1F1B alone, searched first with the whole budget (docs/cli.md).
    root["one_stage"] = ordered_json{{"best", nullptr},
                                     {"lower_bound_ms", tidy(a->lower_bound_ms)},
                                     {"proven_optimal", a->proven}};
    if (a->best) root["one_stage"]["best"] = candidate_json(*a->best, nullptr);
  }
  return root.dump() + "\n";
}

// Each ranked plan's 80 % interval, on the devices the planner used.
std::vector<IterationInterval> plan_intervals(const Profile& profile, const Hardware& hardware,
                                              int stages, const PlanSearchResult& result) {
  std::vector<Plan> plans;
  for (const auto& c : result.ranked) plans.push_back(c.plan);
  return intervals_of(profile, hardware, stages, plans);
}

// The ranked plans (and their intervals) in the order of their intervals' upper ends, stable.
void rank_by_p90(PlanSearchResult& result, std::vector<IterationInterval>& intervals) {
  std::vector<std::size_t> order(result.ranked.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return intervals[a].high_ms < intervals[b].high_ms;
  });
  std::vector<PlanCandidate> ranked;
  std::vector<IterationInterval> sorted;
  for (std::size_t k : order) {
    ranked.push_back(result.ranked[k]);
    sorted.push_back(intervals[k]);
  }
  result.ranked = std::move(ranked);
  intervals = std::move(sorted);
}

// The plan command's flags.
void declare_plan_flags(CLI::App& sub, PlanFlagsSet& flags) {
  add_profile_flag(sub, flags.profile);
  add_hardware_flags(sub, flags.hardware);
  sub.add_option("--chunks", flags.chunks, "chunk counts to try (default: 1 to the batch size)")
      ->delimiter(',')
      ->type_name("M,...")
      ->check(whole_number(1, limits::kMaxChunks));
  sub.add_option("--checkpoint", flags.checkpoints, "always,except_last,never or all (default all)")
      ->delimiter(',')
      ->type_name("MODE,...");
  sub.add_option(
         "--schedule", flags.schedules,
         "gpipe,1f1b,interleaved-1f1b,interleaved-zb,zbv,looped-bfs,dualpipev or all (default all)")
      ->delimiter(',')
      ->type_name("KIND,...");
  sub.add_option("--stages-per-device", flags.stages_per_device,
                 "stages per device tried with interleaved-1f1b, interleaved-zb and looped-bfs "
                 "(default 2; zbv and dualpipev run 2)")
      ->delimiter(',')
      ->type_name("V,...")
      ->check(whole_number(1, kMaxStagesPerDevice));
  sub.add_option("--optimizer-state-factor", flags.optimizer_state_factor,
                 "optimizer state bytes per parameter byte: 0 SGD, 1 momentum, 2 Adam")
      ->check(optimizer_state_factor_range());
  sub.add_option("--stages", flags.stages, "pipeline stages (default: one per device)")
      ->check(whole_number(1, limits::kMaxStages));
  sub.add_option("--top", flags.top, "how many configurations to rank (default 5)")
      ->check(whole_number(1, 1000));
  sub.add_option(
         "--budget", flags.budget,
         "search steps before settling for a proven bound instead of a proof (default 10M; with "
         "multi-stage schedules too, GPipe and 1F1B get it first, then all of them again)")
      ->check(whole_number(1, std::int64_t{1} << 50));
  sub.add_option("-o,--output", flags.output, "write the best plan here")->type_name("plan.json");
  sub.add_option("--write-schedule-csv", flags.schedule_csv,
                 "write the best plan's schedule as torch's compute-only CSV, one row per device")
      ->type_name("OUT.csv");
  sub.add_option("--memory-order", flags.memory_order,
                 "which peak must fit --memory: predicted (the predicted timeline's, default) or "
                 "worst (the worst arrival order's: no step's timing can exceed it)")
      ->check(CLI::IsMember({"predicted", "worst"}))
      ->type_name("predicted|worst");
  sub.add_flag("--json", flags.json, "print one JSON object instead of the table");
  sub.add_flag("--explain", flags.explain, "say why the best plan wins");
  sub.add_option("--objective", flags.objective,
                 "rank the plans by the predicted median (default) or by p90, the upper end of "
                 "the 80 % interval (a robust choice; needs a profile with spreads)")
      ->check(CLI::IsMember({"median", "p90"}))
      ->type_name("median|p90");
}

// The planner's options from the flags, refused where torch's runtime could not run what they
// ask for; the note says what the runtime leaves out.
PlannerOptions planner_options(const PlanFlagsSet& flags, const Profile& profile,
                               const Hardware& hardware, std::string& note) {
  PlannerOptions options;
  options.chunks = flags.chunks;
  options.checkpoints = parse_checkpoint_list(flags.checkpoints, "--checkpoint");
  options.schedules = parse_schedule_list(flags.schedules, "--schedule");
  options.stages_per_device =
      parse_stages_per_device_list(flags.stages_per_device, "--stages-per-device");
  options.optimizer_state_factor = flags.optimizer_state_factor;
  options.stages = flags.stages;
  options.top = static_cast<std::size_t>(flags.top);
  options.search_budget = flags.budget;
  options.worst_order_memory = flags.memory_order == "worst";
  // A plan for torch's runtime must be one it runs (sim/planner/runtime_support.hpp).
  const std::string refused = keep_what_the_runtime_runs(options, hardware, profile);
  if (!refused.empty())
    throw InputError(fmt::format("{}: {}", flags.hardware.hardware_path, refused));
  if (hardware.runtime == Runtime::TorchPipelining) {
    note +=
        "; only plans torch runs as predicted: chunk counts that split the batch evenly, "
        "checkpoint never, or always where the backward is not split";
    if (options.stage_inputs_unchanged)
      note += ", no stage after the first starting by changing its input in place";
    if (options.stage_outputs_detachable)
      note += ", no middle stage of a zero-bubble plan ending with a view";
    // A cut inside a frozen stem: torch does work there that the profile does not hold.
    if (frozen_stem_cuts_end(profile) > 1)
      note +=
          "; a plan that cuts inside the frozen stem is predicted short for torch, which builds "
          "graphs there and sends gradients back (docs/torch.md)";
  }
  for (int c : options.chunks) {
    if (c < 1 || c > max_chunks(profile.batch_size)) {
      throw InputError(
          fmt::format("--chunks: expected {}, got {}", chunks_expectation(profile.batch_size), c));
    }
  }
  return options;
}

// The stages the plans have, refused where the profile has fewer layers; and a p90 objective
// refused where there is no interval to rank by. Before any search.
int checked_stage_count(const PlanFlagsSet& flags, const Profile& profile,
                        const Hardware& hardware) {
  const int stages = flags.stages > 0 ? flags.stages : static_cast<int>(hardware.devices.size());
  if (stages > static_cast<int>(profile.layer_count())) {
    throw InputError(fmt::format("{}: {} stages asked for, but the profile has only {} layers",
                                 flags.stages > 0 ? "--stages" : "--devices", stages,
                                 profile.layer_count()));
  }
  // Before any search: nothing to rank by.
  if (flags.objective == "p90" && !profile.has_spreads() && hardware.model_error == 0) {
    throw InputError(fmt::format(
        "--objective p90: {} has no spreads of its layers' times (profile again for them) and "
        "the hardware no model_error (validate writes it): no interval to rank by",
        flags.profile));
  }
  return stages;
}

// The best plan and its schedule written where asked, and the explanation.
void write_plan_outputs(const PlanFlagsSet& flags, const Profile& profile, const Hardware& hardware,
                        const PlannerOptions& options, const PlanSearchResult& result) {
  if (!flags.output.empty()) {
    save_plan(result.ranked.front().plan, profile, flags.output);
    if (!flags.json) std::printf("\nwrote the best plan to %s\n", flags.output.c_str());
  }
  if (!flags.schedule_csv.empty()) {
    const Plan& best = result.ranked.front().plan;
    write_schedule_csv(schedule_of(best, profile.batch_size), stage_devices(best, hardware),
                       hardware, flags.schedule_csv);
  }
  if (flags.explain && !flags.json) {
    std::fputs(plan_explanation(profile, hardware, options, result).c_str(), stdout);
  }
}

int run_plan_command(const PlanFlagsSet& flags) {
  const Profile profile = load_profile(flags.profile);
  if (flags.hardware.devices == 0 && flags.hardware.hardware_path.empty()) {
    throw InputError("--devices: give a device count (e.g. --devices 4) or --hardware FILE");
  }
  std::string note;
  const Hardware hardware =
      resolve_hardware(profile, flags.hardware, flags.hardware.devices, &note);
  PlannerOptions options = planner_options(flags, profile, hardware, note);
  const int stages = checked_stage_count(flags, profile, hardware);
  print_note(note);
  ProgressBar bar("configurations");
  options.progress = [&](std::size_t done, std::size_t total) { bar.update(done, total); };
  PlanSearchResult result = find_best_plans(profile, hardware, options);
  bar.finish();
  std::vector<IterationInterval> intervals = plan_intervals(profile, hardware, stages, result);
  if (flags.objective == "p90") rank_by_p90(result, intervals);

  if (flags.json) {
    std::fputs(plan_json(profile, result, intervals).c_str(), stdout);
  } else {
    std::fputs(plan_text(profile, hardware, result, intervals).c_str(), stdout);
    if (flags.objective == "p90") {
      std::printf(
          "\nranked by p90, the upper end of each plan's 80 %% interval, among the best plans "
          "of the %zu configurations shown; the proof of optimality is for the median\n",
          result.ranked.size());
    }
  }
  if (result.ranked.empty()) return 1;
  write_plan_outputs(flags, profile, hardware, options, result);
  return 0;
}

}  // namespace

void add_plan_command(CLI::App& app, std::vector<Command>& commands) {
  auto flags = std::make_shared<PlanFlagsSet>();
  CLI::App* sub = app.add_subcommand(
      "plan",
      "Find the fastest plan that fits every device: balance, chunks, checkpoint, schedule");
  declare_plan_flags(*sub, *flags);
  commands.emplace_back(sub, [flags] { return run_plan_command(*flags); });
}

}  // namespace pipetune::cli
