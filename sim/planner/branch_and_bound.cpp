// The exact search over single-stage balances: depth-first over each stage's last layer, pruned
// by the stage bounds, the suffix tables, sweeps of the placed prefix and the round trip tables
// built here; and the same search within a window of stage ends (search_around(): around the
// best plan, search_around_best(), and around the relaxed root's plan).

#include <algorithm>
#include <cmath>
#include <utility>

#include "sim/planner/search.hpp"

namespace pipetune::planning {

// GPipe: a full-size micro-batch i's round trip from stage j also waits, on the last stage, for
// what its programme runs between i's forward and backward: at least the last micro-batch's
// forward, recompute and backward and M - 2's recompute, over the last stage's layers. Those
// layers are unknown before the last stage is placed, but include [c, L) for the largest start
// c that the stages in between can reach while each stays below the threshold (`offset` turns
// wait_cost into a bound given the placed stages): furthest_last_start() gives it. Returns c,
// or -1 when even the last stage from c cannot stay below the threshold.
int PlanSearch::last_stage_start(int j, int b, double offset, double limit) const {
  const int last = stages_ - 1;
  auto cost = [&](int k, int a, int e) { return offset + wait_cost(k, a, e); };
  const int start = furthest_last_start(j + 1, last, b, layers_, limit, cost);
  return cost(last, start, layers_) < limit ? start : -1;
}

// The least end b of stage j that the bounds on the later stages do not rule out. Each of those
// bounds is at least its value with the passes through stage j left out, and at least the
// floor of that value (running_min), which only falls as b grows, so binary search finds where
// it drops below the threshold; ends before it need not be examined one by one.
int PlanSearch::first_open_end(int j, int a, double arrive, double drain,
                               const Passes& exact) const {
  const int remaining = stages_ - 1 - j;
  const double limit = threshold(Objective::Time);
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

// Depth-first over stage j's last layer. `arrive`/`drain`: micro-batch passes through the
// stages already placed (see time_bound); `worst`: the largest bound of those stages.
void PlanSearch::search(int j, int a, double arrive, double drain, Passes exact, double worst,
                        Objective objective) {
  if (out_of_budget_) return;
  const bool last = j + 1 == stages_;
  const int remaining = stages_ - 1 - j;
  int b_end = last ? layers_ : layers_ - remaining;
  const SizeCosts& drain_size = *first_size_;  // the micro-batch q of prepare()
  int b_start = last ? layers_ : a + 1;
  if (!last && objective == Objective::Time) b_start = first_open_end(j, a, arrive, drain, exact);
  if (!last && !window_.empty()) {
    b_start = std::max(b_start, window_[j].first);
    b_end = std::min(b_end, window_[j].second);
  }
  // Resuming a slice cut short: every end before the path it stopped on was searched already.
  const int resume_b = resuming_ ? resume_[j] : 0;
  b_start = std::max(b_start, resume_b);
  // In a window (search_around()), the ends from its centre, the centre plan's own end,
  // outwards: the faster plans near a good one come first (docs/planner.md, step 4).
  const bool from_centre = !last && !window_.empty();
  const int centre = from_centre ? (window_[j].first + window_[j].second) / 2 : 0;
  // Ends the prefix programme rules out a run at a time (prefix_alive()); empty: none. Not in a
  // window, whose few ends the programme meets one at a time.
  std::vector<std::pair<int, int>> alive;
  if (!last && !from_centre && objective == Objective::Time && prefix_) {
    const int b_last = last_open_end(j, a, b_start, b_end, arrive, drain);
    // Only where the programme rules out most ends it meets: a run it does not rule out costs
    // a programme per halving for nothing.
    const PrefixDepth& depth = (*prefix_depths_)[j];
    if (b_last - b_start + 1 >= kPrefixRunLeast && depth.single_calls >= kPrefixRunAfter &&
        4 * depth.single_pruned >= 3 * depth.single_calls && prefix_pays(j)) {
      prefix_alive(j, b_start, b_last, alive);
      if (alive.empty()) return;  // every end ruled out
    }
  }
  // From the centre: turn 0 is the centre, then one layer left, one right, two left, ...; the
  // first turn from here whose end is within [b_start, b_end], or b_end + 1 where none is.
  int turn = -1;
  auto next_end = [&](int b) {
    if (!from_centre) return b + 1;
    for (;;) {
      ++turn;
      const int right = centre + turn / 2, left = centre - (turn + 1) / 2;
      if (right > b_end && left < b_start) return b_end + 1;
      const int end = turn % 2 == 0 ? right : left;
      if (end >= b_start && end <= b_end) return end;
    }
  };
  std::size_t run = 0;
  for (int b = from_centre ? next_end(0) : b_start; b <= b_end; b = next_end(b)) {
    if (!alive.empty()) {
      while (run < alive.size() && alive[run].second < b) ++run;
      if (run == alive.size()) break;
      b = std::max(b, alive[run].first);
    }
    if (b != resume_b) resuming_ = false;
    ++stats_.nodes;
    if (++stats_.steps > step_limit_) {
      out_of_budget_ = true;
      // Where to resume: the ends of the stages placed so far, and this one's.
      resume_.assign(stages_, 0);
      for (int k = 0, end = 0; k < j; ++k) resume_[k] = end += balance_[k];
      resume_[j] = b;
      return;
    }
    const double limit = threshold(objective);
    if (objective == Objective::Memory) {
      // The full bound walks the stage's layers: a step each the first time the configuration
      // meets the stage, since it is all this search does per node (uncounted, a capped
      // 1,000 x 16 profile that nothing fits took 100 s).
      const double bound = std::max(worst, static_cast<double>(full_memory_bound(
                                               j, a, b, static_cast<std::uint64_t>(b - a))));
      if (bound >= limit) continue;
      balance_[j] = b - a;
      if (last) {
        evaluate(balance_, objective);
      } else {
        search(j + 1, b, 0.0, 0.0, {}, bound, objective);
        if (out_of_budget_) return;
      }
      continue;
    }
    // arrive + busy - tail + drain only grows with b: nothing further right can do better.
    // The nested memory bound only grows with b either: no further end fits.
    if (arrive + busy(j, a, b) - tail(j, a, b) + drain >= limit || !fits_nested(j, a, b)) {
      if (!from_centre) break;
      b_end = b - 1;
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
    const double next_drain = drain + backward(drain_size, j, a, b) + copy(drain_size, j, b);
    // The later stages wait for the passes through what is placed so far; chained_ counts the
    // passes from layer 0, so take out the part before b.
    const double rest = std::max(next_arrive + suffix_[remaining][b],
                                 next_arrive + next_drain - before_[b] + chained_[remaining][b]);
    if (rest >= limit) continue;
    // Micro-batch 0 goes on as it runs here; the drain follows GPipe's micro-batch 0 and
    // 1F1B's last one.
    Passes onward;
    onward.arrive = exact.arrive + (config_->recomputed(0) ? d.forward_nograd[0] : d.forward[0]) +
                    d.activation_copy[0];
    // The gradient copy back over this boundary carries as many bytes as the activation.
    onward.drain_full = exact.drain_full + d.backward[0] + d.activation_copy[0];
    onward.drain_last = exact.drain_last + d.backward[1] + d.activation_copy[1];
    if (!host_work_.empty()) {
      onward.arrive_host = exact.arrive_host + host_arrive_[b] - host_arrive_[a] + overhead_;
      onward.drain_host =
          exact.drain_host + host_drain_[b] - host_drain_[a] + host_drain_per_stage_;
    }
    const double drain =
        followed_ == config_->micro_batches() - 1 && config_->schedule == ScheduleKind::OneFOneB
            ? onward.drain_last
            : onward.drain_full;
    if (onward.arrive + drain - wait_before_[b] + waits_[remaining][b] >= limit) continue;
    {
      // The stages placed so far exactly, the later ones as round trips (see run_prefix).
      const double onward_tasks = 2.0 * overhead_ * (stages_ - 1 - j) + after_latency_[j];
      double trip_first = least_trip(pass_first_, trip_first_, j, b) + onward_tasks +
                          2.0 * copy(*first_size_, j, b);
      double trip_last =
          least_trip(pass_last_, trip_last_, j, b) + onward_tasks + 2.0 * copy(*last_size_, j, b);
      const Config& c = *config_;
      const int m = c.micro_batches();
      if (c.schedule == ScheduleKind::GPipe && m >= 2) {
        stats_.steps +=
            static_cast<std::uint64_t>(std::max(0, stages_ - 2 - j));  // its greedy fill
        const int start = last_stage_start(j, b, onward.arrive + drain - wait_before_[b], limit);
        if (start < 0) continue;  // no completion can beat the threshold
        const StageDurations end_stage = durations(stages_ - 1, start, layers_);
        const int slot = c.sizes.back() != c.sizes.front() ? 1 : 0;
        trip_first +=
            (c.recomputed(m - 1) ? end_stage.forward_nograd[slot] + end_stage.forward[slot]
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
          pacing.last_work_recomputed[slot] =
              end_stage.forward_nograd[slot] + pacing.last_work[slot];
        }
        if (m >= 2 && c.recomputed(0)) trip_first += end_stage.forward[0];
        if (c.recomputed(m - 1)) trip_last += end_stage.forward[equal_sizes ? 0 : 1];
      }
      ++stats_.prefix_sweeps;
      charge_sweep(j);
      // The chains: one update per group for each forward of stage j.
      if (paced) stats_.steps += m * steady_paces_.size() / kIterationSweepTasksPerStep;
      bound = std::max(bound, sweep_->run_prefix(durations_, j, trip_first, trip_last,
                                                 paced ? &pacing : nullptr));
      if (bound >= limit) continue;
    }
    if (prefix_ && prefix_pays(j)) {
      const double programme = counted_prefix_bound(j, b, b, limit, true);
      if (programme >= limit) continue;
      bound = std::max(bound, programme);
    }
    const std::uint64_t before_children = stats_.steps;
    search(j + 1, b, next_arrive, next_drain, onward, bound, objective);
    if (prefix_depths_ != nullptr) {
      ++(*prefix_depths_)[j].subtrees;
      (*prefix_depths_)[j].subtree_steps += stats_.steps - before_children;
    }
    if (out_of_budget_) return;  // resume_ holds where the child stopped
  }
}

// The last end b of stage j from a in [first, last] that the loop of search() would examine
// before its own breaks (the busy bound and the nested memory bound, which only grow with b):
// where the runs of prefix_alive() stop.
int PlanSearch::last_open_end(int j, int a, int first, int last, double arrive,
                              double drain) const {
  const double limit = threshold(Objective::Time);
  auto open = [&](int b) {
    return arrive + busy(j, a, b) - tail(j, a, b) + drain < limit && fits_nested(j, a, b);
  };
  if (first > last || !open(first)) return first - 1;
  return last_holding(first, last, open);
}

// The runs of ends of stage j in [lo, hi] that the prefix programme does not rule out, in
// order: a run is ruled out whole when the programme with the stage's end anywhere in it is at
// the threshold, else halved, down to runs of kPrefixRunLeast / 2 ends or fewer, which the
// search examines end by end. Where every end of a parent's is ruled out, a few programmes do
// what one per end would.
void PlanSearch::prefix_alive(int j, int lo, int hi, std::vector<std::pair<int, int>>& alive) {
  const double limit = threshold(Objective::Time);
  if (counted_prefix_bound(j, lo, hi, limit, false) >= limit) return;
  if (hi - lo + 1 <= kPrefixRunLeast / 2) {
    if (!alive.empty() && alive.back().second + 1 == lo) {
      alive.back().second = hi;
    } else {
      alive.emplace_back(lo, hi);
    }
    return;
  }
  const int mid = lo + (hi - lo) / 2;
  prefix_alive(j, lo, mid, alive);
  prefix_alive(j, mid + 1, hi, alive);
}

double PlanSearch::counted_prefix_bound(int j, int lo, int hi, double limit, bool single) {
  PrefixDepth& depth = (*prefix_depths_)[j];
  const std::uint64_t before = stats_.steps;
  const double value = prefix_programme_bound(j, lo, hi, limit);
  const std::uint64_t spent = stats_.steps - before;
  ++depth.calls;
  depth.steps += spent;
  if (depth.trial) depth.trial_steps += spent;
  if (single) ++depth.single_calls;
  if (value >= limit) {
    depth.pruned += static_cast<std::uint64_t>(hi - lo + 1);  // a run counts each of its ends
    if (single) ++depth.single_pruned;
  }
  return value;
}

// Whether the prefix programme is worth its cost at stage j: what it has ruled out there, times
// what a prefix it lets through costs the search below it, against what it costs. Until a stage
// has that measure (its first calls), and for one call in 32 where it does not pay, so that the
// measure follows the search (its threshold falls, its prefixes change), it runs while such
// trials have spent less than kPrefixTrialShare of the configuration's steps: a programme of
// many classes costs thousands of steps, more than most configurations' whole searches.
bool PlanSearch::prefix_pays(int j) {
  if (!prefix_allowed_) return false;
  std::vector<PrefixDepth>& depths = *prefix_depths_;
  PrefixDepth& d = depths[j];
  constexpr std::uint64_t kFirstCalls = 4, kSampleEvery = 32;
  auto may_try = [&] {
    std::uint64_t spent = 0;
    for (const PrefixDepth& other : depths) spent += other.trial_steps;
    const double steps =
        static_cast<double>(prefix_steps_before_ + static_cast<std::int64_t>(stats_.steps));
    d.trial = static_cast<double>(spent) <= kPrefixTrialShare * steps;
    return d.trial;
  };
  if (d.calls < kFirstCalls || d.subtrees == 0) return may_try();
  const double saved = static_cast<double>(d.pruned) / static_cast<double>(d.calls) *
                       static_cast<double>(d.subtree_steps) / static_cast<double>(d.subtrees);
  d.trial = false;
  if (saved > 2 * static_cast<double>(d.steps) / static_cast<double>(d.calls)) return true;
  return ++d.skipped % kSampleEvery == 0 && may_try();
}

// The relaxed root's programme with stages 0..j held at their work (balance_, stage j ending
// between lo and hi): every row bounds every balance, and every completion of such a prefix
// meets the constraints (each class's work before an end only grows with it), so the least
// largest row bounds each. Each stage's programme is its parent's
// (the stage before's, or the root's) with two constraints per class; while the parent stays
// as it is, a sibling moves only their limits and solves on from the last basis, and a stage
// whose programme was not asked for at its own node is brought up to date here, lazily.
double PlanSearch::prefix_programme_bound(int j, int lo, int hi, double limit) {
  if (prefix_levels_.size() < static_cast<std::size_t>(stages_)) prefix_levels_.resize(stages_);
  const int n_classes = static_cast<int>(prefix_->before.size());
  // Loosened by a billionth of the work, so that rounding cannot cut off the prefix itself.
  const double slack = 1e-9 * work_[layers_];
  std::uint64_t cells = 0;  // tableau cells copied or pivoted, for the budget
  const std::uint64_t rows_cells = static_cast<std::uint64_t>(n_classes * stages_ + 1) *
                                   static_cast<std::uint64_t>(n_classes * stages_ + 1);
  for (int k = 0, end = 0; k <= j; ++k) {
    end += k == j ? 0 : balance_[k];
    const int from = k == j ? lo : end, to = k == j ? hi : end;
    PrefixLevel& level = prefix_levels_[k];
    MinMaxShareProgramme& p = level.programme;
    const std::uint64_t parent_version =
        k == 0 ? prefix_root_version_ : prefix_levels_[k - 1].version;
    if (level.parent_version != parent_version) {
      p = k == 0 ? *prefix_->root : prefix_levels_[k - 1].programme;
      // The copy, and each constraint's column in the current basis (rows x rows).
      cells += p.tableau_cells() + 2 * static_cast<std::uint64_t>(n_classes) * rows_cells;
      const std::uint64_t added = p.pivot_cells();
      level.parent_version = parent_version;
      level.first_constraint = p.constraints();
      for (int c = 0; c < n_classes; ++c) {
        std::vector<double> a(static_cast<std::size_t>(n_classes) * stages_, 0.0);
        for (int s = 0; s <= k; ++s) a[c * stages_ + s] = 1.0;
        p.add_constraint(a, prefix_->before[c][from] - slack);
        for (double& v : a) v = -v;
        p.add_constraint(a, -prefix_->before[c][to] - slack);
      }
      cells += p.pivot_cells() - added;
    } else if (level.lo != from || level.hi != to) {
      const std::uint64_t moved = p.pivot_cells();
      for (int c = 0; c < n_classes; ++c) {
        p.set_constraint_limit(level.first_constraint + 2 * c, prefix_->before[c][from] - slack);
        p.set_constraint_limit(level.first_constraint + 2 * c + 1, -prefix_->before[c][to] - slack);
      }
      cells += p.pivot_cells() - moved;
    } else {
      continue;  // as it was
    }
    level.lo = from;
    level.hi = to;
    level.version = ++prefix_versions_;
  }
  MinMaxShareProgramme& p = prefix_levels_[j].programme;
  const std::uint64_t solved = p.pivot_cells();
  std::vector<double> shares;
  double value = p.solve(&shares, nullptr, limit) * (1.0 - 1e-12);
  // Cutting planes, as at the root: the longest paths of the shares' own plan, which holds
  // the prefix. The root's paths are those of its own shares; with the prefix held the shares
  // move, and the paths with them (on bench's 1,000 x 16 profile of unequal devices, the
  // prefixes of four stages that the root's rows let through all fell to these). Only the
  // path of the least ratios, not the root's second one of the mean ratios: that one doubled
  // the sweeps and filled the rows, and the unequal case's proof took 25.8 M steps instead of
  // 17.3 M (the capped lognormal one 13.4 M instead of 11.2 M).
  // A stage's programme keeps the rows its siblings added, up to kPrefixRowsMost beyond the
  // root's: each column costs every later pivot and copy.
  const std::size_t most_functions = prefix_->root->functions() + kPrefixRowsMost;
  RootPaths& paths = *prefix_->paths;
  PrefixDepth& depth = (*prefix_depths_)[j];
  const bool cuts = value < limit && p.functions() < most_functions && depth.cut_due();
  for (int round = 0;
       cuts && round < kPrefixRounds && value < limit && p.functions() < most_functions; ++round) {
    double a = 0.0;
    std::vector<double> row;
    const std::size_t priced = paths.joint.size();
    const double at = path_row(paths, shares, false, a, row);
    // The sweep, and each new count vector's walk over the layers.
    stats_.steps += sweep_->task_count() / kIterationSweepTasksPerStep +
                    (paths.joint.size() - priced) * static_cast<std::uint64_t>(layers_) / 8;
    ++depth.cut_sweeps;
    if (!(at > value * (1.0 + 1e-9))) break;
    ++depth.cut_rows;
    p.add(a, row);
    cells += rows_cells;  // the new column in the current basis
    value = std::max(value, p.solve(&shares, nullptr, limit) * (1.0 - 1e-12));
  }
  cells += p.pivot_cells() - solved;
  stats_.steps += cells / kPivotCellsPerStep;
  ++stats_.prefix_programmes;
  return value;
}

void PlanSearch::search_around_best(std::uint64_t step_limit) {
  for (double centred = kInf; config_best_ < centred;) {
    centred = config_best_;
    if (!search_around(config_best_candidate_.plan.balance, kAroundBestRadius, step_limit)) break;
  }
}

bool PlanSearch::search_around(const std::vector<int>& centre, int radius,
                               std::uint64_t step_limit) {
  window_.assign(stages_, {0, 0});
  for (int k = 0, end = 0; k + 1 < stages_; ++k) {
    end += centre[k];
    window_[k] = {end - radius, end + radius};
  }
  const std::vector<int> kept_resume = std::exchange(resume_, std::vector<int>(stages_, 0));
  const bool kept_resuming = std::exchange(resuming_, false);
  const std::uint64_t kept_limit = std::exchange(step_limit_, step_limit);
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
  build_trip_tables(threshold(Objective::Time));
  search(0, 0, 0.0, 0.0, {}, 0.0, Objective::Time);
  const bool finished = !out_of_budget_;
  out_of_budget_ = false;
  prefix_depths_ = kept_depths;
  window_.clear();
  resume_ = kept_resume;
  resuming_ = kept_resuming;
  step_limit_ = kept_limit;
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
void PlanSearch::build_trip_tables(double limit) {
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
