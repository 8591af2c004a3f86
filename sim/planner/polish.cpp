// Local search on single-stage plans: moves of a layer between neighbouring stages that make a
// plan faster (polish) or make it fit its caps (repair), timed by sweeps.

#include <algorithm>
#include <cmath>
#include <numeric>

#include "sim/planner/single_stage_search.hpp"

namespace pipetune::planning {

void SingleStageSearch::evaluate(const std::vector<int>& balance, Objective objective) {
  const Config& c = *config_;
  if (objective == Objective::Time) {
    // The sweep gives the time (durations_ holds the balance's stages); only a plan that would
    // be the new best needs the simulator, for its memory.
    const double time = sweep_->run(durations_);
    ++context_.stats.sweeps;
    charge_sweep(stages_ - 1);
    if (!(time < config_best_)) return;
  }
  const Plan plan = context_.plan_of(c, balance);
  SimulationOptions lean;
  lean.record_tasks = false;
  lean.record_memory = false;
  const SimulationResult r = context_.simulate_charged(plan, lean);

  auto candidate = [&] { return context_.candidate_of(c, plan, r); };
  if (objective == Objective::Time) {
    std::vector<std::int64_t> worst;
    if (r.iteration_ms < config_best_ && context_.fits(plan, r, worst)) {
      config_best_ = r.iteration_ms;
      config_best_candidate_ = candidate();
      config_best_candidate_.worst_order_peak_bytes = std::move(worst);
    }
  }
  // Every simulated plan is a candidate for the leanest, which the report gives when nothing
  // fits: the search for time has simulated the first plans of every configuration already.
  const double peak = static_cast<double>(r.max_peak_memory_bytes());
  if (peak < lean_best_ && context_.runs(plan)) {
    lean_best_ = peak;
    lean_candidate_ = candidate();
  }
}

// Moves of a local search over balances: one stage end by up to four layers, two adjacent ends
// by up to three each, and three to five adjacent ends together by one or two layers (work
// passed along several stages at once, as 1F1B's balance wants: a stage's share depends on its
// place in the pipeline).
struct SingleStageSearch::Move {
  int k, d, e;  // end k moves by d, end k + 1 by e
  int run = 0;  // > 0: ends k..k + run all move by d (e unused)
  int last_stage() const { return run > 0 ? k + run + 1 : e != 0 ? k + 2 : k + 1; }
};

std::vector<SingleStageSearch::Move> SingleStageSearch::local_moves() const {
  std::vector<Move> moves;
  for (int k = 0; k + 1 < stages_; ++k) {
    for (int d = -kPolishReach; d <= kPolishReach; ++d)
      if (d != 0) moves.push_back({k, d, 0});
  }
  for (int k = 0; k + 2 < stages_; ++k) {
    for (int d = 1 - kPolishReach; d < kPolishReach; ++d) {
      for (int e = 1 - kPolishReach; e < kPolishReach; ++e)
        if (d != 0 && e != 0) moves.push_back({k, d, e});
    }
  }
  for (int run = 2; run <= kPolishLongestRun; ++run) {
    for (int k = 0; k + run + 1 < stages_; ++k) {
      for (int d : {-2, -1, 1, 2}) moves.push_back({k, d, 0, run});
    }
  }
  return moves;
}

// A balance as its stages' ends, with durations_ holding each stage's durations.
struct SingleStageSearch::StageEnds {
  std::vector<int> ends;  // ends[k]: stage k's last layer + 1
  int start(int k) const { return k == 0 ? 0 : ends[k - 1]; }
  void shift(const Move& m, int sign) {
    ends[m.k] += sign * m.d;
    if (m.run > 0) {
      for (int k = m.k + 1; k <= m.k + m.run; ++k) ends[k] += sign * m.d;
    } else {
      ends[m.k + 1] += sign * m.e;
    }
  }
  bool stages_not_empty(const Move& m) const {
    for (int k = m.k; k <= m.last_stage(); ++k)
      if (ends[k] <= start(k)) return false;
    return true;
  }
  std::vector<int> balance() const {
    std::vector<int> out;
    for (std::size_t k = 0; k < ends.size(); ++k)
      out.push_back(ends[k] - start(static_cast<int>(k)));
    return out;
  }
};

SingleStageSearch::StageEnds SingleStageSearch::stage_ends(const std::vector<int>& balance) {
  StageEnds s;
  for (int k = 0, end = 0; k < stages_; ++k) s.ends.push_back(end += balance[k]);
  for (int k = 0; k < stages_; ++k) durations_[k] = durations(k, s.start(k), s.ends[k]);
  return s;
}

// durations_ of the stages move `m` changed, as `at` has them now; returns what they were, for
// restore().
std::vector<StageDurations> SingleStageSearch::retime(const StageEnds& at, const Move& m) {
  std::vector<StageDurations> kept(durations_.begin() + m.k,
                                   durations_.begin() + m.last_stage() + 1);
  for (int k = m.k; k <= m.last_stage(); ++k) durations_[k] = durations(k, at.start(k), at.ends[k]);
  return kept;
}

void SingleStageSearch::restore(const std::vector<StageDurations>& kept, const Move& m) {
  std::copy(kept.begin(), kept.end(), durations_.begin() + m.k);
}

// By how much stage k = [a, b)'s memory bound exceeds its device's cap (0 without one). The
// bound walks the stage's layers, counted like a sweep, the first time the configuration meets
// the stage (full_memory_bound()).
std::int64_t SingleStageSearch::memory_excess(int k, int a, int b) {
  if (context_.capacity[k] <= 0) return 0;
  const std::int64_t bound =
      full_memory_bound(k, a, b, 1 + static_cast<std::uint64_t>(b - a) / kSweepTasksPerStep);
  return std::max<std::int64_t>(0, bound - context_.capacity[k]);
}

// A first-improvement local search around the configuration's best plan (local_moves(), tried
// in turn, on from the last one that improved, until every move has failed in a row) or until
// `step_limit`. The depth-first search proves and this finds: a plan a few layers away from the
// first ones is often faster, more so under memory caps, where the search's order (stage by
// stage, ends from the left) reaches it late. Each plan is timed by the sweep and kept only if
// the simulator says it fits, as the search's leaves are, so the answer stays the simulator's;
// a stage whose memory bound exceeds its cap is not timed at all. True when no move improves
// the best plan.
bool SingleStageSearch::polish(std::uint64_t step_limit) {
  if (!(config_best_ < kInf)) return true;
  StageEnds at = stage_ends(config_best_candidate_.plan.balance);
  // The stages a move changed: timed and simulated if each may fit; kept if faster.
  auto better = [&](const Move& m) {
    if (!at.stages_not_empty(m)) return false;
    for (int k = m.k; k <= m.last_stage(); ++k)
      if (memory_excess(k, at.start(k), at.ends[k]) > 0) return false;
    const std::vector<StageDurations> kept = retime(at, m);
    const double before = config_best_;
    evaluate(at.balance(), Objective::Time);
    if (config_best_ < before) return true;
    restore(kept, m);
    return false;
  };
  const std::vector<Move> moves = local_moves();
  for (std::size_t i = 0, failed = 0; failed < moves.size(); i = (i + 1) % moves.size()) {
    if (context_.stats.steps >= step_limit) return false;
    at.shift(moves[i], 1);
    if (better(moves[i])) {
      failed = 0;
      continue;
    }
    at.shift(moves[i], -1);
    ++failed;
  }
  return true;
}

// From a plan that does not fit, such as the relaxed shares rounded (chosen for time alone):
// each step takes, of the local moves that change a stage over its cap, the one that leaves
// the least total excess of the stages' memory bounds over their caps, the fastest by the sweep
// among equals, until none is left or no move lowers it. Where a cap rules out the fastest
// shares, this lands a few layers from them, where the busy-balanced plan under the caps can be
// far slower. True when every stage passes its memory bound; `balance` is then the plan. Gives
// up at `step_limit` (a cap that no plan near the shares meets can take many steps).
bool SingleStageSearch::repair(std::vector<int>& balance, std::uint64_t step_limit) {
  StageEnds at = stage_ends(balance);
  std::vector<std::int64_t> excess(stages_);
  for (int k = 0; k < stages_; ++k) excess[k] = memory_excess(k, at.start(k), at.ends[k]);
  const std::vector<Move> moves = local_moves();
  for (int step = 0; step < 4 * layers_ && context_.stats.steps < step_limit; ++step) {
    const std::int64_t total = std::accumulate(excess.begin(), excess.end(), std::int64_t{0});
    if (total == 0) break;
    std::int64_t best_total = total;
    double best_time = kInf;
    const Move* best = nullptr;
    for (const Move& m : moves) {
      if (std::all_of(excess.begin() + m.k, excess.begin() + m.last_stage() + 1,
                      [](std::int64_t x) { return x == 0; }))
        continue;
      at.shift(m, 1);
      if (at.stages_not_empty(m)) {
        std::int64_t moved = total;
        for (int k = m.k; k <= m.last_stage(); ++k)
          moved += memory_excess(k, at.start(k), at.ends[k]) - excess[k];
        if (moved < best_total || (moved == best_total && best != nullptr)) {
          const std::vector<StageDurations> kept = retime(at, m);
          const double time = sweep_->run(durations_);
          charge_sweep(stages_ - 1);
          if (moved < best_total || time < best_time)
            best_total = moved, best_time = time, best = &m;
          restore(kept, m);
        }
      }
      at.shift(m, -1);
    }
    if (best == nullptr) break;
    at.shift(*best, 1);
    retime(at, *best);
    for (int k = best->k; k <= best->last_stage(); ++k)
      excess[k] = memory_excess(k, at.start(k), at.ends[k]);
  }
  balance = at.balance();
  return std::all_of(excess.begin(), excess.end(), [](std::int64_t x) { return x == 0; });
}

}  // namespace pipetune::planning
