// Lower bounds on single-stage balances (one stage per device, GPipe and 1F1B): per stage, per
// suffix of stages (the tables the search prunes with), and of the whole configuration.

#include <algorithm>
#include <cmath>

#include "sim/planner/single_stage_search.hpp"

namespace pipetune::planning {

namespace {

// Min-max over the ways to give layers [x, L) to the last m stages, each at least one layer:
// table[m][x], exact for costs that grow with a block's end and shrink as its start moves right.
// It is min_max_prefix_table() read backwards: layer l becomes L - l and stage j becomes S-1-j, so
// a suffix over the last m stages is a prefix over the first m. Exact matters: the search prunes
// on these as lower bounds.
template <typename Cost>
void min_max_suffix(int stages, int layers, std::vector<std::vector<double>>& table, Cost cost) {
  const MinMaxTable reversed = min_max_prefix_table(layers, stages, [&](int j, int begin, int end) {
    return cost(stages - 1 - j, layers - end, layers - begin);
  });
  table.assign(stages + 1, std::vector<double>(layers + 1, kInf));
  for (int m = 1; m <= stages; ++m) {
    for (int x = 0; x <= layers; ++x) table[m][x] = reversed.best[m - 1][layers - x];
  }
}

// floors[m][x]: the least table[m][y] over y <= x. With devices of different speeds a shorter
// suffix can cost more than a longer one (the slow device may have to take a heavy layer), so
// table[m][x] need not fall as x grows; its floor does, and stays a lower bound.
void running_min(const std::vector<std::vector<double>>& table,
                 std::vector<std::vector<double>>& floors) {
  floors = table;
  for (auto& row : floors) {
    for (std::size_t x = 1; x < row.size(); ++x) row[x] = std::min(row[x], row[x - 1]);
  }
}

}  // namespace

// Stage j's work after its backward of the micro-batch whose gradient the bounds follow back
// to stage 0: nothing for GPipe (micro-batch 0 ends it) and for 1F1B with equal micro-batches
// (the last one ends it); with a smaller last micro-batch, 1F1B follows the last full-size one,
// and the last one's backward (and recompute) still follow; on the last stage, whose warm-up is
// one forward, so does the last one's forward (counted at its most, so the bound stays one).
double SingleStageSearch::tail(int j, int a, int b) const {
  const Config& c = *config_;
  const int m = c.micro_batches();
  if (c.schedule == ScheduleKind::GPipe || m < 2 || c.sizes.back() == c.sizes.front()) return 0.0;
  return backward(*last_size_, j, a, b) +
         (c.recomputed(m - 1) ? forward(*last_size_, j, a, b) : 0.0) +
         (j + 1 == stages_ ? most_forward(*last_size_, j, a, b) : 0.0);
}

// The most of stage j's own work that can run while a backward of stage j waits for a
// micro-batch's pass through the later stages and back (`after_`). The waiting backward is that
// of p, the last micro-batch of full size (M - 1, or M - 2 when tensor.chunk left a smaller last
// one); its pass starts when the stage's forward of the last micro-batch (GPipe) or of p (1F1B)
// ends. In between, the stage's programme holds:
//   GPipe: the last micro-batch's recompute and backward (if p < M - 1) and p's recompute;
//   1F1B: up to w - 1 cool-down backwards with their recomputes, the last forward (if
//   p < M - 1) and p's recompute, w = min(M, K - j) being the warm-up count.
// 1F1B's first backward (micro-batch 0) also waits for micro-batch 0's pass (the same per-layer
// weights), which the warm-up forwards and 0's recompute can fill; the smaller filler gives the
// larger bound, valid either way.
double SingleStageSearch::pass_filler(int j, int a, int b) const {
  const Config& c = *config_;
  const int m = c.micro_batches();
  const bool uneven = m >= 2 && c.sizes.back() != c.sizes.front();
  const int p = uneven ? m - 2 : m - 1;
  const SizeCosts& f = *first_size_;
  const SizeCosts& l = *last_size_;
  const double recompute_p = c.recomputed(p) ? forward(f, j, a, b) : 0.0;
  if (c.schedule == ScheduleKind::GPipe) {
    const double last =
        uneven ? (c.recomputed(m - 1) ? forward(l, j, a, b) : 0.0) + backward(l, j, a, b) : 0.0;
    return last + recompute_p;
  }
  const int warmup = std::min(m, stages_ - j);
  const double recompute_0 = c.recomputed(0) ? forward(f, j, a, b) : 0.0;
  const double cooldown = std::min(warmup - 1, p) * (backward(f, j, a, b) + recompute_0) +
                          (uneven ? most_forward(l, j, a, b) : 0.0) + recompute_p;
  const double warm = std::max(0, std::min(warmup - 1, m - 2)) * most_forward(f, j, a, b) +
                      (warmup == m && m >= 2 ? most_forward(l, j, a, b) : 0.0) + recompute_0;
  return std::min(cooldown, warm);
}

// time_bound() with the before-pass counted from layer 0 and copies left out, for the dynamic
// programme over suffixes. It grows with b and shrinks as a grows, as the programme needs: it is
// the larger of busy and busy + (after - filler), and each grows with b and shrinks as a grows
// because per layer a stage's work (every micro-batch's forward and backward, its recomputes)
// is at least one pass plus the filler plus the tail, which never count more of a kind of work
// than the stage does.
// `recompute`: what the round trips also wait for on the last stage (see recompute_root()).
double SingleStageSearch::chained_cost(int j, int a, int b, double recompute) const {
  const double own = before_[a] + busy(j, a, b) - tail(j, a, b);
  if (j + 1 == stages_) return own;
  return own + std::max(0.0, after_[b] + recompute - pass_filler(j, a, b));
}

// Bounds that hold for every balance of a configuration: no device can do more than its share
// of the work faster than all devices together, some stage holds the heaviest layer, and one
// micro-batch must go forward and one backward through every layer.
double SingleStageSearch::balance_free_bound() const {
  const double tasks = overhead_ * tasks_per_stage_;
  double heaviest = 0.0;
  for (int l = 0; l < layers_; ++l) heaviest = std::max(heaviest, work_[l + 1] - work_[l]);
  return std::max({work_[layers_] / context_.total_speed + tasks,
                   heaviest / context_.max_speed + tasks,
                   before_[layers_] + 2.0 * overhead_ * stages_});
}

// The least possible largest stage cost, allowing empty stages (so a lower bound on the
// min-max with non-empty ones): binary search on the limit with a greedy fill, which is exact
// for costs that grow with a block's end and shrink as its start moves right.
template <typename Cost>
double SingleStageSearch::greedy_bound(Cost cost) const {
  auto fits = [&](double limit) {
    int a = 0;
    for (int j = 0; j < stages_ && a < layers_; ++j) {
      // The furthest end that fits (cost grows with it).
      a = last_holding(a, layers_, [&](int end) { return cost(j, a, end) <= limit; });
    }
    return a == layers_;
  };
  double lo = 0.0, hi = 0.0;
  for (int j = 0; j < stages_; ++j) hi = std::max(hi, cost(j, 0, layers_));
  for (int iteration = 0; iteration < 30 && hi - lo > 1e-6 * hi; ++iteration) {
    const double mid = 0.5 * (lo + hi);
    (fits(mid) ? hi : lo) = mid;
  }
  return lo;
}

double SingleStageSearch::cheap_bound() const {
  return std::max({balance_free_bound(),
                   greedy_bound([this](int j, int a, int b) { return busy(j, a, b); }),
                   greedy_bound([this](int j, int a, int b) { return chained_cost(j, a, b); }),
                   greedy_bound([this](int j, int a, int b) { return wait_cost(j, a, b); })});
}

// Two bounds on the stages not yet placed, for every suffix of layers:
//   suffix_[m][x]: the least busiest-stage time of [x, L) over the last m stages;
//   chained_[m][x]: the least largest chained_cost(); the search subtracts the part of the
//   before-pass that lies in stages it has already placed.
void SingleStageSearch::build_suffix_tables() {
  min_max_suffix(stages_, layers_, suffix_, [this](int j, int a, int b) { return busy(j, a, b); });
  min_max_suffix(stages_, layers_, chained_,
                 [this](int j, int a, int b) { return chained_cost(j, a, b); });
  // A stage that cannot fit its device is ruled out here too (infinitely slow; fit_end_, which
  // the caller computed): the nested memory bound only grows with the stage, so the table keeps
  // the monotony its search needs.
  // With caps, the first incumbent's table: the busiest stage among those passing the nested
  // memory bound, so that the first plan has a chance to fit.
  fitting_.clear();
  if (context_.capped()) {
    min_max_suffix(stages_, layers_, fitting_, [this](int j, int a, int b) {
      return fits_nested(j, a, b) ? busy(j, a, b) : kInf;
    });
  }
  min_max_suffix(stages_, layers_, waits_, [this](int j, int a, int b) {
    if (!fits_nested(j, a, b)) return kInf;
    return wait_cost(j, a, b);
  });
  steady_.clear();
  steady_floor_.clear();
  if (config_->schedule == ScheduleKind::OneFOneB) {
    min_max_suffix(stages_, layers_, steady_, [this](int j, int a, int b) {
      return fits_nested(j, a, b) ? steady_work(j, a, b) : kInf;
    });
    running_min(steady_, steady_floor_);
  }
  running_min(suffix_, suffix_floor_);
  running_min(chained_, chained_floor_);
  running_min(waits_, waits_floor_);
}

// What 1F1B's stage j = [a, b) runs between two backwards of full-size micro-batches in its
// steady phase: a forward (without autograd where recomputed, counted at its least), the
// recompute if any, the backward.
double SingleStageSearch::steady_work(int j, int a, int b) const {
  const SizeCosts& f = *first_size_;
  return least_forward(f, j, a, b) + (config_->recomputed(0) ? forward(f, j, a, b) : 0.0) +
         backward(f, j, a, b);
}

// The busy-balanced plan fitting ever smaller shares of the caps, until one fits the simulator
// (the nested bound leaves out what crosses a stage's ends, so it can pass where the plan does
// not). Only a first incumbent: the search proper keeps the true caps.
void SingleStageSearch::evaluate_leaner_incumbents() {
  const std::vector<std::vector<int>> true_ends = fit_end_;
  for (double share : {0.9, 0.8, 0.7, 0.6, 0.5}) {
    if (config_best_ < kInf) break;
    fit_end_ = fit_ends(share);
    min_max_suffix(stages_, layers_, fitting_, [this](int j, int a, int b) {
      return fits_nested(j, a, b) ? busy(j, a, b) : kInf;
    });
    if (!(fitting_[stages_][0] < kInf)) break;
    const std::vector<int> balance = busy_balanced();
    for (int j = 0, a = 0; j < stages_; a += balance[j++])
      durations_[j] = durations(j, a, a + balance[j]);
    evaluate(balance, Objective::Time);
  }
  fit_end_ = true_ends;
}

// The balance with the least busiest stage, read off the suffix table (with caps, among the
// stages that pass the nested memory bound, when some balance does).
std::vector<int> SingleStageSearch::busy_balanced() const {
  const auto& table = !fitting_.empty() && fitting_[stages_][0] < kInf ? fitting_ : suffix_;
  const bool capped = &table == &fitting_;
  std::vector<int> balance;
  int a = 0;
  for (int j = 0; j < stages_; ++j) {
    const int m = stages_ - j;
    int best_b = layers_;
    if (m > 1) {
      double best = kInf;
      for (int b = a + 1; b <= layers_ - (m - 1); ++b) {
        if (capped && !fits_nested(j, a, b)) continue;
        const double value = std::max(busy(j, a, b), table[m - 1][b]);
        if (value < best) best = value, best_b = b;
      }
    }
    balance.push_back(best_b - a);
    a = best_b;
  }
  return balance;
}

// A lower bound on the simulated iteration time of any plan whose stage j is [a, b), given the
// time micro-batch 0 needs to reach stage j (`arrive`) and the time a full-size micro-batch's
// gradient needs to get back from stage j to stage 0 (`drain`).
double SingleStageSearch::time_bound(int j, int a, int b, double arrive, double drain) const {
  const double base = arrive + busy(j, a, b) - tail(j, a, b) + drain;
  if (j + 1 == stages_) return base;
  // The pass through the later stages and back (with its task overheads and the two copies
  // across this stage's boundary), less what of the stage's own work can fill the wait.
  const SizeCosts& onward = config_->schedule == ScheduleKind::GPipe ? *last_size_ : *first_size_;
  // Which size goes which way differs by schedule; the gradient may carry no bytes (a frozen
  // stem), so the lesser of the two ways round.
  const double copies = std::min(copy(onward, j, b) + gradient_copy(*first_size_, j, b),
                                 copy(*first_size_, j, b) + gradient_copy(onward, j, b));
  const double pass = after_[b] + 2.0 * overhead_ * (stages_ - 1 - j) + copies;
  return base + std::max(0.0, pass - pass_filler(j, a, b));
}

StageDurations SingleStageSearch::durations(int j, int a, int b, bool with_launches) const {
  return stage_durations(*first_size_, *last_size_, a, b, speed_[j], overhead_, context_.link[j],
                         j > 0 ? context_.link[j - 1] : nullptr, with_launches);
}

// A lower bound on the simulated iteration time of any plan whose stage j is [a, b), from the
// stage's exact durations `d` and the exact passes through the stages before it (`before`):
// micro-batch 0's arrival and the ways back to stage 0 of a full-size and of the last
// micro-batch. Stage j runs from its first forward to its backward of a micro-batch q, busy all
// along but for the waits of its programme, and q's gradient must then go back to stage 0
// (GPipe: q = 0, its last backward; 1F1B: q = M - 1, and with a smaller last micro-batch also
// the last full-size one, M - 2). A backward of micro-batch i waits for i's round trip through
// the later stages (each of its forwards and backwards, at the fastest speed there, the
// latencies of their links, and the two copies across this boundary), during which the stage
// can only run what its programme puts in between:
//   GPipe: between the last forward and the first backward (of M - 1), that one's recompute;
//   with a smaller last micro-batch also M - 2's wait, filled by M - 1's forward, recompute and
//   backward and M - 2's recompute;
//   1F1B (w = min(M, K - j) warm-up forwards): between 0's forward and backward, forwards
//   1..w-1 and 0's recompute; between q's forward and backward, backwards q-w+1..q-1 with
//   their recomputes, q's recompute and forwards q+1..q+w-1. When q >= w the two intervals do
//   not overlap (0's backward comes before q's forward), so both waits count.
double SingleStageSearch::wait_bound(int j, int a, int b, const StageDurations& d,
                                     const Passes& before) const {
  if (j + 1 == stages_) {
    const double own = before.arrive + busy(j, a, b);
    if (config_->schedule == ScheduleKind::GPipe) return own + before.drain_full;
    double bound = own + before.drain_last;
    const int m = config_->micro_batches();
    if (m >= 2 && config_->sizes.back() != config_->sizes.front()) {
      bound = std::max(bound, own - waits(j, d, m - 2, 0.0, 0.0).tail + before.drain_full);
    }
    return bound;
  }
  const double onward = 2.0 * overhead_ * (stages_ - 1 - j) + after_latency_[j];
  const double trip_first = least_trip(pass_first_, trip_first_, j, b) + onward +
                            copy(*first_size_, j, b) + gradient_copy(*first_size_, j, b);
  const double trip_last = least_trip(pass_last_, trip_last_, j, b) + onward +
                           copy(*last_size_, j, b) + gradient_copy(*last_size_, j, b);
  const int m = config_->micro_batches();
  const double own = before.arrive + busy(j, a, b);
  if (config_->schedule == ScheduleKind::GPipe) {
    return own + waits(j, d, m - 1, trip_first, trip_last).idle + before.drain_full;
  }
  const Waits last = waits(j, d, m - 1, trip_first, trip_last);
  double bound = own + last.idle + before.drain_last;
  if (m >= 2 && config_->sizes.back() != config_->sizes.front()) {
    // Micro-batch M - 2 has the first size and mode (M - 2 and 0 are both recomputed or not).
    const Waits full = waits(j, d, m - 2, trip_first, trip_first);
    bound = std::max(bound, own - full.tail + full.idle + before.drain_full);
  }
  return bound;
}

// What stage j's programme can do while its backward of micro-batch q (GPipe: the first
// backward, q = M - 1) waits: one or two waits, each for a round trip (micro-batch 0's or q's)
// and filled by part of the stage's own work; the idle time is the sum of the waits' excesses
// when they cannot overlap, else the larger; and the work after that backward.
SingleStageSearch::WaitTerms SingleStageSearch::wait_terms(int j, const StageDurations& d,
                                                           int q) const {
  const Config& c = *config_;
  const int m = c.micro_batches();
  const bool last_differs = c.sizes.back() != c.sizes.front();
  const int stop = recompute_stop(c);
  // Sums of the stage's durations over micro-batches [p, r): forwards as run (no autograd when
  // recomputed), recomputes, backwards. Only micro-batch M - 1 may have the last size.
  struct Sums {
    double forward = 0.0, recompute = 0.0, backward = 0.0;
  };
  auto sums = [&](int p, int r) {
    Sums out;
    r = std::min(r, m);
    p = std::max(p, 0);
    if (r <= p) return out;
    const int last_in = last_differs && p <= m - 1 && m - 1 < r ? 1 : 0;
    const int last_recomputed = last_in && m - 1 < stop ? 1 : 0;
    const int recomputed = std::max(0, std::min(r, stop) - p) - last_recomputed;  // common size
    const int plain = r - p - last_in - recomputed;
    out.forward = plain * d.forward[0] + recomputed * d.forward_nograd[0] +
                  (last_in ? (last_recomputed ? d.forward_nograd[1] : d.forward[1]) : 0.0);
    out.recompute = recomputed * d.forward[0] + (last_recomputed ? d.forward[1] : 0.0);
    out.backward = (r - p - last_in) * d.backward[0] + (last_in ? d.backward[1] : 0.0);
    return out;
  };
  WaitTerms out;
  if (c.schedule == ScheduleKind::GPipe) {
    const Sums last = sums(m - 1, m);
    out.wait[out.count++] = {false, last.recompute};
    if (last_differs && m >= 3) {
      // The smaller last micro-batch comes back sooner; the full-size one before it (whose trip
      // is micro-batch 0's) may come later, with only the last one's work to fill its wait. (M
      // >= 3 keeps it apart from micro-batch 0's forward and backward for the suffix table.)
      out.wait[out.count++] = {
          true, last.forward + last.recompute + last.backward + sums(m - 2, m - 1).recompute};
    }
    return out;
  }
  const int warmup = std::min(m, stages_ - j);
  const Sums after = sums(q + 1, m);
  out.tail = after.backward + after.recompute + sums(q + warmup, m).forward;
  out.wait[out.count++] = {true, sums(1, warmup).forward + sums(0, 1).recompute};
  if (q == 0) return out;
  const Sums cooldown = sums(q - warmup + 1, q);
  out.wait[out.count++] = {false, cooldown.backward + cooldown.recompute +
                                      sums(q, q + 1).recompute + sums(q + 1, q + warmup).forward};
  out.both = q >= warmup;
  return out;
}

// The least idle time of stage j between its first forward and its backward of micro-batch q,
// given the round trips of micro-batch 0 and of q from the end of its forward to the start of
// its backward (see wait_terms()); and the work after that backward.
SingleStageSearch::Waits SingleStageSearch::waits(int j, const StageDurations& d, int q,
                                                  double trip_first, double trip_q) const {
  const WaitTerms terms = wait_terms(j, d, q);
  Waits out;
  out.tail = terms.tail;
  for (int t = 0; t < terms.count; ++t) {
    const auto& w = terms.wait[t];
    const double excess = std::max(0.0, (w.first_trip ? trip_first : trip_q) - w.fill);
    out.idle = terms.both ? out.idle + excess : std::max(out.idle, excess);
  }
  return out;
}

// wait_bound() for the dynamic programme over suffixes, following q = followed_: the passes
// before the stage counted from layer 0 at the fastest speed (the search swaps the part before
// its placed stages for the exact one), the round trips at the fastest speed and without the
// copies across the boundary. It grows with b and shrinks as a grows, as the programme needs:
// per layer, the stage's work before q's backward holds micro-batch 0's forward, q's backward,
// both round trips' forward and backward and every task the waits subtract, each at most once,
// at a speed no faster than the fastest; and the copies, which need not grow with b, are left
// out.
// `recompute_first`, `recompute_q`: what the two round trips also wait for on the last stage
// (see recompute_root()).
double SingleStageSearch::wait_cost(int j, int a, int b, double recompute_first,
                                    double recompute_q) const {
  const double own = wait_before_[a] + busy(j, a, b);
  const StageDurations d = durations(j, a, b, /*with_launches=*/false);
  const double onward = 2.0 * overhead_ * (stages_ - 1 - j) + after_latency_[j];
  const bool last = j + 1 == stages_;
  const double trip_first =
      last ? 0.0 : pass_first_[b] / context_.max_speed + onward + recompute_first;
  const double trip_q =
      followed_ == config_->micro_batches() - 1
          ? (last ? 0.0 : pass_last_[b] / context_.max_speed + onward + recompute_q)
          : (last ? 0.0 : trip_first - recompute_first + recompute_q);
  const Waits w = waits(j, d, followed_, trip_first, trip_q);
  return own - w.tail + (last ? 0.0 : w.idle);
}

}  // namespace pipetune::planning
