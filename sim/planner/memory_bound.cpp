// The memory bound on single-stage balances: a lower bound on a stage's device peak from the
// memory model's task effects (stage_peak_bound()), nested (growing with the stage at either
// end) for the tables over suffixes and full for a placed stage, and the furthest ends each
// device's cap lets a stage reach.

#include <algorithm>

#include "sim/planner/single_stage_search.hpp"

namespace pipetune::planning {

// From `end`, the furthest end up to `limit` at which stage j = [a, end) passes its nested
// memory bound under `cap` (the bound grows with the end).
int SingleStageSearch::fitting_end(int j, int a, int end, int limit, double cap) const {
  while (end < limit && static_cast<double>(memory_bound(j, a, end + 1, true)) <= cap) ++end;
  return end;
}

// Per stage and start, the furthest end whose nested memory bound fits `share` of the device
// (empty for a stage without a cap): it never moves left as the start moves right (the bound
// shrinks), so one pass per stage finds them all.
std::vector<std::vector<int>> SingleStageSearch::fit_ends(double share) const {
  std::vector<std::vector<int>> out(stages_);
  for (int j = 0; j < stages_; ++j) {
    if (context_.capacity[j] <= 0) continue;
    const double cap = share * static_cast<double>(context_.capacity[j]);
    out[j].assign(layers_, 0);
    int end = 0;
    for (int a = 0; a < layers_; ++a)
      out[j][a] = end = fitting_end(j, a, std::max(end, a), layers_, cap);
  }
  return out;
}

// Whether some balance has every stage pass its nested memory bound (no plan of the
// configuration fits otherwise). Each stage ends as far right as it fits, leaving a layer for
// each later one: a later start only lets the later stages reach further, so this greedy walk
// reaches the last layer whenever any balance does. It needs each stage's furthest end from one
// start only, found by walking right from that start (the bound grows with the end): about one
// bound per layer in all, where fit_ends() takes two per layer and stage (on 3,000 layers and 32
// stages where nothing fits, those tables were most of a plan's time).
bool SingleStageSearch::some_balance_fits_nested() const {
  int start = 0;
  for (int j = 0; j < stages_; ++j) {
    const int most = layers_ - (stages_ - 1 - j);
    int end = most;
    if (context_.capacity[j] > 0)
      end = fitting_end(j, start, start, most, static_cast<double>(context_.capacity[j]));
    if (end <= start) return false;
    start = end;
  }
  return start == layers_;
}

// The full memory_bound() of stage j = [a, b), each stage walked once per configuration: the
// search meets one stage under many prefixes (bench's capped 1,000 x 16 profile, gpipe and 1f1b:
// 173,000 bounds of 3,500 stages), and the walks were a third of its time. A walk is charged
// `walk_steps`, a stage met again one step.
std::int64_t SingleStageSearch::full_memory_bound(int j, int a, int b, std::uint64_t walk_steps) {
  const auto ends = static_cast<std::uint64_t>(layers_) + 1;
  const std::uint64_t key =
      (static_cast<std::uint64_t>(j) * ends + static_cast<std::uint64_t>(a)) * ends +
      static_cast<std::uint64_t>(b);
  if (full_bounds_.size() >= kFullBoundsKept) full_bounds_.clear();
  auto [it, added] = full_bounds_.try_emplace(key, 0);
  if (added) {
    context_.stats.steps += walk_steps;
    it->second = memory_bound(j, a, b);
  } else {
    ++context_.stats.steps;
  }
  return it->second;
}

// A lower bound on the simulated peak of stage j's device (stage_peak_bound(), derived from the
// memory model's task effects); `nested` for the tables over suffixes.
std::int64_t SingleStageSearch::memory_bound(int j, int a, int b, bool nested) const {
  return stage_peak_bound(context_.costs, *first_size_, *last_size_, peak_shape_, j, a, b, nested);
}

}  // namespace pipetune::planning
