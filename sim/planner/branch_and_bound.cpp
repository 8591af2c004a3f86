// The exact search over single-stage balances: depth-first over each stage's last layer, pruned
// by the stage bounds, the suffix tables, sweeps of the placed prefix and the round trip tables
// built here; and the same search within a window of stage ends (search_around(): around the
// best plan, search_around_best(), and around the relaxed root's plan).

#include <algorithm>
#include <cmath>
#include <utility>

#include "sim/planner/single_stage_search.hpp"

namespace pipetune::planning {

// GPipe: a full-size micro-batch i's round trip from stage j also waits, on the last stage, for
// what its programme runs between i's forward and backward: at least the last micro-batch's
// forward, recompute and backward and M - 2's recompute, over the last stage's layers. Those
// layers are unknown before the last stage is placed, but include [c, L) for the largest start
// c that the stages in between can reach while each stays below the threshold (`offset` turns
// wait_cost into a bound given the placed stages): furthest_last_start() gives it. Returns c,
// or -1 when even the last stage from c cannot stay below the threshold.
int SingleStageSearch::last_stage_start(int j, int b, double offset, double limit) const {
  const int last = stages_ - 1;
  auto cost = [&](int k, int a, int e) { return offset + wait_cost(k, a, e); };
  const int start = furthest_last_start(j + 1, last, b, layers_, limit, cost);
  return cost(last, start, layers_) < limit ? start : -1;
}

// The least end b of stage j that the bounds on the later stages do not rule out. Each of those
// bounds is at least its value with the passes through stage j left out, and at least the
// floor of that value (running_min), which only falls as b grows, so binary search finds where
// it drops below the threshold; ends before it need not be examined one by one.
int SingleStageSearch::first_open_end(int j, int a, double arrive, double drain,
                                      const Passes& exact, bool windowed) const {
  const int remaining = stages_ - 1 - j;
  const double limit = threshold(Objective::Time, windowed);
  const bool follow_last =
      followed_ == config_->micro_batches() - 1 && config_->schedule == ScheduleKind::OneFOneB;
  const double exact_drain = follow_last ? exact.drain_last : exact.drain_full;
  auto open = [&](int b) {
    return arrive + suffix_floor_[remaining][b] < limit &&
           arrive + drain - before_[a] + chained_floor_[remaining][b] < limit &&
           exact.arrive + exact_drain - wait_before_[a] + waits_floor_[remaining][b] < limit;
  };
  int lo = a + 1, hi = layers_ - remaining;
  if (!open(hi)) return hi + 1;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (open(mid)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// The ends of stage j from a that search() examines, in its order (EndOrder); false where the
// prefix programme rules them all out.
bool SingleStageSearch::end_order(int j, int a, double arrive, double drain, const Passes& exact,
                                  Objective objective, const Walk& walk, EndOrder& order) {
  const bool last = j + 1 == stages_;
  const int remaining = stages_ - 1 - j;
  order.last = last ? layers_ : layers_ - remaining;
  order.first = last ? layers_ : a + 1;
  if (!last && objective == Objective::Time)
    order.first = first_open_end(j, a, arrive, drain, exact, walk.windowed());
  if (!last && walk.windowed()) {
    order.first = std::max(order.first, walk.window[j].first);
    order.last = std::min(order.last, walk.window[j].second);
  }
  // Resuming a slice cut short: every end before the path it stopped on was searched already.
  order.resume = walk.resuming ? walk.resume[j] : 0;
  order.first = std::max(order.first, order.resume);
  // In a window (search_around()), the ends from its centre, the centre plan's own end,
  // outwards: the faster plans near a good one come first (docs/planner.md, step 4).
  order.from_centre = !last && walk.windowed();
  order.centre = order.from_centre ? (walk.window[j].first + walk.window[j].second) / 2 : 0;
  // Ends the prefix programme rules out a run at a time (prefix_alive()); empty: none. Not in a
  // window, whose few ends the programme meets one at a time.
  if (!last && !order.from_centre && objective == Objective::Time && prefix_) {
    const int b_last = last_open_end(j, a, order.first, order.last, arrive, drain);
    // Only where the programme rules out most ends it meets: a run it does not rule out costs
    // a programme per halving for nothing.
    const PrefixDepth& depth = (*prefix_depths_)[j];
    if (b_last - order.first + 1 >= kPrefixRunLeast && depth.single_calls >= kPrefixRunAfter &&
        4 * depth.single_pruned >= 3 * depth.single_calls && prefix_pays(j)) {
      prefix_alive(j, order.first, b_last, order.alive);
      if (order.alive.empty()) return false;  // every end ruled out
    }
  }
  return true;
}

// Depth-first over stage j's last layer. `arrive`/`drain`: micro-batch passes through the
// stages already placed (see time_bound); `worst`: the largest bound of those stages.
void SingleStageSearch::search(int j, int a, double arrive, double drain, Passes exact,
                               double worst, Objective objective, Walk& walk) {
  if (out_of_budget_) return;
  const bool last = j + 1 == stages_;
  const int remaining = stages_ - 1 - j;
  const SizeCosts& drain_size = *first_size_;  // the micro-batch q of prepare()
  EndOrder order;
  if (!end_order(j, a, arrive, drain, exact, objective, walk, order)) return;
  for (int b = order.start(); b <= order.last; b = order.next(b)) {
    if (!order.skip_to_alive(b)) break;
    if (b != order.resume) walk.resuming = false;
    ++context_.stats.nodes;
    if (++context_.stats.steps > walk.step_limit) {
      out_of_budget_ = true;
      // Where to resume: the ends of the stages placed so far, and this one's.
      walk.resume.assign(stages_, 0);
      for (int k = 0, end = 0; k < j; ++k) walk.resume[k] = end += balance_[k];
      walk.resume[j] = b;
      return;
    }
    const double limit = threshold(objective, walk.windowed());
    if (objective == Objective::Memory) {
      if (!memory_node(j, a, b, worst, limit, walk)) return;
      continue;
    }
    // arrive + busy - tail + drain only grows with b: nothing further right can do better.
    // The nested memory bound only grows with b either: no further end fits.
    if (arrive + busy(j, a, b) - tail(j, a, b) + drain >= limit || !fits_nested(j, a, b)) {
      if (!order.from_centre) break;
      order.last = b - 1;
      continue;
    }
    double bound = std::max(worst, time_bound(j, a, b, arrive, drain));
    if (bound >= limit) continue;
    if (!host_work_.empty()) {
      bound = std::max(bound, host_bound(a, b, exact));
      if (bound >= limit) continue;
    }
    const StageDurations d = durations(j, a, b);
    bound = std::max(bound, wait_bound(j, a, b, d, exact));
    if (bound >= limit) continue;
    // The full memory bound walks the stage's layers: last.
    if (memory_excess(j, a, b) > 0) continue;
    balance_[j] = b - a;
    durations_[j] = d;
    if (last) {
      evaluate(balance_, objective);
      continue;
    }
    const double next_arrive =
        arrive + least_forward(*first_size_, j, a, b) + copy(*first_size_, j, b);
    const double next_drain =
        drain + backward(drain_size, j, a, b) + gradient_copy(drain_size, j, b);
    // The later stages wait for the passes through what is placed so far; chained_ counts the
    // passes from layer 0, so take out the part before b.
    const double rest = std::max(next_arrive + suffix_[remaining][b],
                                 next_arrive + next_drain - before_[b] + chained_[remaining][b]);
    if (rest >= limit) continue;
    const Passes onward = onward_passes(a, b, d, exact);
    const double drain =
        followed_ == config_->micro_batches() - 1 && config_->schedule == ScheduleKind::OneFOneB
            ? onward.drain_last
            : onward.drain_full;
    if (onward.arrive + drain - wait_before_[b] + waits_[remaining][b] >= limit) continue;
    bound = std::max(bound, prefix_sweep_bound(j, b, onward, drain, limit));
    if (bound >= limit) continue;
    if (prefix_ && prefix_pays(j)) {
      const double programme = counted_prefix_bound(j, b, b, limit, true);
      if (programme >= limit) continue;
      bound = std::max(bound, programme);
    }
    const std::uint64_t before_children = context_.stats.steps;
    search(j + 1, b, next_arrive, next_drain, onward, bound, objective, walk);
    if (prefix_depths_ != nullptr) {
      ++(*prefix_depths_)[j].subtrees;
      (*prefix_depths_)[j].subtree_steps += context_.stats.steps - before_children;
    }
    if (out_of_budget_) return;  // walk.resume holds where the child stopped
  }
}

// A bound on every completion of the placed stages 0..j (stage j ending at b): a sweep of them
// exactly (IterationSweep::run_prefix), the later stages as round trips at least as long as
// they can be; `drain` is the way back the sweep follows. Infinity where no completion can beat
// `limit`.
double SingleStageSearch::prefix_sweep_bound(int j, int b, const Passes& onward, double drain,
                                             double limit) {
  const int remaining = stages_ - 1 - j;
  const double onward_tasks = 2.0 * overhead_ * (stages_ - 1 - j) + after_latency_[j];
  double trip_first = least_trip(pass_first_, trip_first_, j, b) + onward_tasks +
                      copy(*first_size_, j, b) + gradient_copy(*first_size_, j, b);
  double trip_last = least_trip(pass_last_, trip_last_, j, b) + onward_tasks +
                     copy(*last_size_, j, b) + gradient_copy(*last_size_, j, b);
  const Config& c = *config_;
  const int m = c.micro_batches();
  if (c.schedule == ScheduleKind::GPipe && m >= 2) {
    context_.stats.steps +=
        static_cast<std::uint64_t>(std::max(0, stages_ - 2 - j));  // its greedy fill
    const int start = last_stage_start(j, b, onward.arrive + drain - wait_before_[b], limit);
    if (start < 0) return kInf;  // no completion can beat the threshold
    const StageDurations end_stage = durations(stages_ - 1, start, layers_);
    const int slot = c.sizes.back() != c.sizes.front() ? 1 : 0;
    trip_first += (c.recomputed(m - 1) ? end_stage.forward_nograd[slot] + end_stage.forward[slot]
                                       : end_stage.forward[slot]) +
                  end_stage.backward[slot] + (c.recomputed(m - 2) ? end_stage.forward[0] : 0.0);
  }
  // 1F1B: the later stages pace the round trips (DownstreamPacing). The last r stages
  // start at x at most (stage K - r - 1 ends as far as it can, and so on from b), so their
  // busiest does at least steady_[r][x]'s floor; stage K - r has their longest warm-up:
  // its forward of micro-batch i + r - 1 comes between its backwards of i - 1 and i, a
  // full-size one up to i = M - 1 - r. The last stage holds [x, L) at least for r = 1, and
  // a round trip through it also waits for the micro-batch's recompute there.
  DownstreamPacing pacing;
  const bool paced = c.schedule == ScheduleKind::OneFOneB && !furthest_.empty();
  if (paced) {
    steady_paces_.clear();
    const bool equal_sizes = c.sizes.back() == c.sizes.front();
    int x = b;  // the last r stages start here at most
    for (int r = remaining; r > 1; --r) {
      // The whole group starts at b itself; with equal micro-batches its forward of M - 1
      // is full-size too, one more gap.
      steady_paces_.push_back(
          {x == b ? steady_[r][b] : steady_floor_[r][x], m - 1 - r + (equal_sizes ? 1 : 0)});
      // Stage K - r ends no further than it can from x, and leaves a layer to each after it.
      x = std::min(furthest_[stages_ - r][x], layers_ - r + 1);
    }
    std::reverse(steady_paces_.begin(), steady_paces_.end());  // from the smallest group
    pacing.steady = steady_paces_;
    const StageDurations end_stage = durations(stages_ - 1, x, layers_, false);
    for (int slot = 0; slot < 2; ++slot) {
      pacing.last_work[slot] = end_stage.forward[slot] + end_stage.backward[slot];
      pacing.last_work_recomputed[slot] = end_stage.forward_nograd[slot] + pacing.last_work[slot];
    }
    if (m >= 2 && c.recomputed(0)) trip_first += end_stage.forward[0];
    if (c.recomputed(m - 1)) trip_last += end_stage.forward[equal_sizes ? 0 : 1];
  }
  ++context_.stats.prefix_sweeps;
  charge_sweep(j);
  // The chains: one update per group for each forward of stage j.
  if (paced) context_.stats.steps += m * steady_paces_.size() / kIterationSweepTasksPerStep;
  return sweep_->run_prefix(durations_, j, trip_first, trip_last, paced ? &pacing : nullptr);
}

// search() for the leanest plan at stage j = [a, b): pruned by the full memory bound alone.
// False where the walk ran out of budget below it.
bool SingleStageSearch::memory_node(int j, int a, int b, double worst, double limit, Walk& walk) {
  // The full bound walks the stage's layers: a step each the first time the configuration
  // meets the stage, since it is all this search does per node (uncounted, a capped
  // 1,000 x 16 profile that nothing fits took 100 s).
  const double bound = std::max(
      worst, static_cast<double>(full_memory_bound(j, a, b, static_cast<std::uint64_t>(b - a))));
  if (bound >= limit) return true;
  balance_[j] = b - a;
  if (j + 1 == stages_) {
    evaluate(balance_, Objective::Memory);
    return true;
  }
  search(j + 1, b, 0.0, 0.0, {}, bound, Objective::Memory, walk);
  return !out_of_budget_;
}

// The exact passes through stages 0..j once stage j = [a, b) (its durations `d`) is placed:
// micro-batch 0 goes on as it runs here; the drain follows GPipe's micro-batch 0 and 1F1B's
// last one.
SingleStageSearch::Passes SingleStageSearch::onward_passes(int a, int b, const StageDurations& d,
                                                           const Passes& exact) const {
  Passes onward;
  onward.arrive = exact.arrive + (config_->recomputed(0) ? d.forward_nograd[0] : d.forward[0]) +
                  d.activation_copy[0];
  onward.drain_full = exact.drain_full + d.backward[0] + d.output_gradient_copy[0];
  onward.drain_last = exact.drain_last + d.backward[1] + d.output_gradient_copy[1];
  if (!host_work_.empty()) {
    onward.arrive_host = exact.arrive_host + host_arrive_[b] - host_arrive_[a] + overhead_;
    onward.drain_host = exact.drain_host + host_drain_[b] - host_drain_[a] + host_drain_per_stage_;
  }
  return onward;
}

void SingleStageSearch::search_around_best(std::uint64_t step_limit) {
  for (double centred = kInf; config_best_ < centred;) {
    centred = config_best_;
    if (!search_around(config_best_candidate_.plan.balance, kAroundBestRadius, step_limit)) break;
  }
}

bool SingleStageSearch::search_around(const std::vector<int>& centre, int radius,
                                      std::uint64_t step_limit) {
  Walk walk;
  walk.window.assign(stages_, {0, 0});
  for (int k = 0, end = 0; k + 1 < stages_; ++k) {
    end += centre[k];
    walk.window[k] = {end - radius, end + radius};
  }
  walk.resume.assign(stages_, 0);
  walk.step_limit = step_limit;
  // The prefix programmes' measures of what they save (prefix_pays()) are the whole search's:
  // a window's subtrees are small, and counted there they turned the programmes off in the
  // search after it (bench's capped 1,000-layer case: 20 % more steps).
  std::vector<PrefixDepth> window_depths;
  std::vector<PrefixDepth>* const kept_depths = prefix_depths_;
  if (kept_depths != nullptr) {
    window_depths = *kept_depths;
    prefix_depths_ = &window_depths;
  }
  out_of_budget_ = false;
  balance_.assign(stages_, 0);
  build_trip_tables(threshold(Objective::Time, walk.windowed()));
  search(0, 0, 0.0, 0.0, {}, 0.0, Objective::Time, walk);
  const bool finished = !out_of_budget_;
  out_of_budget_ = false;
  prefix_depths_ = kept_depths;
  return finished;
}

// The round trips that wait_bound() and the prefix sweeps follow through the stages after j,
// at those stages' own speeds rather than the fastest one's. Any balance that beats `limit` has
// every stage's chained_cost() below it and passing the nested memory bound, so its later
// stages hold layers [b, L) in a way this dynamic programme also considers: least pass over the
// ways to split [b, L) among stages j+1..K-1 (each non-empty) that keep every stage below the
// limit. With devices of equal speed it is the pass at that speed; when they differ it keeps
// the fast devices from holding more than the limit lets them, which the fastest speed cannot.
// O(K L): the stage's furthest end grows with its start (the cost shrinks as the start moves
// right), so the minimum over ends is a sliding window.
void SingleStageSearch::build_trip_tables(double limit) {
  trip_first_.clear();
  trip_last_.clear();
  furthest_.clear();
  if (!(limit < kInf) || stages_ < 2) return;
  const int last = stages_ - 1;
  auto fits = [&](int k, int a, int e) {
    return fits_nested(k, a, e) && chained_cost(k, a, e) < limit;
  };
  furthest_.assign(stages_, std::vector<int>(layers_ + 1, 0));
  std::vector<std::vector<int>>& furthest = furthest_;
  for (int k = 1; k < last; ++k) {
    int e = 0;
    for (int a = 0; a < layers_; ++a) {
      e = std::max(e, a);
      while (e < layers_ && fits(k, a, e + 1)) ++e;
      furthest[k][a] = e;
    }
  }
  auto build = [&](const std::vector<double>& pass, std::vector<std::vector<double>>& table) {
    table.assign(stages_, std::vector<double>(layers_ + 1, kInf));
    for (int b = 0; b < layers_; ++b)
      if (fits(last, b, layers_)) table[last - 1][b] = (pass[b] - pass[layers_]) / speed_[last];
    for (int j = last - 2; j >= 0; --j) {
      const int k = j + 1;  // the stage that starts at b
      const double speed = speed_[k];
      const std::vector<double>& next = table[k];
      auto value = [&](int e) { return next[e] - pass[e] / speed; };
      std::vector<int> window;  // ends, values increasing: a monotone deque
      std::size_t front = 0;
      int added = 0;  // ends up to here were offered
      for (int b = 0; b < layers_; ++b) {
        const int upper = std::min(furthest[k][b], layers_ - (last - k));
        for (int e = std::max(added + 1, b + 1); e <= upper; ++e) {
          while (window.size() > front && !(value(window.back()) < value(e))) window.pop_back();
          window.push_back(e);
          added = e;
        }
        while (front < window.size() && window[front] <= b) ++front;
        if (front < window.size() && window[front] <= upper && value(window[front]) < kInf)
          table[j][b] = pass[b] / speed + value(window[front]);
      }
    }
  };
  build(pass_first_, trip_first_);
  build(pass_last_, trip_last_);
}

}  // namespace pipetune::planning
