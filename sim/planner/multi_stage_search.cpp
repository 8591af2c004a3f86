// Multi-stage balances (interleaved, zero bubble, looped, DualPipeV): first plans, local search
// timed by the task graph's longest path, and enumeration under a sound bound and the caps.

#include "sim/planner/multi_stage_search.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "sim/partition.hpp"
#include "sim/planner/layer_device_bound.hpp"
#include "sim/planner/multi_stage_balance_bound.hpp"

namespace pipetune::planning {

namespace {

// The balance whose stages end at `ends`, then at `b`, the last one taking the rest of `layers`.
std::vector<int> balance_of_ends(const std::vector<int>& ends, int b, int layers) {
  std::vector<int> balance;
  int from = 0;
  for (int end : ends) {
    balance.push_back(end - from);
    from = end;
  }
  balance.push_back(b - from);
  balance.push_back(layers - b);
  return balance;
}

}  // namespace

MultiStageSearch::MultiStageSearch(SearchContext& context) : SearchPart(context) {}

// Multi-stage schedules (interleaved-1f1b, looped-bfs, interleaved-zb, zbv, dualpipev): v x D
// stages, device stage_rank() running several. The single-stage bounds do not hold for their
// programmes, so candidates are timed by simulating and the configuration's bound is balance-free
// and sound:
// - each device runs at least a forward and a backward (zero bubble: its I half) task per
//   micro-batch and stage, v x 2M tasks, and together the devices do every layer's least work
//   (forward with or without autograd, backward or its I + W halves, recomputes left out): the
//   busiest does at least the total over the sum of speeds;
// - some device runs the heaviest layer, for every micro-batch;
// - micro-batch 0 goes forward through every stage and its gradient (zero bubble: the I halves)
//   back, at best at the fastest speed, and crosses each boundary between stages on two
//   devices twice (an activation, then a gradient of as many bytes); the boundaries end at
//   distinct layers, so their copies cost at least the least copies of as many layers
//   (`at_the_end`). With few layers a stage and slow links these copies are much of a round
//   trip: on 40 layers of 32 stages over 1 GB/s links, a random instance's bound rose from a
//   third of its best plans to a half with them;
// - one device runs each layer for every micro-batch, between the head and the tail of its
//   round trips (layer_device_bound(), `at_the_end`).
// The search leaves out what `at_the_end` adds: raised during it, these bounds reorder the
// configurations and move the budget (see run()).
double MultiStageSearch::bound(const Config& c, bool at_the_end) const {
  const int v = c.stages_per_device, m = c.micro_batches(), stages = context_.stage_count(c);
  const bool split = splits_backward(c.schedule);
  std::vector<double> layer_work(layers_, 0.0);
  for (std::int64_t size : c.sizes) {
    const SizeCosts& s = context_.costs.at(size);
    for (int k = 0; k < layers_; ++k) {
      layer_work[k] += s.least_forward_ms(k) + s.least_backward_ms(k);
    }
  }
  const SizeCosts& first = context_.costs.at(c.sizes.front());
  double chain = 0.0;
  for (int k = 0; k < layers_; ++k) {
    chain += first.least_forward_ms(k) +
             (split ? first.least_input_backward_ms(k) : first.backward_ms[k]);
  }
  const double total = std::accumulate(layer_work.begin(), layer_work.end(), 0.0);
  const double heaviest = *std::max_element(layer_work.begin(), layer_work.end());
  const double tasks = overhead_ * 2.0 * v * m;
  return std::max(
      {total / context_.total_speed + tasks, heaviest / context_.max_speed + tasks,
       chain / context_.max_speed + overhead_ * 2.0 * stages +
           (at_the_end ? (context_.costs.has_frozen() ? 1.0 : 2.0) * least_copies(c) : 0.0),
       at_the_end
           ? layer_device_bound(context_.costs, c.sizes, split, context_.max_speed, overhead_)
           : 0.0});
}

// The least one-way copy time of micro-batch 0 over the boundaries between stages on two
// devices, each at a layer of its own (bound()).
double MultiStageSearch::least_copies(const Config& c) const {
  const int v = c.stages_per_device, stages = context_.stage_count(c);
  std::vector<const Link*> links;  // the distinct links the crossings take, as the simulator's
  int crossings = 0;
  for (int t = 0; t + 1 < stages; ++t) {
    const int from = stage_rank(c.schedule, t, stages, v);
    const int to = stage_rank(c.schedule, t + 1, stages, v);
    if (from == to) continue;
    ++crossings;
    const Link* link = &context_.hardware.copy_link(from, to);
    if (std::find(links.begin(), links.end(), link) == links.end()) links.push_back(link);
  }
  if (crossings == 0 || layers_ < 2) return 0.0;
  const SizeCosts& first = context_.costs.at(c.sizes.front());
  std::vector<double> least(static_cast<std::size_t>(layers_ - 1), kInf);
  for (int k = 0; k + 1 < layers_; ++k) {
    for (const Link* link : links)
      least[k] = std::min(least[k], link->transfer_ms(static_cast<double>(first.output_bytes[k])));
  }
  const auto n = static_cast<std::ptrdiff_t>(std::min<std::size_t>(crossings, least.size()));
  std::nth_element(least.begin(), least.begin() + (n - 1), least.end());
  return std::accumulate(least.begin(), least.begin() + n, 0.0);
}

// e's MultiStagePeakBound with nothing placed: built (and charged) once per configuration,
// its programmes' moments collected from the schedule (building one for every use was a tenth
// of a capped every-schedule plan's time).
MultiStagePeakBound& MultiStageSearch::peak_bound(Entry& e) {
  const Config& c = *e.config;
  if (!e.peak) {
    context_.stats.steps +=
        static_cast<std::uint64_t>(3 * c.micro_batches() * context_.stage_count(c)) /
        kSweepTasksPerStep;
    e.peak = std::make_unique<MultiStagePeakBound>(
        context_.costs, c.sizes, c.schedule, c.checkpoint, stages_, c.stages_per_device,
        context_.options.optimizer_state_factor,
        stage_inputs_own(context_.stage_devices_of(c), context_.hardware));
  } else {
    e.peak->unplace_all();
  }
  return *e.peak;
}

std::vector<double> MultiStageSearch::equal_time_shares(const Config& c) const {
  const int v = c.stages_per_device, stages = context_.stage_count(c);
  std::vector<double> share(stages);
  double speeds = 0.0;
  for (int s = 0; s < stages; ++s)
    speeds += share[s] = speed_[stage_rank(c.schedule, s, stages, v)];
  for (double& x : share) x /= speeds;
  return share;
}

// Under caps, whether MultiStagePeakBound::may_fit() lets some balance of e's configuration keep
// every device within its cap (min-sum partitions and small master programmes; false rules the
// configuration out).
bool MultiStageSearch::fits_some_balance(Entry& e) {
  if (!context_.capped() || e.fit_checked) return true;
  e.fit_checked = true;
  MultiStagePeakBound& peak = peak_bound(e);
  return charged(peak, [&] { return peak.may_fit(context_.capacity); });
}

// Walks right from b, each stage after t ending as far as its device's bound allows with the
// stages placed so far and the other later ones empty (a stage may hold nothing). A stage's
// bound without its input only grows as it grows at either end, so in every completion that
// fits, each stage ends at most where the walk puts it: a walk short of the last layer proves
// that none fits. (With its input it need not: an earlier start may receive fewer bytes.)
bool MultiStageSearch::later_stages_may_fit(MultiStagePeakBound& peak, int t, int b) {
  const std::uint64_t cells = peak.level_cells();
  const int stages = peak.stages();
  int from = b;
  for (int s = t + 1; s < stages && from < layers_; ++s) {
    const std::int64_t cap = context_.capacity[peak.device_of(s)];
    if (cap <= 0) {  // no cap: this stage may take every layer left
      from = layers_;
      break;
    }
    // [from, fits) fits its cap (empty, it is only what the device holds anyway), [from, over)
    // does not; the bound only grows with the end.
    int fits = from, over = layers_ + 1;
    while (over - fits > 1) {
      const int mid = fits + (over - fits) / 2;
      if (peak.place(s, from, mid, /*with_input=*/false) > cap) {
        over = mid;
      } else {
        fits = mid;
      }
    }
    peak.unplace(s);
    from = fits;
  }
  context_.stats.steps += (peak.level_cells() - cells) / kLevelCellsPerStep;
  return from >= layers_;
}

// Under caps, whether some balance of e's configuration may both fit and beat `limit`:
// may_fit() over the devices' levels and the relaxed root's rows together. False closes the
// configuration: every fitting balance has a row, so its time, above `limit`.
bool MultiStageSearch::fits_fast_enough(Entry& e, double limit) {
  if (!context_.capped() || !e.time_rows || e.time_rows->constant.empty() || !(limit < kInf))
    return true;
  // Only with the root's rows complete: with fewer it rarely proves anything and cost the
  // capped 1,000-layer bench case the roots of a fifth of its configurations.
  if (!e.root_complete) return true;
  // Asked again only once the plan to beat has fallen a little.
  if (!(limit < e.fast_checked * (1.0 - 1e-3))) return true;
  e.fast_checked = limit;
  MultiStagePeakBound& peak = peak_bound(e);
  const bool may_fit =
      charged(peak, [&] { return peak.may_fit(context_.capacity, *e.time_rows, limit); });
  if (!may_fit) e.root = std::max(e.root, limit);
  return may_fit;
}

// Under caps, a start for the local search found by cheap proxies instead of simulations: from
// `balance`, moves of one stage end (by 1, 2, 4 or 8 layers) or of one stage as a block (by 1
// or 2), each taken when it lowers the devices' total excess of MultiStagePeakBound over
// `limit` (bytes, per device), or keeps it and lowers the largest of the relaxed root's rows (a
// lower bound on the time, near it around the root's model plans), until none does. A move
// changes two or three stages: their work per class and their devices' bounds are updated
// alone, so that a few thousand moves cost about as much as one simulation.
// proxy_descent()'s state: the stages' starts, the rows' values and each device's excess over
// its limit, updated move by move.
class MultiStageSearch::ProxyMoves {
 public:
  ProxyMoves(MultiStageSearch& search, MultiStagePeakBound& peak, const StageWorkRows& rows,
             const std::vector<int>& balance, const std::vector<double>& limit);
  // The ends of stages first, first + 1, ... become `to` (stages first .. first + to.size()
  // change): kept, and true, when that lowers the excess, or keeps it and lowers the time.
  bool try_move(int first, std::initializer_list<int> to);

  std::vector<int> start;  // per stage, and the layer count at the end

 private:
  MultiStageSearch& search_;
  MultiStagePeakBound& peak_;
  const StageWorkRows& rows_;
  const std::vector<double>& limit_;
  const int stages_, classes_;
  const std::size_t n_rows_;
  const std::vector<std::vector<double>> prefix_;
  std::vector<double> value_, excess_of_, moved_;
  double excess_ = 0.0, time_ = 0.0;
  std::vector<std::pair<int, double>> devices_;  // (device, its excess) after a move
};

MultiStageSearch::ProxyMoves::ProxyMoves(MultiStageSearch& search, MultiStagePeakBound& peak,
                                         const StageWorkRows& rows, const std::vector<int>& balance,
                                         const std::vector<double>& limit)
    : start(balance.size() + 1, 0),
      search_(search),
      peak_(peak),
      rows_(rows),
      limit_(limit),
      stages_(static_cast<int>(balance.size())),
      classes_(rows.classes),
      n_rows_(rows.constant.size()),
      prefix_(rows.class_prefix()),
      excess_of_(search.stages_, 0.0),
      moved_(n_rows_) {
  for (int t = 0; t < stages_; ++t) start[t + 1] = start[t] + balance[t];
  value_ = rows.values(balance);
  search.context_.stats.steps +=
      static_cast<std::uint64_t>(search.layers_ * classes_) / kSweepTasksPerStep +
      n_rows_ * static_cast<std::size_t>(stages_ * classes_) / kPivotCellsPerStep;
  peak.unplace_all();
  for (int t = 0; t < stages_; ++t) {
    const int r = peak.device_of(t);
    excess_of_[r] =
        std::max(0.0, static_cast<double>(peak.place(t, start[t], start[t + 1])) - limit[r]);
  }
  excess_ = std::accumulate(excess_of_.begin(), excess_of_.end(), 0.0);
  time_ = *std::max_element(value_.begin(), value_.end());
}

bool MultiStageSearch::ProxyMoves::try_move(int first, std::initializer_list<int> to) {
  const int changed = static_cast<int>(to.size()) + 1;
  std::array<int, 4> from{}, until{};  // the changed stages' new ranges
  for (int i = 0; i < changed; ++i) {
    from[i] = i == 0 ? start[first] : *(to.begin() + i - 1);
    until[i] = i + 1 < changed ? *(to.begin() + i) : start[first + changed];
  }
  std::copy(value_.begin(), value_.end(), moved_.begin());
  for (int i = 0; i < changed; ++i) {
    const int t = first + i;
    for (int x = 0; x < classes_; ++x) {
      const double delta = (prefix_[x][until[i]] - prefix_[x][from[i]]) -
                           (prefix_[x][start[t + 1]] - prefix_[x][start[t]]);
      if (delta == 0.0) continue;
      for (std::size_t row = 0; row < n_rows_; ++row)
        moved_[row] += rows_.slope[row][x * stages_ + t] * delta;
    }
  }
  // The rows' updates, copy and largest, and the devices' bounds (a few moments each).
  search_.context_.stats.steps +=
      1 + n_rows_ * static_cast<std::size_t>(classes_ * changed + 2) / kPivotCellsPerStep;
  // A device's bound as its last changed stage is placed counts every change on it.
  std::array<std::int64_t, 4> placed{};
  for (int i = 0; i < changed; ++i) placed[i] = peak_.place(first + i, from[i], until[i]);
  double new_excess = excess_;
  devices_.clear();
  for (int i = changed - 1; i >= 0; --i) {
    const int r = peak_.device_of(first + i);
    if (std::any_of(devices_.begin(), devices_.end(), [&](const auto& d) { return d.first == r; }))
      continue;
    const double x = std::max(0.0, static_cast<double>(placed[i]) - limit_[r]);
    new_excess += x - excess_of_[r];
    devices_.emplace_back(r, x);
  }
  const double new_time = *std::max_element(moved_.begin(), moved_.end());
  if (new_excess < excess_ - 0.5 || (!(new_excess > excess_) && new_time < time_ * (1.0 - 1e-12))) {
    for (int i = 0; i + 1 < changed; ++i) start[first + i + 1] = until[i];
    value_.swap(moved_);
    for (const auto& [r, x] : devices_) excess_of_[r] = x;
    excess_ = new_excess;
    time_ = new_time;
    return true;
  }
  for (int i = 0; i < changed; ++i) peak_.place(first + i, start[first + i], start[first + i + 1]);
  return false;
}

std::vector<int> MultiStageSearch::proxy_descent(MultiStagePeakBound& peak,
                                                 const StageWorkRows& rows,
                                                 std::vector<int> balance,
                                                 const std::vector<double>& limit) {
  const int stages = static_cast<int>(balance.size());
  ProxyMoves moves(*this, peak, rows, balance, limit);
  const std::vector<int>& start = moves.start;
  constexpr int kEndMoves[] = {1, -1, 2, -2, 4, -4, 8, -8};
  constexpr int kBlockMoves[] = {1, -1, 2, -2};
  const std::uint64_t limit_steps =
      context_.stats.steps + 4 * static_cast<std::uint64_t>(stages) * layers_;
  for (bool improved = true; improved && context_.stats.steps < limit_steps;) {
    improved = false;
    for (int t = 1; t < stages; ++t) {  // the end of stage t - 1
      for (int d : kEndMoves) {
        const int to = start[t] + d;
        if (to <= start[t - 1] || to >= start[t + 1]) continue;
        if (moves.try_move(t - 1, {to})) improved = true;
      }
    }
    for (int t = 1; t + 1 < stages; ++t) {  // stage t as a block
      for (int d : kBlockMoves) {
        const int a = start[t] + d, b = start[t + 1] + d;
        if (a <= start[t - 1] || b >= start[t + 2]) continue;
        if (moves.try_move(t - 1, {a, b})) improved = true;
      }
    }
  }
  for (int t = 0; t < stages; ++t) balance[t] = start[t + 1] - start[t];
  return balance;
}

// The min-max partition of the work on the stages' devices, then the relaxed root's rounded
// plans where they are better; under caps, then proxy_descent()'s start where it is better.
void MultiStageSearch::first_multi_stage_plans(Entry& e, const LayerWork& layer_work) {
  const Config& c = *e.config;
  const int v = c.stages_per_device, stages = context_.stage_count(c);
  const std::vector<double>& work = layer_work.prefix;
  std::vector<double> stage_speed(stages);  // looked up once: the partition asks O(K L log L) times
  for (int s = 0; s < stages; ++s) stage_speed[s] = speed_[stage_rank(c.schedule, s, stages, v)];
  // No split's bottleneck is below the heaviest layer on the fastest device or the work spread
  // over every stage's speed: where bisection starts.
  double heaviest = 0.0;
  for (int x = 0; x < layers_; ++x) heaviest = std::max(heaviest, work[x + 1] - work[x]);
  const double least =
      std::max(heaviest / *std::max_element(stage_speed.begin(), stage_speed.end()),
               work[layers_] / std::accumulate(stage_speed.begin(), stage_speed.end(), 0.0));
  // Its cost evaluations count against the budget (uncounted, the dynamic programme alone was a
  // fifth of the time of 2,000 layers on 32 stages; bisection needs a twentieth as many).
  std::uint64_t evaluations = 0;
  const Partition p = min_max_partition_bisected(work, stage_speed, least, &evaluations);
  context_.stats.steps += evaluations / kPartitionEvaluationsPerStep;
  e.balance = p.sizes;
  e.score = context_.simulate_for(e, e.balance, &e.peaks);
  for (const std::vector<int>& start : e.relaxed) start_from(e, start);
  proxy_starts(e);
  e.stats.evaluated = true;
}

// Under caps, proxy_descent()'s starts from e's best balance (its first plans). Each device's
// bound against that balance's simulated peak says how far below the simulator the bound keeps
// it: the proxy holds each device's bound to its cap times that ratio, then to less of it while
// the start does not fit. (Run again in later slices with the rows the root added since, where
// no plan fitted yet, it found none on bench's capped case and cost its gap 4.2 -> 9.4 %.)
void MultiStageSearch::proxy_starts(Entry& e) {
  if (!context_.capped() || !e.time_rows || e.time_rows->constant.empty() ||
      e.peaks.size() != static_cast<std::size_t>(stages_))
    return;
  const std::vector<std::int64_t> peaks = e.peaks;  // the best start's, as the bounds below
  MultiStagePeakBound& peak = peak_bound(e);
  const std::vector<std::int64_t> bounds = peak.of(e.balance);
  std::vector<double> limit(stages_, kInf);
  for (double share : {1.0, 0.95, 0.9}) {
    for (int r = 0; r < stages_; ++r) {
      if (context_.capacity[r] <= 0 || peaks[r] <= 0) continue;
      limit[r] = share * static_cast<double>(context_.capacity[r]) *
                 static_cast<double>(bounds[r]) / static_cast<double>(peaks[r]);
    }
    start_from(e, proxy_descent(peak, *e.time_rows, e.balance, limit));
    if (!(e.score.excess > 0.0)) break;
  }
}

// The local search goes on from `balance` if it fits better or is faster than its current one;
// otherwise, if it fits, it is a start descended from later (as is the one it replaces).
void MultiStageSearch::start_from(Entry& e, const std::vector<int>& balance) {
  if (balance == e.balance ||
      std::find(e.starts.begin(), e.starts.end(), balance) != e.starts.end())
    return;
  std::vector<std::int64_t> peaks;
  const Score score = context_.simulate_for(e, balance, &peaks);
  if (better(score, e.score)) {
    // The balance it replaces is descended from later, if it fits.
    if (!e.balance.empty() && !(e.score.excess > 0.0) &&
        std::find(e.starts.begin(), e.starts.end(), e.balance) == e.starts.end())
      e.starts.push_back(e.balance);
    e.restart_at(balance, score, std::move(peaks));  // moves the widest again
  } else if (!(score.excess > 0.0)) {
    e.starts.push_back(balance);
  }
}

std::unique_ptr<GraphSweep> MultiStageSearch::graph_sweep(const Config& c) {
  if (!GraphSweep::exact_for(context_.profile)) return nullptr;
  const int stages = context_.stage_count(c);
  const Schedule schedule =
      make_schedule(c.schedule, stages, c.micro_batches(), c.checkpoint, c.stages_per_device);
  auto sweep = std::make_unique<GraphSweep>(context_.costs, context_.hardware, schedule,
                                            context_.stage_devices_of(c), c.sizes);
  context_.stats.steps += sweep->task_count();  // its graph, as a simulation's
  return sweep;
}

double MultiStageSearch::swept_time(GraphSweep& sweep, const std::vector<int>& balance) {
  ++context_.stats.sweeps;
  context_.stats.steps += 1 + (sweep.task_count() + 8 * balance.size()) / kSweepTasksPerStep;
  return sweep.run(balance);
}

// Entry e's balance becomes `next` where that is better (less memory excess, then less time);
// false otherwise. Where the balance fits (or nothing is capped), only a faster one can be
// better: the sweep's time rules the others out without a simulation.
bool MultiStageSearch::take_if_better(Entry& e, GraphSweep* sweep, std::vector<int> next) {
  if (sweep && !(e.score.excess > 0.0) && !(swept_time(*sweep, next) < e.score.time)) return false;
  std::vector<std::int64_t> peaks;
  const Score score = context_.simulate_for(e, next, &peaks);
  if (!better(score, e.score)) return false;
  e.balance = std::move(next);
  e.score = score;
  e.peaks = std::move(peaks);
  return true;
}

// Once every start is descended, kicks (iterated local search): the best plan so far with a few
// layers moved between random stages (the same for the same configuration, so that the search
// stays deterministic), descended from as a start. (Kicks held back until the enumeration had
// been cut short by the budget were measured too: 13 answers of the random instances faster
// instead of 16.) Then the next start's descent, from moves of `widest` layers.
void MultiStageSearch::next_start(Entry& e, GraphSweep* sweep, int widest, std::uint64_t limit) {
  const Config& c = *e.config;
  const int stages = context_.stage_count(c);
  if (e.settled && e.ranged && e.starts.empty() && sweep && e.kicks < kLocalSearchKicks &&
      e.best < kInf && context_.stats.steps < limit) {
    std::mt19937 rng(static_cast<unsigned>(1000003 * e.kicks + 7919 * c.micro_batches() +
                                           31 * static_cast<int>(c.schedule) +
                                           static_cast<int>(c.checkpoint)));
    std::vector<int> next = e.candidate.plan.balance;
    for (int k = 0; k < 3; ++k) {
      const int i = static_cast<int>(rng() % stages), j = static_cast<int>(rng() % stages);
      const int d = 1 + static_cast<int>(rng() % 3);
      if (i == j || next[j] - d < 1) continue;
      next[i] += d;
      next[j] -= d;
    }
    ++e.kicks;
    if (next != e.candidate.plan.balance) e.starts.push_back(std::move(next));
  }
  if (e.settled && e.ranged && !e.starts.empty() && context_.stats.steps < limit) {
    std::vector<int> start = std::move(e.starts.front());
    e.starts.erase(e.starts.begin());
    std::vector<std::int64_t> peaks;
    const Score score = context_.simulate_for(e, start, &peaks);
    e.restart_at(std::move(start), score, std::move(peaks));
    e.move = widest;
  }
}

// Moves of one stage end by e.move layers, each taken where it is better, until none is: then
// half as many layers, down to one, then once more up from two (a block moved at once can still
// gain where no single layer does), until the moves would pass `widest` (e.settled).
void MultiStageSearch::descend_one_end(Entry& e, GraphSweep* sweep, int widest,
                                       std::uint64_t limit) {
  const int stages = context_.stage_count(*e.config);
  while (!e.settled && context_.stats.steps < limit) {
    bool improved = false;
    for (int i = 0; i + 1 < stages && !improved && context_.stats.steps < limit; ++i) {
      for (int delta : {-e.move, e.move}) {
        std::vector<int> next = e.balance;
        next[i] += delta;
        next[i + 1] -= delta;
        if (next[i] < 1 || next[i + 1] < 1) continue;
        if (take_if_better(e, sweep, std::move(next))) {
          improved = true;
          break;
        }
      }
    }
    if (improved) {
      e.widening = false;
      e.ranged = false;
    } else if (context_.stats.steps < limit) {
      if (!e.widening && e.move > 1) {
        e.move /= 2;
      } else if (!e.widening) {
        e.widening = true;
        e.move = 2;
        if (e.move > widest) e.settled = true;
      } else if (e.move * 2 > widest) {
        e.settled = true;
      } else {
        e.move *= 2;
      }
    }
  }
}

// Where balances are swept, a layer moved between two stages that are not neighbours (the
// stages between them shift by one): a time that is the maximum of several paths can need two
// ends to move at once, where moving either alone gains nothing. Where one does, the one-end
// moves go on from it (e.settled false); where none does, e.ranged.
void MultiStageSearch::move_between_distant_stages(Entry& e, GraphSweep* sweep,
                                                   std::uint64_t limit) {
  const int stages = context_.stage_count(*e.config);
  if (!sweep) e.ranged = true;
  bool moved = false, cut = false;
  for (int i = 0; i + 2 < stages && !e.ranged && !moved && !cut; ++i) {
    for (int j = i + 2; j < stages && !moved && !cut; ++j) {
      for (int delta : {1, -1}) {
        if (!(context_.stats.steps < limit)) {
          cut = true;  // the next slice starts the moves over
          break;
        }
        std::vector<int> next = e.balance;
        next[i] += delta;
        next[j] -= delta;
        if (next[i] < 1 || next[j] < 1) continue;
        if (take_if_better(e, sweep, std::move(next))) {
          moved = true;
          break;
        }
      }
    }
  }
  if (moved) {
    e.settled = false;
    e.move = 1;
    e.widening = true;
  } else if (!cut) {
    e.ranged = true;
  }
}

// The multi-stage local search of slice(), until `limit` (a count of context_.stats.steps)
// or until no move improves from any start: from e's balance, moves of one stage end, least
// memory excess first, then time, each taken where it is better; then, where `sweep` times
// balances, a layer moved between two stages further apart; then the next start, and kicks of
// the best plan. Where it stops is kept in e for the next slice.
void MultiStageSearch::multi_stage_local_search(Entry& e, GraphSweep* sweep, std::uint64_t limit) {
  // Moves of a quarter of an average stage first, and of half as many layers where none
  // improves, down to one: on thousands of layers a start far from fitting (the min-max
  // partition of time under a cap) took a simulation per layer moved.
  const int widest = std::max(1, layers_ / context_.stage_count(*e.config) / 4);
  if (e.move == 0) e.move = widest;
  for (;;) {
    next_start(e, sweep, widest, limit);
    if (!(context_.stats.steps < limit) || (e.settled && e.ranged)) break;
    descend_one_end(e, sweep, widest, limit);
    move_between_distant_stages(e, sweep, limit);
  }
}

// A slice: the relaxed root's rounds if the cheap pass cut them short; the first plans if the cheap
// pass deferred them; then a first-improvement local search that moves one stage boundary (wide
// moves first, see below), least memory excess first, then time, until no move improves, then a
// layer between distant stages, from every start and then from kicks of the best plan (a good
// plan early makes the enumeration below prune more); then the enumeration of every balance, stage
// by stage, where a prefix whose MultiStageBalanceBound is not below the plan to beat, whose
// last stage's device cannot fit its memory bound, or whose later stages cannot reach the last
// layer within their caps (later_stages_may_fit()), is not extended, and a whole balance is
// timed only when its bound is below it. Balances are timed by GraphSweep where it equals the
// simulator; the local search simulates those that could become the configuration's best or
// where the current one does not fit, the enumeration those not slower than the plan to beat.
// The enumeration resumes where the last slice stopped (the plan to beat only falls, so what it
// skipped stays skipped); when it ends, the configuration is closed with its best plan that
// could enter the ranking (a fitting plan slower than the ranking's threshold may go unseen).
void MultiStageSearch::slice(Entry& e, double ranking_threshold, std::uint64_t slice) {
  const Config& c = *e.config;
  ranking_threshold_ = ranking_threshold;
  const std::uint64_t steps = context_.stats.steps;
  auto note = [&] {
    ++e.stats.slices;
    e.slice = slice;
    e.stats.steps += context_.stats.steps - steps;
    e.stats.best_ms = e.best < kInf ? e.best : 0.0;
    e.stats.lower_bound_ms = e.root;
  };
  auto beat = [&] { return std::min(ranking_threshold_, e.best); };
  if (e.root >= beat() || !fits_some_balance(e) || !fits_fast_enough(e, beat())) {
    e.closed = true;
    note();
    return;
  }
  const std::uint64_t limit = std::min(context_.options.search_budget, steps + slice);
  // A relaxed root that the cheap pass cut short goes on where it stopped, to half the slice:
  // with many configurations most got no round there, and their balance-free bounds held the
  // gap open.
  std::optional<LayerWork> work;
  if (!e.root_complete || e.balance.empty()) work.emplace(context_.costs, c);
  if (!e.root_complete) {
    const std::vector<std::vector<int>> tried = e.relaxed;
    if (context_.capped() && !e.time_rows) e.time_rows = std::make_unique<StageWorkRows>();
    e.root =
        std::max(e.root, multi_stage_relaxed_root(c, *work, std::min(limit, steps + slice / 2),
                                                  beat(), e.root_state, &e.root_complete,
                                                  &e.relaxed, e.time_rows.get(), &e.copies_root));
    e.fast_checked = kInf;  // more rows
    if (e.root >= beat() || !fits_fast_enough(e, beat())) {
      e.closed = true;
      note();
      return;
    }
    if (!e.balance.empty()) {
      for (const std::vector<int>& start : e.relaxed)
        if (std::find(tried.begin(), tried.end(), start) == tried.end()) start_from(e, start);
    }
  }
  if (e.balance.empty()) first_multi_stage_plans(e, *work);
  const std::unique_ptr<GraphSweep> sweep = graph_sweep(c);
  multi_stage_local_search(e, sweep.get(), limit);
  if (context_.stats.steps >= limit) {  // nothing left for the enumeration: its bound is not built
    note();
    return;
  }

  enumerate_balances(e, sweep.get(), limit);
  note();
}

// The enumeration of multi-stage configuration e's balances, stage by stage (see
// slice()), from where its last slice stopped until `limit`; closes e when it ends.
void MultiStageSearch::enumerate_balances(Entry& e, GraphSweep* sweep, std::uint64_t limit) {
  const Config& c = *e.config;
  const int stages = context_.stage_count(c);
  auto beat = [&] { return std::min(ranking_threshold_, e.best); };
  MultiStageBalanceBound bound(context_.costs, c.sizes, c.schedule, c.checkpoint, stages_,
                               c.stages_per_device, speed_, overhead_, context_.hardware);
  // Under caps, a stage whose device's peak bound exceeds its cap ends every balance below it:
  // no plan there fits, and a longer stage only needs more.
  MultiStagePeakBound* peak = context_.capped() ? &peak_bound(e) : nullptr;
  // Places stage t in `peak` and says whether its device's bound now exceeds its cap.
  auto placed_overflows = [&](int t, int a, int b) {
    if (!peak) return false;
    const std::int64_t cap = context_.capacity[peak->device_of(t)];
    // Its device's moments, each a sum over its stages: with every balance swept rather than
    // simulated, these sums became most of a capped enumeration's time.
    const std::uint64_t cells = peak->level_cells();
    const bool over = peak->place(t, a, b) > cap && cap > 0;
    context_.stats.steps += (peak->level_cells() - cells) / kLevelCellsPerStep;
    return over;
  };
  // A bound a hair above a time it should not exceed is rounding, not a proof.
  auto below_beat = [&](double lower) { return lower * (1.0 - 1e-12) < beat(); };
  bool resuming = !e.resume.empty();
  bool out = false;
  std::vector<int> ends;  // stage t ends at ends[t]
  std::function<void(int, int)> enumerate = [&](int t, int a) {
    const int last_end = layers_ - (stages - 1 - t);
    int b = a + 1;
    if (resuming) {
      b = e.resume[t];
      // The deepest stage the last slice placed: below it, start afresh.
      if (t + 1 == static_cast<int>(e.resume.size())) resuming = false;
    }
    for (; b <= last_end && !out; ++b, resuming = false) {
      if (context_.stats.steps >= limit) {
        out = true;
        e.resume = ends;
        e.resume.push_back(b);
        return;
      }
      ++context_.stats.steps;
      ++context_.stats.nodes;
      if (placed_overflows(t, a, b)) {
        peak->unplace(t);
        break;
      }
      bound.place(t, a, b);
      if (t + 2 == stages) {  // the last stage takes the rest
        bound.place(t + 1, b, layers_);
        if (!placed_overflows(t + 1, b, layers_) && below_beat(bound.bound(stages))) {
          const std::vector<int> balance = balance_of_ends(ends, b, layers_);
          // Simulated only if faster than the plan to beat, or as fast (it may need less
          // memory): nothing else changes the ranking. Where nothing of the configuration fits
          // yet, that is the ranking's plan to beat; a balance slower than it, fitting or not,
          // could not enter the ranking.
          if (!sweep || !(swept_time(*sweep, balance) > beat())) context_.simulate_for(e, balance);
        }
        bound.unplace(t + 1);
        if (peak) peak->unplace(t + 1);
      } else if (below_beat(bound.bound(t + 1)) && (!peak || later_stages_may_fit(*peak, t, b))) {
        ends.push_back(b);
        enumerate(t + 1, b);
        ends.pop_back();
      }
      bound.unplace(t);
      if (peak) peak->unplace(t);
    }
  };
  enumerate(0, 0);
  if (!out) {
    e.closed = true;
    e.resume.clear();
  }
}

}  // namespace pipetune::planning
