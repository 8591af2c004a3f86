#include "sim/planner/one_choice_away.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "sim/plan.hpp"
#include "sim/schedule.hpp"

namespace pipetune {

std::vector<Alternative> one_choice_away(const Profile& profile, const Hardware& hardware,
                                         const PlannerOptions& options, const PlanCandidate& best) {
  struct Change {
    std::string label;
    PlannerOptions options;
  };
  std::vector<Change> changes;
  PlannerOptions fixed = options;
  fixed.top = 1;
  fixed.progress = {};
  fixed.search_budget = std::max<std::uint64_t>(options.search_budget / 8, 1'000'000);
  fixed.chunks = {best.plan.chunks};
  fixed.checkpoints = {best.plan.checkpoint};
  fixed.schedules = {best.plan.schedule};
  fixed.stages_per_device = {best.plan.stages_per_device};
  // With one micro-batch, except_last recomputes nothing: the same plan as never.
  const bool one_micro_batch = micro_batch_count(profile.batch_size, best.plan.chunks) == 1;
  auto effective = [&](CheckpointMode mode) {
    return one_micro_batch && mode == CheckpointMode::ExceptLast ? CheckpointMode::Never : mode;
  };
  for (auto mode : kAllCheckpointModes) {
    if (effective(mode) == effective(best.plan.checkpoint)) continue;
    Change c{fmt::format("checkpoint {}", to_string(mode)), fixed};
    c.options.checkpoints = {mode};
    changes.push_back(c);
  }
  // Every other (schedule, stages per device) the search was allowed: the choices the user
  // left open, not the ones they ruled out.
  for (auto kind : options.schedules) {
    const auto only = fixed_stages_per_device(kind);
    const std::vector<int> counts = only ? std::vector<int>{*only} : options.stages_per_device;
    for (int v : counts) {
      if (kind == best.plan.schedule && v == best.plan.stages_per_device) continue;
      std::string label = fmt::format("schedule {}", to_string(kind));
      if (is_multi_stage(kind)) label += fmt::format(", {}/device", v);
      Change c{label, fixed};
      c.options.schedules = {kind};
      c.options.stages_per_device = {v};
      changes.push_back(c);
    }
  }
  // Half and twice the chunks, where that splits the batch differently (tensor.chunk may give
  // fewer micro-batches than asked).
  const auto best_split = split_batch(profile.batch_size, best.plan.chunks);
  for (int chunks : {best.plan.chunks / 2, best.plan.chunks * 2}) {
    if (chunks < 1 || chunks > profile.batch_size) continue;
    const auto split = split_batch(profile.batch_size, chunks);
    if (split == best_split) continue;
    std::string label = fmt::format("chunks {}", chunks);
    if (static_cast<int>(split.size()) != chunks)
      label += fmt::format(" ({} micro-batches)", split.size());
    Change c{label, fixed};
    c.options.chunks = {chunks};
    changes.push_back(c);
  }

  // Each change has one schedule, stages-per-device count and chunk count.
  const int devices =
      options.stages > 0 ? options.stages : static_cast<int>(hardware.devices.size());
  std::vector<Alternative> out;
  for (const auto& c : changes) {
    const ScheduleKind kind = c.options.schedules.front();
    const int v = is_multi_stage(kind) ? c.options.stages_per_device.front() : 1;
    const auto micro_batches = micro_batch_count(profile.batch_size, c.options.chunks.front());
    if (auto why = schedule_refusal(kind, devices, v, micro_batches)) {
      out.push_back({c.label, std::nullopt, *why});
      continue;
    }
    const PlanSearchResult r = find_best_plans(profile, hardware, c.options);
    out.push_back({c.label,
                   r.ranked.empty() ? std::nullopt : std::optional<PlanCandidate>(r.ranked.front()),
                   {}});
  }
  return out;
}

}  // namespace pipetune
