// The search's frame: which configurations there are, how each is prepared, the slices of the
// budget they get in turn, how their plans are simulated and ranked.

#include "sim/planner/search.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "sim/error.hpp"
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

// By how much the largest of `peaks` (per device, in r.devices' order) exceeds its device's cap;
// 0 when every one fits.
double excess_over_caps(const SimulationResult& r, const std::vector<std::int64_t>& peaks) {
  double excess = 0.0;
  for (std::size_t d = 0; d < peaks.size(); ++d) {
    const std::int64_t cap = r.devices[d].memory_capacity_bytes;
    if (cap > 0 && peaks[d] > cap) excess = std::max(excess, static_cast<double>(peaks[d] - cap));
  }
  return excess;
}

// Every device's peak (and worst-order peak, where computed) within its cap.
bool fits_its_caps(const PlanCandidate& c) {
  for (std::size_t d = 0; d < c.peak_memory_bytes.size(); ++d) {
    const std::int64_t cap = c.memory_capacity_bytes[d];
    if (cap <= 0) continue;
    if (c.peak_memory_bytes[d] > cap) return false;
    if (!c.worst_order_peak_bytes.empty() && c.worst_order_peak_bytes[d] > cap) return false;
  }
  return true;
}

}  // namespace

int recompute_stop(const Config& config) {
  const int m = config.micro_batches();
  switch (config.checkpoint) {
    case CheckpointMode::Always:
      return m;
    case CheckpointMode::ExceptLast:
      return m - 1;
    case CheckpointMode::Never:
      return 0;
  }
  return 0;
}

std::vector<Config> PlanSearch::configurations() const {
  std::vector<int> chunks = options_.chunks;
  if (chunks.empty()) {
    for (int c = 1; c <= max_chunks(profile_.batch_size); ++c) chunks.push_back(c);
  }
  std::sort(chunks.begin(), chunks.end());
  std::vector<std::vector<std::int64_t>> splits;
  std::vector<int> first_chunks;
  for (int c : chunks) {
    if (c < 1 || c > max_chunks(profile_.batch_size)) {
      throw InputError(
          fmt::format("chunks: expected {}, got {}", chunks_expectation(profile_.batch_size), c));
    }
    auto split = split_batch(profile_.batch_size, c);
    if (std::find(splits.begin(), splits.end(), split) == splits.end()) {
      splits.push_back(std::move(split));
      first_chunks.push_back(c);
    }
  }
  const bool never_too = std::find(options_.checkpoints.begin(), options_.checkpoints.end(),
                                   CheckpointMode::Never) != options_.checkpoints.end();
  std::vector<Config> out;
  // (schedule, stages per device): the V schedules' hold two; the looped ones every count asked for
  // that leaves each stage a layer.
  std::vector<std::pair<ScheduleKind, int>> shapes;
  for (auto schedule : options_.schedules) {
    if (!is_multi_stage(schedule)) {
      shapes.emplace_back(schedule, 1);
      continue;
    }
    const auto fixed = fixed_stages_per_device(schedule);
    for (int v : fixed ? std::vector<int>{*fixed} : options_.stages_per_device) {
      if (v < 2) {
        throw InputError(fmt::format("stages per device: expected at least 2 for {}, got {}",
                                     to_string(schedule), v));
      }
      if (v * stages_ <= layers_) shapes.emplace_back(schedule, v);
    }
  }
  for (std::size_t k = 0; k < splits.size(); ++k) {
    for (auto [schedule, v] : shapes) {
      for (auto checkpoint : options_.checkpoints) {
        Config c;
        c.sizes = splits[k];
        c.chunks = first_chunks[k];
        c.checkpoint = checkpoint;
        c.schedule = schedule;
        c.stages_per_device = v;
        // Micro-batch counts that torch refuses for the schedule (sim/schedule.hpp).
        if (c.multi_stage() &&
            schedule_refusal(schedule, stages_, v, c.micro_batches()).has_value()) {
          continue;
        }
        // except_last with one micro-batch checkpoints nothing: the same plan as never.
        if (checkpoint == CheckpointMode::ExceptLast && c.micro_batches() == 1 && never_too)
          continue;
        out.push_back(std::move(c));
      }
    }
  }
  return out;
}

void PlanSearch::prepare(const Config& config) {
  config_ = &config;
  first_size_ = &costs_.at(config.sizes.front());
  last_size_ = &costs_.at(config.sizes.back());
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
    shape.optimizer_state_factor = options_.optimizer_state_factor;
    peak_shape_ = stage_peak_shape(costs_, shape, stages_);
    peak_shape_.receives_senders_tensor = receives_senders_tensor_;
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
            max_speed_;
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
    before_[k + 1] =
        before_[k] +
        (std::min(f.forward_ms[k], f.forward_nograd_ms[k]) + f.backward_ms[k]) / max_speed_;
  }
  for (int k = layers_ - 1; k >= 0; --k) {
    after_[k] = after_[k + 1] +
                (std::min(onward.forward_ms[k], onward.forward_nograd_ms[k]) + f.backward_ms[k]) /
                    max_speed_;
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
void PlanSearch::prepare_host(const Config& config) {
  host_work_.clear();
  host_arrive_.clear();
  host_drain_.clear();
  host_per_stage_ = host_drain_per_stage_ = 0.0;
  if (!costs_.profile().has_launch_times()) return;
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
double PlanSearch::host_root() const {
  if (host_work_.empty()) return 0.0;
  return min_max_partition(layers_, stages_, [&](int, int a, int b) { return host_busy(a, b); })
             .bottleneck *
         (1.0 - 1e-12);
}

// The threshold entry `self` must beat to enter the top N: the N-th best of the others.
double PlanSearch::ranking_threshold(const std::vector<Entry>& entries, const Entry* self) const {
  const std::size_t top = std::max<std::size_t>(options_.top, 1);
  std::vector<double> others;
  for (const Entry& e : entries) {
    if (&e != self && e.best < kInf) others.push_back(e.best);
  }
  if (others.size() < top) return kInf;
  std::nth_element(others.begin(), others.begin() + static_cast<std::ptrdiff_t>(top - 1),
                   others.end());
  return others[top - 1];
}

// Prepares entry `e`'s configuration (tables, sweep); false when a bound rules it out.
bool PlanSearch::open(Entry& e, const std::vector<Entry>& entries, bool tables) {
  ranking_threshold_ = ranking_threshold(entries, &e);
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
std::vector<PlanSearch::PrefixDepth>* PlanSearch::open_alone(Entry& e) {
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

PlanCandidate PlanSearch::best_around_of(const Plan& centre, int radius) {
  const Config config = config_of(centre);
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
void PlanSearch::open_root(Entry& e, const std::vector<Entry>& entries) {
  e.root = e.config->lower_bound;
  if (e.config->multi_stage()) {
    multi_stage_root(e, entries);
    return;
  }
  if (!open(e, entries, false)) {
    e.closed = true;
    keep(e);
    return;
  }
  // Under caps, a configuration that no balance fits is ruled out before its relaxed root and
  // tables (which would rule it out too: on 3,000 layers and 32 stages where nothing fits,
  // building them was most of a plan's time).
  if (capped() && !some_balance_fits_nested()) {
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
    const std::uint64_t allowance = std::max<std::uint64_t>(options_.search_budget / 32, 1 << 17);
    if (repair(relaxed, stats_.steps + allowance))
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

void PlanSearch::keep(Entry& e) {
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

// One slice of the branch and bound over entry `e`'s balances, resumed where the last one
// stopped, with its best plan so far as the threshold; closes it when the search ends.
// Keeps the current tables with entry `e` for its next slice, within a memory budget: they
// cost about as much to build as a few thousand steps of the search.
void PlanSearch::store_tables(Entry& e) {
  if (e.closed || e.tables || table_cache_bytes_ + table_bytes() > kTableCacheBytes) return;
  e.tables = std::make_unique<Tables>();
  swap_tables(*e.tables);
  table_cache_bytes_ += table_bytes();
}

std::size_t PlanSearch::table_bytes() const {
  // suffix_, chained_, waits_, steady_, their floors, fitting_: doubles; fit_end_: ints.
  const std::size_t cells = static_cast<std::size_t>(stages_ + 1) * (layers_ + 1);
  return cells * (9 * sizeof(double) + sizeof(int));
}

void PlanSearch::swap_tables(Tables& t) {
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

void PlanSearch::search_slice(Entry& e, std::vector<Entry>& entries, std::uint64_t slice) {
  if (e.config->multi_stage()) {
    multi_stage_slice(e, entries, slice);
    return;
  }
  if (!open(e, entries)) {
    e.closed = true;
    keep(e);
    return;
  }
  const std::uint64_t nodes = stats_.nodes, steps = stats_.steps;
  const std::uint64_t slice_end = std::min(options_.search_budget, stats_.steps + slice);
  out_of_budget_ = false;
  // The capped root and the polish take half the slice at most between them, the search around
  // the best plan a quarter more, and the one around the relaxed root's plan a quarter only
  // where half is left, so that the search gets a quarter at least (and its resume point is
  // not lost to an empty slice, unless the budget ends first).
  const std::uint64_t half_slice = stats_.steps + slice / 2;
  if (e.capped_rows) {
    // Cut short, it runs again with the next (larger) slice.
    bool finished = true;
    e.root = std::max(e.root, capped_root(*e.capped_rows, std::min(ranking_threshold_, e.best),
                                          half_slice, finished));
    if (finished) e.capped_rows.reset();
    if (e.root >= std::min(ranking_threshold_, e.best)) {
      e.closed = true;
      e.stats.steps += stats_.steps - steps;
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
      search_around_best(std::min(slice_end, stats_.steps + std::min(slice / 4, kWindowSteps)));
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
  const std::uint64_t left = slice_end > stats_.steps ? slice_end - stats_.steps : 0;
  if (!e.relaxed_plan.empty() && config_best_ < kInf && left >= slice / 2) {
    search_around(std::exchange(e.relaxed_plan, {}), kAroundRelaxedRadius,
                  stats_.steps + std::min(slice / 4, kWindowSteps));
  }
  build_trip_tables(threshold(Objective::Time));
  search(0, 0, 0.0, 0.0, {}, 0.0, Objective::Time, walk);
  prefix_allowed_ = false;
  e.resume = std::move(walk.resume);
  e.slice = slice;
  ++e.stats.slices;
  e.stats.nodes += stats_.nodes - nodes;
  e.stats.steps += stats_.steps - steps;
  if (!out_of_budget_) e.closed = true;
  keep(e);
  store_tables(e);
}

Plan PlanSearch::plan_of(const Config& c, std::vector<int> balance) const {
  Plan plan;
  plan.balance = std::move(balance);
  plan.chunks = c.chunks;
  plan.checkpoint = c.checkpoint;
  plan.schedule = c.schedule;
  plan.stages_per_device = c.stages_per_device;
  plan.optimizer_state_factor = options_.optimizer_state_factor;
  return plan;
}

PlanCandidate PlanSearch::candidate_of(const Config& c, const Plan& plan,
                                       const SimulationResult& r) const {
  PlanCandidate out;
  out.plan = plan;
  out.micro_batches = c.micro_batches();
  out.iteration_ms = r.iteration_ms;
  out.throughput_samples_per_s = r.throughput_samples_per_s;
  out.bubble_fraction = r.bubble_fraction;
  for (const auto& d : r.devices) {
    out.busy_ms.push_back(d.busy_ms);
    out.peak_memory_bytes.push_back(d.peak_memory_bytes);
    out.memory_capacity_bytes.push_back(d.memory_capacity_bytes);
  }
  return out;
}

PlanSearch::Score PlanSearch::simulate_for(Entry& e, const std::vector<int>& balance,
                                           std::vector<std::int64_t>* peaks) {
  const Plan plan = plan_of(*e.config, balance);
  SimulationOptions lean;
  lean.record_tasks = false;
  lean.record_memory = false;
  const SimulationResult r = simulator_.run(plan, lean);
  ++stats_.simulations;
  ++e.stats.nodes;
  stats_.steps += simulation_steps(*e.config, r);
  std::vector<std::int64_t> predicted;
  for (const auto& d : r.devices) predicted.push_back(d.peak_memory_bytes);
  if (peaks != nullptr) {
    peaks->assign(stages_, 0);
    for (const auto& d : r.devices) (*peaks)[d.index] = d.peak_memory_bytes;
  }
  Score score{excess_over_caps(r, predicted), r.iteration_ms};
  std::vector<std::int64_t> worst;
  // Of two plans as fast, the one that needs less memory on its fullest device.
  const bool faster = r.iteration_ms < e.best,
             leaner = r.iteration_ms == e.best &&
                      r.max_peak_memory_bytes() < e.candidate.max_peak_memory_bytes();
  if ((faster || leaner) && fits(plan, r, worst)) {
    e.best = r.iteration_ms;
    e.candidate = candidate_of(*e.config, plan, r);
    e.candidate.worst_order_peak_bytes = std::move(worst);
  } else if (!worst.empty()) {
    // Fits as predicted but not in every arrival order: over by what the worst order needs.
    score.excess = excess_over_caps(r, worst);
  }
  return score;
}

std::vector<std::int64_t> PlanSearch::worst_order_peaks_of(const Plan& plan) {
  SimulationOptions ordered;
  ordered.record_tasks = false;
  ordered.record_memory = false;
  ordered.worst_order_peaks = true;
  const SimulationResult w = simulator_.run(plan, ordered);
  std::vector<std::int64_t> peaks;
  for (const auto& d : w.devices) peaks.push_back(d.worst_order_peak_bytes);
  return peaks;
}

bool PlanSearch::fits(const Plan& plan, const SimulationResult& r,
                      std::vector<std::int64_t>& worst) {
  worst.clear();
  if (!r.fits()) return false;
  const bool capped = std::any_of(r.devices.begin(), r.devices.end(), [](const DeviceReport& d) {
    return d.memory_capacity_bytes > 0;
  });
  if (!options_.worst_order_memory || !capped) return true;
  worst = worst_order_peaks_of(plan);
  ++stats_.simulations;  // the search's: a plan it judges, unlike the leanest plan's report
  stats_.steps += r.task_count * r.devices.size();  // a max-flow per device
  return excess_over_caps(r, worst) == 0.0;
}

// The budget may end before a configuration's latest best plan was polished (polish() runs at
// the start of its next slice): polish those that could enter the ranking, fastest first,
// within a sixteenth of the budget more.
void PlanSearch::polish_unpolished(std::vector<Entry>& entries) {
  std::vector<Entry*> order;
  for (Entry& e : entries) {
    if (!e.closed && !e.config->multi_stage() && e.best < e.polished) order.push_back(&e);
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const Entry* x, const Entry* y) { return x->best < y->best; });
  const std::uint64_t limit = stats_.steps + options_.search_budget / 16;
  for (Entry* e : order) {
    if (stats_.steps >= limit || e->best >= ranking_threshold(entries, e)) continue;
    if (!open(*e, entries, /*tables=*/false)) continue;
    const std::uint64_t steps = stats_.steps;
    if (polish(limit)) e->polished = config_best_;
    e->stats.steps += stats_.steps - steps;
    keep(*e);
  }
}

// A first leanest plan whatever is left of the budget: where the cheap pass spent it (a large
// model under a cap; 3,000 layers on 32 devices), the search for the leanest plan runs no
// step, and where it has steps its first leaf, stage by stage from the left, can be far from
// lean (one layer a stage, the rest on the last two). Per checkpoint mode and schedule, the
// configuration with the most micro-batches (the smallest activations) gets the balance with
// the least largest nested memory bound, O(1) a stage (min_max_partition: the bound only grows
// as a stage grows at either end), simulated. The search then starts from the leanest of them.
void PlanSearch::seed_leanest(const std::vector<Config>& configs) {
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

// Each configuration in the order of its cheap bound (the promising ones are visited early and
// the rest skipped), as an entry of its own.
std::vector<PlanSearch::Entry> PlanSearch::entries_by_cheap_bound(std::vector<Config>& configs) {
  for (auto& c : configs) {
    if (c.multi_stage()) {
      c.lower_bound = multi_stage_bound(c);
      continue;
    }
    prepare(c);
    c.lower_bound = cheap_bound();
  }
  std::stable_sort(configs.begin(), configs.end(),
                   [](const Config& x, const Config& y) { return x.lower_bound < y.lower_bound; });
  std::vector<Entry> entries(configs.size());
  for (std::size_t k = 0; k < configs.size(); ++k) {
    entries[k].config = &configs[k];
    entries[k].stats.chunks = configs[k].chunks;
    entries[k].stats.micro_batches = configs[k].micro_batches();
    entries[k].stats.checkpoint = configs[k].checkpoint;
    entries[k].stats.schedule = configs[k].schedule;
    entries[k].stats.stages_per_device = configs[k].stages_per_device;
  }
  return entries;
}

// A closed entry's multi-stage state is not needed again.
void PlanSearch::release_closed(Entry& e) {
  if (!e.closed) return;
  e.root_state.reset();
  e.time_rows.reset();
  e.peak.reset();
}

// The cheap pass over every configuration, whatever the budget: its root bound and a good
// incumbent, so that no configuration goes unseen and the threshold is good from the start.
void PlanSearch::cheap_pass(std::vector<Entry>& entries) {
  std::size_t done = 0;
  for (Entry& e : entries) {
    if (options_.progress) options_.progress(done++, entries.size());
    open_root(e, entries);
    release_closed(e);  // a relaxed root cut short, and its rows: nothing to go on with
  }
}

// The budget, in rounds, to the configurations whose bound is below the threshold, the one with
// the fastest plan first (its search is the likeliest to lower the threshold that the others
// must beat, and so to shorten their searches): each gets a share of what is left in proportion
// to its room below the threshold, and at least twice its last slice so that the rounds (each
// rebuilds the configuration's tables) are few. A slice resumes where the last one stopped.
void PlanSearch::share_the_budget(std::vector<Entry>& entries) {
  const std::uint64_t least_slice = std::max<std::uint64_t>(64, options_.search_budget / 4096);
  for (;;) {
    std::vector<Entry*> open_entries;
    for (Entry& e : entries) {
      if (!e.closed) open_entries.push_back(&e);
    }
    if (open_entries.empty()) break;
    std::stable_sort(open_entries.begin(), open_entries.end(),
                     [](const Entry* x, const Entry* y) { return x->best < y->best; });
    // Each one's weight: how far its bound lies below the plan it must beat, the room its
    // search has to change the answer or the gap.
    auto weight = [&](const Entry& e) {
      const double beat = std::min(ranking_threshold(entries, &e), e.best);
      return beat < kInf ? std::max(beat - e.root, 0.0) : std::max(e.root, 1.0);
    };
    std::vector<double> weights;
    for (const Entry* e : open_entries) weights.push_back(weight(*e));
    double weight_left = std::accumulate(weights.begin(), weights.end(), 0.0);
    bool progressed = false;
    for (std::size_t k = 0; k < open_entries.size(); ++k) {
      Entry& e = *open_entries[k];
      const double share_of = weight_left > 0 ? weights[k] / weight_left : 1.0;
      weight_left -= weights[k];
      if (e.closed) continue;
      const std::uint64_t left =
          options_.search_budget > stats_.steps ? options_.search_budget - stats_.steps : 0;
      const auto share = static_cast<std::uint64_t>(share_of * static_cast<double>(left));
      const std::uint64_t slice = std::min(left, std::max({least_slice, 2 * e.slice, share}));
      if (slice == 0) continue;
      search_slice(e, entries, slice);
      release_closed(e);
      progressed = true;
    }
    if (!progressed) break;
  }
}

// The ranking of every configuration's best plan, the stats, and whether the first plan is
// proven: every open configuration's bound is at or above the plan it had to beat.
// `unexplored`: the least bound over the configurations the budget cut short.
bool PlanSearch::rank(std::vector<Entry>& entries, Ranking& ranking, double& unexplored) {
  // The bound of the multi-stage configurations left open counts micro-batch 0's copies too,
  // and their relaxed roots their paths' copies at distinct outputs. Only now: raised during
  // the search, these roots shrank the configurations' shares of the budget and moved it
  // elsewhere (on bench/planner_at_scale.py's random instances three answers of twelve came out
  // 1.5-15 % slower with the first; with the second, bench's capped 1,000 x 16 case every
  // schedule 3.3 %), while the proof gains the same here.
  for (Entry& e : entries) {
    if (e.closed || !e.config->multi_stage()) continue;
    e.root = std::max({e.root, e.copies_root, multi_stage_bound(*e.config, /*with_copies=*/true)});
    e.stats.lower_bound_ms = e.root;
  }
  unexplored = kInf;
  double best = kInf;
  for (Entry& e : entries) {
    if (e.best < kInf) {
      best = std::min(best, e.best);
      ranking.insert(e.candidate);
    }
    if (e.stats.evaluated) ++stats_.configurations_searched;
    if (!e.stats.evaluated) ++stats_.configurations_skipped;
    if (!e.closed) {
      // Still open: ruled out only if the final ranking's threshold is at or below its bound.
      unexplored = std::min(unexplored, e.root);
    }
    e.stats.closed = e.closed;
    stats_.per_configuration.push_back(e.stats);
  }
  stats_.best_ms = best < kInf ? best : 0.0;
  stats_.lower_bound_ms = best < kInf ? std::min(best, unexplored) : unexplored;
  bool proven = true;
  for (const Entry& e : entries) {
    if (!e.closed && e.root < ranking_threshold(entries, &e)) proven = false;
  }
  return proven;
}

// Nothing fits: the plan whose largest per-device peak is smallest, with what is left of the
// budget. Returns whether the answer is still proven.
bool PlanSearch::find_leanest(const std::vector<Config>& configs, PlanSearchResult& result,
                              bool proven, double unexplored) {
  result.none_fits_proven = proven;
  Walk walk;
  walk.step_limit = options_.search_budget;
  out_of_budget_ = stats_.steps >= walk.step_limit;
  balance_.assign(stages_, 0);
  seed_leanest(configs);
  // (Among the single-stage configurations only: the memory bounds are theirs.) The first
  // plans of every configuration were simulated already: lean_best_ starts from the leanest.
  for (const Config& config : configs) {
    if (config.multi_stage()) continue;
    prepare(config);
    search(0, 0, 0.0, 0.0, {}, 0.0, Objective::Memory, walk);
  }
  result.leanest = lean_candidate_;
  result.leanest_proven = !out_of_budget_;
  if (result.leanest && options_.worst_order_memory) {
    // Leanest as predicted; what it needs in every arrival order is said beside it.
    result.leanest->worst_order_peak_bytes = worst_order_peaks_of(result.leanest->plan);
  }
  proven = proven && !out_of_budget_;
  // Where the budget ended the search for time before it found a fitting plan, the search
  // for the leanest one may end on a plan that fits: the answer, if not a proven one.
  if (result.leanest && fits_its_caps(*result.leanest)) {
    stats_.best_ms = result.leanest->iteration_ms;
    stats_.lower_bound_ms = std::min(stats_.best_ms, unexplored);
    result.ranked.push_back(*std::move(result.leanest));
    result.leanest.reset();
    result.leanest_proven = false;
    result.none_fits_proven = false;
    proven = false;
  }
  return proven;
}

PlanSearchResult PlanSearch::run() {
  std::vector<Config> configs = configurations();
  stats_.configurations = configs.size();
  std::vector<Entry> entries = entries_by_cheap_bound(configs);
  cheap_pass(entries);
  share_the_budget(entries);
  polish_unpolished(entries);
  if (options_.progress) options_.progress(entries.size(), entries.size());

  Ranking ranking(options_.top);
  double unexplored = kInf;
  bool proven = rank(entries, ranking, unexplored);
  PlanSearchResult result;
  result.ranked = ranking.take();
  if (result.ranked.empty()) proven = find_leanest(configs, result, proven, unexplored);
  stats_.proven = proven;
  result.stats = stats_;
  return result;
}

}  // namespace pipetune::planning
