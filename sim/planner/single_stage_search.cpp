// The single-stage search's frame: a configuration prepared (its work and launch sums), opened
// with its tables, given its cheap pass and its slices of the budget.

#include "sim/planner/single_stage_search.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>

#include "sim/memory_model.hpp"

namespace pipetune::planning {

namespace {

// How many micro-batches of each size there are, and how many of them are recomputed: all have
// the first size but perhaps the last, and the recomputed ones are a prefix.
struct SizeCounts {
  int first = 0, last = 0;                        // micro-batches of each size
  int recomputed_first = 0, recomputed_last = 0;  // of them, recomputed
};

SizeCounts size_counts(const Config& config) {
  const int m = config.micro_batches();
  const int stop = recompute_stop(config);
  const bool last_differs = config.sizes.back() != config.sizes.front();
  SizeCounts n;
  n.last = last_differs ? 1 : 0;
  n.first = m - n.last;
  n.recomputed_last = last_differs && stop == m ? 1 : 0;
  n.recomputed_first = std::min(stop, n.first);
  return n;
}

// `sum` plus one layer's share of a stage's iteration: every micro-batch's forward and backward,
// and the forward without autograd that each recomputed one runs first; {forward, backward,
// forward without autograd} at the first size and at the last. Device times and launch times
// alike (a prefix sum's next entry).
double plus_iteration_work(double sum, const SizeCounts& n, const std::array<double, 3>& first,
                           const std::array<double, 3>& last) {
  return sum + n.first * (first[0] + first[1]) + n.recomputed_first * first[2] +
         n.last * (last[0] + last[1]) + n.recomputed_last * last[2];
}

}  // namespace

SingleStageSearch::SingleStageSearch(SearchContext& context) : SearchPart(context) {
  after_speed_.assign(stages_, 0.0);
  after_latency_.assign(stages_, 0.0);
  for (int j = stages_ - 2; j >= 0; --j) {
    after_speed_[j] = std::max(after_speed_[j + 1], speed_[j + 1]);
    // Links after stage j + 1, each crossed by an activation and a gradient.
    after_latency_[j] =
        j + 2 < stages_ ? after_latency_[j + 1] + 2.0 * context.link[j + 1]->latency_ms : 0.0;
  }
}

double SingleStageSearch::cheap_bound_of(const Config& c) {
  prepare(c);
  return cheap_bound();
}

void SingleStageSearch::prepare(const Config& config) {
  config_ = &config;
  first_size_ = &context_.costs.at(config.sizes.front());
  last_size_ = &context_.costs.at(config.sizes.back());
  const SizeCosts& f = *first_size_;
  const SizeCosts& l = *last_size_;
  const int m = config.micro_batches();
  const int stop = recompute_stop(config);
  const SizeCounts counts = size_counts(config);
  const bool last_differs = counts.last == 1;
  {
    Plan shape;
    shape.chunks = config.chunks;
    shape.checkpoint = config.checkpoint;
    shape.schedule = config.schedule;
    shape.optimizer_state_factor = context_.options.optimizer_state_factor;
    peak_shape_ = stage_peak_shape(context_.costs, shape, stages_);
    peak_shape_.receives_senders_tensor = context_.receives_senders_tensor;
    full_bounds_.clear();
  }
  work_.assign(layers_ + 1, 0.0);
  for (int k = 0; k < layers_; ++k) {
    // A recomputed micro-batch runs its forward without autograd, then again with it.
    work_[k + 1] = plus_iteration_work(work_[k], counts,
                                       {f.forward_ms[k], f.backward_ms[k], f.forward_nograd_ms[k]},
                                       {l.forward_ms[k], l.backward_ms[k], l.forward_nograd_ms[k]});
  }
  tasks_per_stage_ = 2 * m + stop;

  // Micro-batch 0's and the last micro-batch's forward (without autograd when recomputed) and
  // backward through layers [b, L): the round trips that wait_bound() follows.
  const bool recompute_last = config.recomputed(m - 1), recompute_first = config.recomputed(0);
  pass_first_.assign(layers_ + 1, 0.0);
  pass_last_.assign(layers_ + 1, 0.0);
  for (int k = layers_ - 1; k >= 0; --k) {
    pass_first_[k] = pass_first_[k + 1] +
                     (recompute_first ? f.forward_nograd_ms[k] : f.forward_ms[k]) +
                     f.backward_ms[k];
    pass_last_[k] = pass_last_[k + 1] +
                    (recompute_last ? l.forward_nograd_ms[k] : l.forward_ms[k]) + l.backward_ms[k];
  }
  // GPipe's drain follows micro-batch 0; 1F1B's the last one, or the last full-size one when
  // tensor.chunk left a smaller last one (its drain is the longer).
  followed_ = config.schedule == ScheduleKind::OneFOneB && last_differs && m >= 2 ? m - 2 : m - 1;
  const SizeCosts& drained =
      config.schedule == ScheduleKind::OneFOneB && followed_ == m - 1 ? l : f;
  wait_before_.assign(layers_ + 1, 0.0);
  for (int k = 0; k < layers_; ++k) {
    wait_before_[k + 1] =
        wait_before_[k] +
        ((recompute_first ? f.forward_nograd_ms[k] : f.forward_ms[k]) + drained.backward_ms[k]) /
            context_.max_speed;
  }

  // One micro-batch's pass through layers at the fastest device's speed. Before a stage: its
  // first forward waits for micro-batch 0's forwards, and after its backward of a full-size
  // micro-batch q (GPipe: 0, its last; 1F1B: p, see pass_filler) q's gradient still has to go
  // back through the earlier layers. After a stage (see pass_filler): its backward of p waits
  // for the forwards (GPipe: of the last micro-batch) and p's backwards through later layers.
  const bool gpipe = config.schedule == ScheduleKind::GPipe;
  const SizeCosts& onward = gpipe ? l : f;
  before_.assign(layers_ + 1, 0.0);
  after_.assign(layers_ + 1, 0.0);
  for (int k = 0; k < layers_; ++k) {
    before_[k + 1] = before_[k] + (f.least_forward_ms(k) + f.backward_ms[k]) / context_.max_speed;
  }
  for (int k = layers_ - 1; k >= 0; --k) {
    after_[k] =
        after_[k + 1] + (onward.least_forward_ms(k) + f.backward_ms[k]) / context_.max_speed;
  }
  prepare_host(config);
}

// The host's side of a GPU (architecture.md, "Launch-bound tasks"): a stage's thread launches
// its programme in order, each launch once the previous one is done and the task's input was
// launched, and a device task ends no earlier than its launch. Every launch of stage j comes
// after micro-batch 0's forward launches through stages 0..j-1 (its first task needs one),
// and the last task of its programme is a backward (GPipe: of micro-batch 0; 1F1B: of the last
// one) whose gradient is then launched back through stages j-1..0, each launch after the one
// before. So any plan takes at least arrive_host + host_busy + drain_host for every stage: a
// bound the device's times cannot give where the host is the slower.
void SingleStageSearch::prepare_host(const Config& config) {
  host_work_.clear();
  host_arrive_.clear();
  host_drain_.clear();
  host_per_stage_ = host_drain_per_stage_ = 0.0;
  if (!context_.costs.profile().has_launch_times()) return;
  const SizeCosts& f = *first_size_;
  const SizeCosts& l = *last_size_;
  const int m = config.micro_batches();
  const SizeCounts counts = size_counts(config);
  auto each = [](const std::vector<double>& prefix, int k) { return prefix[k + 1] - prefix[k]; };
  auto launches = [&](const SizeCosts& c, int k) -> std::array<double, 3> {
    return {each(c.forward_launch_prefix, k), each(c.backward_launch_prefix, k),
            each(c.forward_nograd_launch_prefix, k)};
  };
  const SizeCosts& drained = config.schedule == ScheduleKind::OneFOneB ? l : f;
  host_work_.assign(layers_ + 1, 0.0);
  host_arrive_.assign(layers_ + 1, 0.0);
  host_drain_.assign(layers_ + 1, 0.0);
  for (int k = 0; k < layers_; ++k) {
    host_work_[k + 1] = plus_iteration_work(host_work_[k], counts, launches(f, k), launches(l, k));
    host_arrive_[k + 1] =
        host_arrive_[k] +
        each(config.recomputed(0) ? f.forward_nograd_launch_prefix : f.forward_launch_prefix, k);
    host_drain_[k + 1] = host_drain_[k] + each(drained.backward_launch_prefix, k);
  }
  // Every task pays the overhead on the host too, and every backward autograd's call.
  host_per_stage_ = overhead_ * tasks_per_stage_ + m * f.backward_call_ms;
  host_drain_per_stage_ = overhead_ + f.backward_call_ms;
}

// The least over balances of the busiest stage's host work: a root bound, the host bound's
// passes left out.
double SingleStageSearch::host_root() const {
  if (host_work_.empty()) return 0.0;
  return min_max_partition(layers_, stages_, [&](int, int a, int b) { return host_busy(a, b); })
             .bottleneck *
         (1.0 - 1e-12);
}

// Prepares entry `e`'s configuration (tables, sweep); false when a bound rules it out.
bool SingleStageSearch::open(Entry& e, double ranking_threshold, bool tables) {
  ranking_threshold_ = ranking_threshold;
  config_best_ = e.best;  // keep() reads it even when the entry is closed here
  if (e.root >= std::min(ranking_threshold_, e.best)) {
    return false;
  }
  prepare(*e.config);
  prefix_ = e.prefix;
  prefix_root_version_ = ++prefix_versions_;
  e.prefix_depths.resize(stages_);
  prefix_depths_ = &e.prefix_depths;
  if (tables && e.tables) {
    swap_tables(*e.tables);  // e's tables are current again; its copy is released on return
    e.tables.reset();
    table_cache_bytes_ -= table_bytes();
  } else if (tables) {
    fit_end_ = fit_ends(1.0);
    build_suffix_tables();
  }  // else the caller builds them when it needs them (open_root())
  const Config& config = *e.config;
  sweep_ = std::make_unique<IterationSweep>(config.schedule, config.checkpoint, stages_,
                                            config.micro_batches(),
                                            config.sizes.back() != config.sizes.front());
  durations_.assign(stages_, StageDurations{});
  config_best_ = e.best;
  if (e.best < kInf) config_best_candidate_ = e.candidate;
  return true;
}

// What open() and open_root() set up for entry `e`'s configuration, for the test seams that
// bound or search it alone: its sweep, fit ends and relaxed root's prefix programme, with the
// programmes' cutting planes sampled by stage as in the search (PrefixDepth::cut_due()).
// Returns the depths pointer to restore once `e` is gone.
std::vector<PrefixDepth>* SingleStageSearch::open_alone(Entry& e) {
  const Config& config = *e.config;
  prepare(config);
  sweep_ = std::make_unique<IterationSweep>(config.schedule, config.checkpoint, stages_,
                                            config.micro_batches(),
                                            config.sizes.back() != config.sizes.front());
  durations_.assign(stages_, StageDurations{});
  fit_end_ = fit_ends(1.0);
  std::vector<int> relaxed;
  keep_prefix_programme(e, relaxed);
  prefix_ = e.prefix;
  prefix_root_version_ = ++prefix_versions_;
  e.prefix_depths.resize(stages_);
  return std::exchange(prefix_depths_, &e.prefix_depths);
}

PlanCandidate SingleStageSearch::best_around_of(const Plan& centre, int radius) {
  const Config config = context_.config_of(centre);
  Entry e;
  e.config = &config;
  std::vector<PrefixDepth>* const kept_depths = open_alone(e);
  build_suffix_tables();
  // As in the planner, which times the relaxed root's plan before the window around it: the
  // centre is a plan to beat where it fits.
  config_best_ = kInf;
  config_best_candidate_ = {};
  for (int j = 0, a = 0; j < stages_; a += centre.balance[j++])
    durations_[j] = durations(j, a, a + centre.balance[j]);
  evaluate(centre.balance, Objective::Time);
  prefix_allowed_ = true;
  search_around(centre.balance, radius, std::numeric_limits<std::uint64_t>::max());
  prefix_allowed_ = false;
  prefix_depths_ = kept_depths;  // e's are gone on return
  prefix_.reset();
  return config_best_ < kInf ? config_best_candidate_ : PlanCandidate{};
}

// The cheap pass: a configuration's root bound and the busy-balanced plan as its incumbent.
void SingleStageSearch::open_root(Entry& e, double ranking_threshold) {
  if (!open(e, ranking_threshold, false)) {
    e.closed = true;
    keep(e);
    return;
  }
  // Under caps, a configuration that no balance fits is ruled out before its relaxed root and
  // tables (which would rule it out too: on 3,000 layers and 32 stages where nothing fits,
  // building them was most of a plan's time).
  if (context_.capped() && !some_balance_fits_nested()) {
    e.closed = true;
    keep(e);
    return;
  }
  fit_end_ = fit_ends(1.0);
  // The relaxed root first: where it rules the configuration out, its tables are never built.
  std::vector<int> relaxed;  // the relaxed root's plan
  RelaxedRows relaxed_rows;
  e.root = std::max({e.root, keep_prefix_programme(e, relaxed, &relaxed_rows), host_root()});
  if (e.root >= ranking_threshold_) {
    e.closed = true;
    keep(e);
    return;
  }
  build_suffix_tables();
  double root = std::max({e.root, suffix_[stages_][0], chained_[stages_][0], waits_[stages_][0]});
  // Up to 5 % above (the term is about one stage's recompute): cheap enough at every root.
  if (root < ranking_threshold_)
    root = recompute_root(root, std::min(ranking_threshold_, 1.05 * root));
  e.root = root;
  if (root >= ranking_threshold_) {
    e.closed = true;
    keep(e);
    return;
  }
  for (const std::vector<int>& first : {busy_balanced(), relaxed}) {
    for (int j = 0, a = 0; j < stages_; a += first[j++])
      durations_[j] = durations(j, a, a + first[j]);
    evaluate(first, Objective::Time);
  }
  if (!fitting_.empty()) {
    // The cheap pass runs whatever the budget, but a repair that the caps make long stops at
    // a thirty-second of it (at a 2.2 x cap on the 1,000 x 16 case, most would have failed
    // after up to 0.8 M steps; at 2.5 x every one succeeds within 0.1 M).
    const std::uint64_t allowance =
        std::max<std::uint64_t>(context_.options.search_budget / 32, 1 << 17);
    if (repair(relaxed, context_.stats.steps + allowance))
      evaluate(relaxed, Objective::Time);  // repair() left its durations
    evaluate_leaner_incumbents();
    // capped_root() costs about as much as a slice: it runs with the first one, if any.
    e.capped_rows = std::make_unique<RelaxedRows>(std::move(relaxed_rows));
  }
  if (stages_ > 1 && static_cast<int>(relaxed.size()) == stages_) e.relaxed_plan = relaxed;
  e.stats.evaluated = true;
  keep(e);
  store_tables(e);
}

void SingleStageSearch::keep(Entry& e) {
  if (e.closed && e.prefix) {
    prefix_bytes_ -= e.prefix->bytes;
    e.prefix.reset();
  }
  if (config_best_ < e.best) {
    e.best = config_best_;
    e.candidate = config_best_candidate_;
  }
  e.stats.best_ms = e.best < kInf ? e.best : 0.0;
  e.stats.lower_bound_ms = e.root;
}

// Keeps the current tables with entry `e` for its next slice, within a memory budget: they
// cost about as much to build as a few thousand steps of the search.
void SingleStageSearch::store_tables(Entry& e) {
  if (e.closed || e.tables || table_cache_bytes_ + table_bytes() > kTableCacheBytes) return;
  e.tables = std::make_unique<SingleStageTables>();
  swap_tables(*e.tables);
  table_cache_bytes_ += table_bytes();
}

std::size_t SingleStageSearch::table_bytes() const {
  // suffix_, chained_, waits_, steady_, their floors, fitting_: doubles; fit_end_: ints.
  const std::size_t cells = static_cast<std::size_t>(stages_ + 1) * (layers_ + 1);
  return cells * (9 * sizeof(double) + sizeof(int));
}

void SingleStageSearch::swap_tables(SingleStageTables& t) {
  std::swap(suffix_, t.suffix);
  std::swap(chained_, t.chained);
  std::swap(waits_, t.waits);
  std::swap(suffix_floor_, t.suffix_floor);
  std::swap(chained_floor_, t.chained_floor);
  std::swap(waits_floor_, t.waits_floor);
  std::swap(fitting_, t.fitting);
  std::swap(steady_, t.steady);
  std::swap(steady_floor_, t.steady_floor);
  std::swap(fit_end_, t.fit_end);
}

void SingleStageSearch::slice(Entry& e, double ranking_threshold, std::uint64_t slice_steps) {
  if (!open(e, ranking_threshold)) {
    e.closed = true;
    keep(e);
    return;
  }
  const std::uint64_t nodes = context_.stats.nodes, steps = context_.stats.steps;
  const std::uint64_t slice_end =
      std::min(context_.options.search_budget, context_.stats.steps + slice_steps);
  out_of_budget_ = false;
  // The capped root and the polish take half the slice at most between them, the search around
  // the best plan a quarter more, and the one around the relaxed root's plan a quarter only
  // where half is left, so that the search gets a quarter at least (and its resume point is
  // not lost to an empty slice, unless the budget ends first).
  const std::uint64_t half_slice = context_.stats.steps + slice_steps / 2;
  if (e.capped_rows) {
    // Cut short, it runs again with the next (larger) slice.
    bool finished = true;
    e.root = std::max(e.root, capped_root(*e.capped_rows, std::min(ranking_threshold_, e.best),
                                          half_slice, finished));
    if (finished) e.capped_rows.reset();
    if (e.root >= std::min(ranking_threshold_, e.best)) {
      e.closed = true;
      e.stats.steps += context_.stats.steps - steps;
      keep(e);
      return;
    }
  }
  balance_.assign(stages_, 0);
  // The threshold only fell since the last slice, so what it searched stays searched.
  Walk walk;
  walk.resume = e.resume;
  walk.resuming = !walk.resume.empty();
  if (!walk.resuming) walk.resume.assign(stages_, 0);
  walk.step_limit = slice_end;
  if (e.best < e.polished) {
    // Half the slice at most: the search still gets the rest, now against a lower threshold.
    // Then around the polished plan, once per best plan, within a quarter of the slice and
    // kWindowSteps.
    if (polish(half_slice)) {
      search_around_best(
          std::min(slice_end, context_.stats.steps + std::min(slice_steps / 4, kWindowSteps)));
      e.polished = config_best_;
    }
  }
  // The configuration's steps so far are this slice's on top of its earlier ones: what the
  // prefix programmes may try out (prefix_pays()).
  prefix_steps_before_ =
      static_cast<std::int64_t>(e.stats.steps) - static_cast<std::int64_t>(steps);
  prefix_allowed_ = true;
  // Once, around the relaxed root's plan: the polish walks from the busy-balanced one, and the
  // fastest plans of the continuous model and of whole layers can lie near each other and far
  // from it, several ends a layer or two apart at once, which no move of the polish makes. Only
  // with a plan to beat (without one it walks the window for any plan that fits), and where
  // half the slice is left, so that the search keeps a quarter; else in a later slice.
  const std::uint64_t left =
      slice_end > context_.stats.steps ? slice_end - context_.stats.steps : 0;
  if (!e.relaxed_plan.empty() && config_best_ < kInf && left >= slice_steps / 2) {
    search_around(std::exchange(e.relaxed_plan, {}), kAroundRelaxedRadius,
                  context_.stats.steps + std::min(slice_steps / 4, kWindowSteps));
  }
  build_trip_tables(threshold(Objective::Time));
  search(0, 0, 0.0, 0.0, {}, 0.0, Objective::Time, walk);
  prefix_allowed_ = false;
  e.resume = std::move(walk.resume);
  e.slice = slice_steps;
  ++e.stats.slices;
  e.stats.nodes += context_.stats.nodes - nodes;
  e.stats.steps += context_.stats.steps - steps;
  if (!out_of_budget_) e.closed = true;
  keep(e);
  store_tables(e);
}

// A first leanest plan whatever is left of the budget: where the cheap pass spent it (a large
// model under a cap; 3,000 layers on 32 devices), the search for the leanest plan runs no
// step, and where it has steps its first leaf, stage by stage from the left, can be far from
// lean (one layer a stage, the rest on the last two). Per checkpoint mode and schedule, the
// configuration with the most micro-batches (the smallest activations) gets the balance with
// the least largest nested memory bound, O(1) a stage (min_max_partition: the bound only grows
// as a stage grows at either end), simulated. The search then starts from the leanest of them.
void SingleStageSearch::seed_leanest(const std::vector<Config>& configs) {
  std::map<std::pair<CheckpointMode, ScheduleKind>, const Config*> most;
  for (const Config& c : configs) {
    if (c.multi_stage()) continue;
    const Config*& chosen = most[{c.checkpoint, c.schedule}];
    if (chosen == nullptr || c.micro_batches() > chosen->micro_batches()) chosen = &c;
  }
  for (const auto& [kind, config] : most) {
    prepare(*config);
    const Partition p = min_max_partition(layers_, stages_, [this](int j, int a, int b) {
      return static_cast<double>(memory_bound(j, a, b, /*nested=*/true));
    });
    if (!p.sizes.empty()) evaluate(p.sizes, Objective::Memory);
  }
}

void SingleStageSearch::polish_best(Entry& e, double ranking_threshold, std::uint64_t step_limit) {
  if (!open(e, ranking_threshold, /*tables=*/false)) return;
  const std::uint64_t steps = context_.stats.steps;
  if (polish(step_limit)) e.polished = config_best_;
  e.stats.steps += context_.stats.steps - steps;
  keep(e);
}

bool SingleStageSearch::search_leanest(const std::vector<Config>& configs) {
  Walk walk;
  walk.step_limit = context_.options.search_budget;
  out_of_budget_ = context_.stats.steps >= walk.step_limit;
  balance_.assign(stages_, 0);
  seed_leanest(configs);
  // (Among the single-stage configurations only: the memory bounds are theirs.) The first
  // plans of every configuration were simulated already: lean_best_ starts from the leanest.
  for (const Config& config : configs) {
    if (config.multi_stage()) continue;
    prepare(config);
    search(0, 0, 0.0, 0.0, {}, 0.0, Objective::Memory, walk);
  }
  return !out_of_budget_;
}

}  // namespace pipetune::planning
