#include "sim/planner/planner.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <vector>

#include "sim/error.hpp"
#include "sim/planner/multi_stage_balance_bound.hpp"
#include "sim/planner/search.hpp"

namespace pipetune {

using planning::MultiStageBalanceBound;
using planning::PlanSearch;

double PlannerStats::gap() const {
  return best_ms > 0 && lower_bound_ms < best_ms ? (best_ms - lower_bound_ms) / best_ms : 0.0;
}

std::int64_t PlanCandidate::max_peak_memory_bytes() const {
  std::int64_t peak = 0;
  for (auto p : peak_memory_bytes) peak = std::max(peak, p);
  return peak;
}

std::string search_space_text(const PlannerOptions& options, std::int64_t batch) {
  auto same_set = [](auto chosen, const auto& all) {
    std::sort(chosen.begin(), chosen.end());
    chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
    return chosen.size() == std::size(all) &&
           std::all_of(std::begin(all), std::end(all), [&](auto x) {
             return std::find(chosen.begin(), chosen.end(), x) != chosen.end();
           });
  };
  auto names = [](const auto& list) {
    std::vector<std::string> out;
    for (auto x : list) out.emplace_back(to_string(x));
    return fmt::format("{}", fmt::join(out, ", "));
  };
  const std::string chunks = options.chunks.empty() ? fmt::format("chunk count (1 to {})", batch)
                                                    : fmt::format("chunk count in {{{}}}",
                                                                  fmt::join(options.chunks, ", "));
  const std::string modes =
      same_set(options.checkpoints, kAllCheckpointModes)
          ? "checkpoint mode"
          : fmt::format("checkpoint mode in {{{}}}", names(options.checkpoints));
  const std::string schedules = same_set(options.schedules, kAllScheduleKinds)
                                    ? "schedule"
                                    : fmt::format("schedule in {{{}}}", names(options.schedules));
  // Only these choose their stages per device; the V schedules always run two.
  const bool choosing = std::any_of(options.schedules.begin(), options.schedules.end(), [](auto k) {
    return k == ScheduleKind::Interleaved1F1B || k == ScheduleKind::InterleavedZB ||
           k == ScheduleKind::LoopedBFS;
  });
  const std::string per_device =
      choosing ? fmt::format(" ({} stages per device in the interleaved and looped ones)",
                             fmt::join(options.stages_per_device, " or "))
               : "";
  std::string balances = "every balance";
  if (options.stage_inputs_unchanged)
    balances += " whose stages after the first do not start by changing their input in place";
  if (options.stage_outputs_detachable)
    balances += fmt::format(" {}whose middle stages do not end with a view under zero bubble",
                            options.stage_inputs_unchanged ? "and " : "");
  const bool splits = std::any_of(options.schedules.begin(), options.schedules.end(),
                                  [](ScheduleKind k) { return splits_backward(k); });
  const bool always = std::find(options.checkpoints.begin(), options.checkpoints.end(),
                                CheckpointMode::Always) != options.checkpoints.end();
  const std::string unsplit = !options.checkpointed_split_backward && splits && always
                                  ? " (checkpoint always only where the backward is not split)"
                                  : "";
  return fmt::format("{}, {}, {}{} and {}{}", balances, chunks, modes, unsplit, schedules,
                     per_device);
}

PlanSearchResult find_best_plans(const Profile& profile, const Hardware& hardware,
                                 const PlannerOptions& options) {
  const int stages =
      options.stages > 0 ? options.stages : static_cast<int>(hardware.devices.size());
  if (stages > static_cast<int>(hardware.devices.size())) {
    throw InputError(Input::Stages, fmt::format("{} stages asked for, the hardware has {} devices",
                                                stages, hardware.devices.size()));
  }
  if (stages > static_cast<int>(profile.layer_count())) {
    throw InputError(fmt::format("{} stages asked for, but the profile has only {} layers", stages,
                                 profile.layer_count()));
  }
  // Calibration applied up front, so that the bounds see the durations the simulator will.
  const Hardware used = first_devices(calibrated(hardware, stages), stages);
  PlanSearch search(profile, used, options);
  PlanSearchResult result = search.run();
  result.search_space = search_space_text(options, profile.batch_size);
  if (profile.min_micro_batch > 1) {
    result.search_space += fmt::format(
        " (the chunk counts leaving no micro-batch under {} samples, the fewest the model trains "
        "on)",
        profile.min_micro_batch);
  }
  return result;
}

PlannerOptions single_stage_planner_options() {
  PlannerOptions options;
  options.schedules.assign(std::begin(kSingleStageScheduleKinds),
                           std::end(kSingleStageScheduleKinds));
  return options;
}

double multi_stage_balance_bound(const Profile& profile, const Hardware& hardware,
                                 const Plan& plan) {
  const int v = plan.stages_per_device;
  const int devices = plan.stages() / std::max(1, v);
  // As the simulator sees the hardware: its calibration applied.
  const Hardware used = calibrated(hardware, devices);
  std::vector<double> speed;
  for (int d = 0; d < devices; ++d) speed.push_back(used.devices.at(d).speed);
  const CostModel costs(profile);
  MultiStageBalanceBound bound(costs, split_batch(profile.batch_size, plan.chunks), plan.schedule,
                               plan.checkpoint, devices, v, std::move(speed),
                               used.launch_overhead_ms, used);
  return bound.of(plan.balance);
}

double multi_stage_configuration_bound(const Profile& profile, const Hardware& hardware,
                                       const Plan& plan) {
  return PlanSearch(profile, hardware, single_stage_planner_options()).configuration_bound_of(plan);
}

std::vector<std::vector<double>> single_stage_prefix_bounds(const Profile& profile,
                                                            const Hardware& hardware,
                                                            const std::vector<Plan>& plans,
                                                            int widen, double limit) {
  return PlanSearch(profile, hardware, single_stage_planner_options())
      .prefix_bounds_of(plans, widen, limit);
}

PlanCandidate single_stage_best_around(const Profile& profile, const Hardware& hardware,
                                       const Plan& centre, int radius) {
  return PlanSearch(profile, hardware, single_stage_planner_options())
      .best_around_of(centre, radius);
}

StageWorkRows multi_stage_time_rows(const Profile& profile, const Hardware& hardware,
                                    const Plan& plan) {
  PlanSearch search(profile, hardware, single_stage_planner_options());
  return search.time_rows_of(plan);
}

}  // namespace pipetune
