#include "sim/planner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "sim/error.hpp"
#include "sim/multi_stage_balance_bound.hpp"
#include "sim/planner_search.hpp"

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
  Hardware used = calibrated(hardware, stages);
  used.devices.resize(stages);
  std::erase_if(used.links, [stages](const LinkOverride& o) {
    return o.first >= stages || o.second >= stages;
  });
  PlanSearch search(profile, used, options);
  return search.run();
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
  return PlanSearch(profile, hardware, PlannerOptions{}).configuration_bound_of(plan);
}

std::vector<std::vector<double>> single_stage_prefix_bounds(const Profile& profile,
                                                            const Hardware& hardware,
                                                            const std::vector<Plan>& plans,
                                                            int widen, double limit) {
  return PlanSearch(profile, hardware, PlannerOptions{}).prefix_bounds_of(plans, widen, limit);
}

PlanCandidate single_stage_best_around(const Profile& profile, const Hardware& hardware,
                                       const Plan& centre, int radius) {
  return PlanSearch(profile, hardware, PlannerOptions{}).best_around_of(centre, radius);
}

StageWorkRows multi_stage_time_rows(const Profile& profile, const Hardware& hardware,
                                    const Plan& plan) {
  PlanSearch search(profile, hardware, PlannerOptions{});
  return search.time_rows_of(plan);
}

}  // namespace pipetune
