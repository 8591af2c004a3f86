#include "sim/planner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <queue>
#include <random>
#include <stdexcept>
#include <unordered_map>

#include "sim/cost_model.hpp"
#include "sim/error.hpp"
#include "sim/graph_sweep.hpp"
#include "sim/memory_model.hpp"
#include "sim/minimax_bound.hpp"
#include "sim/multi_stage_peak_bound.hpp"
#include "sim/partition.hpp"
#include "sim/schedule.hpp"
#include "sim/simulator.hpp"
#include "sim/stage_timing.hpp"
#include "sim/task_graph.hpp"

namespace pipetune {

double PlannerStats::gap() const {
  return best_ms > 0 && lower_bound_ms < best_ms ? (best_ms - lower_bound_ms) / best_ms : 0.0;
}

std::int64_t PlanCandidate::max_peak_memory_bytes() const {
  std::int64_t peak = 0;
  for (auto p : peak_memory_bytes) peak = std::max(peak, p);
  return peak;
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Cutting-plane rounds of relaxed_root(), each a linear programme of a few hundred pivots.
constexpr int kRelaxedRootRounds = 40;
// How far each round's model plan moves from the best one towards the solve's shares (see
// multi_stage_relaxed_root()).
constexpr double kModelPlanStep = 0.3;
// Kicks of a multi-stage configuration's best plan that its local search descends from once
// every start is done: with 8, 16 or 32 of them, 16 of 24 random instances' answers were faster
// than before the sweeps (1.47-1.49 % on geometric mean, against 1.36 % without kicks).
constexpr int kLocalSearchKicks = 16;
// A step of the budget is about 50 ns of work; a pivot updates a tableau cell in about 1.5 ns
// (measured on a 32-stage multi-stage root).
constexpr std::uint64_t kPivotCellsPerStep = 32;
// A cell of a min-sum partition (MultiStagePeakBound::may_fit()) takes about 6 ns.
constexpr std::uint64_t kPartitionCellsPerStep = 8;
// A pivot cell of may_fit()'s master programme takes about 0.7 ns (bench's capped 1,000-layer
// profile: 295 M cells in 0.2 s over its 372 multi-stage configurations).
constexpr std::uint64_t kMasterCellsPerStep = 64;
// A sweep costs about as much per task as a node of the search per this many tasks.
constexpr std::size_t kSweepTasksPerStep = 8;
// (Moment, stage) terms of MultiStagePeakBound's device bounds summed per step.
constexpr std::uint64_t kLevelCellsPerStep = 8;
// Stages whose full memory bound is kept per configuration (about 40 bytes each).
constexpr std::size_t kFullBoundsKept = 1 << 20;
// Cost evaluations of min_max_partition_bisected() per step (5-9 ns each with its table).
constexpr std::uint64_t kPartitionEvaluationsPerStep = 8;

struct Config;
int recompute_stop(const Config& config);

// One configuration: a micro-batch split (as tensor.chunk makes it), a checkpoint mode and a
// schedule. Chunk counts that give the same split are one configuration.
struct Config {
  std::vector<std::int64_t> sizes;
  int chunks = 0;  // the smallest chunk count that gives this split
  CheckpointMode checkpoint = CheckpointMode::Never;
  ScheduleKind schedule = ScheduleKind::GPipe;
  int stages_per_device = 1;  // > 1: a multi-stage schedule (searched by multi_stage_slice())
  double lower_bound = 0.0;   // on the iteration time of any balance

  bool multi_stage() const { return is_multi_stage(schedule); }

  int micro_batches() const { return static_cast<int>(sizes.size()); }
  bool recomputed(int i) const { return is_checkpointed(checkpoint, i, micro_batches()); }
};

// torchgpipe's checkpoint_stop: micro-batches [0, stop) are recomputed.
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

// What is needed to judge the candidates: the best plan of each configuration so far, and the
// threshold a configuration must beat to make the top N.
class Ranking {
 public:
  explicit Ranking(std::size_t size) : size_(std::max<std::size_t>(size, 1)) {}
  double threshold() const {
    return entries_.size() < size_ ? kInf : entries_[size_ - 1].iteration_ms;
  }
  void insert(PlanCandidate c) {
    auto at = std::upper_bound(entries_.begin(), entries_.end(), c.iteration_ms,
                               [](double t, const PlanCandidate& e) { return t < e.iteration_ms; });
    entries_.insert(at, std::move(c));
    if (entries_.size() > size_) entries_.pop_back();
  }
  std::vector<PlanCandidate> take() { return std::move(entries_); }

 private:
  std::size_t size_;
  std::vector<PlanCandidate> entries_;
};

// A lower bound on the simulated time of a multi-stage plan, and of every plan whose first stages
// are given. Device r works at least its stages' least work (forward with or without autograd,
// whole or split backward, over every micro-batch; recomputes and copies left out) plus a
// forward and a backward task's overhead per stage and micro-batch (busy). Its programme's first
// action, a forward of stage s, waits for some micro-batch's forward through the stages below s,
// none of them on r, and its copies across their boundaries (head); when its programme ends with
// a B or I of stage s, that micro-batch's gradient still has the stages below s and their
// boundaries to pass, none of them on r either (tail); a copy at the least bytes the boundary's
// layer outputs at any micro-batch size. The time is
// at least max over r of head + busy + tail. Stages are placed in order; each term only grows as
// more are placed, and a term that needs stages not yet placed counts 0, so the bound of a prefix
// holds for every completion.
class MultiStageBalanceBound {
 public:
  MultiStageBalanceBound(const CostModel& costs, const std::vector<std::int64_t>& sizes,
                         ScheduleKind kind, CheckpointMode checkpoint, int devices, int v,
                         std::vector<double> speed, double overhead, const Hardware& hardware)
      : stages_(devices * v), speed_(std::move(speed)), overhead_(overhead) {
    const int layers = costs.layer_count();
    work_.assign(layers + 1, 0.0);
    head_.assign(layers + 1, 0.0);
    tail_.assign(layers + 1, 0.0);
    least_output_.assign(layers, kInf);
    for (int k = 0; k < layers; ++k) {
      double work = 0.0, head = kInf, tail = kInf;
      for (std::int64_t size : sizes) {
        const SizeCosts& c = costs.at(size);
        const double forward = std::min(c.forward_ms[k], c.forward_nograd_ms[k]);
        work +=
            forward + std::min(c.backward_ms[k], c.backward_input_ms[k] + c.backward_weight_ms[k]);
        head = std::min(head, forward);
        tail = std::min(tail, std::min(c.backward_ms[k], c.backward_input_ms[k]));
        least_output_[k] = std::min(least_output_[k], static_cast<double>(c.output_bytes[k]));
      }
      work_[k + 1] = work_[k] + work;
      head_[k + 1] = head_[k] + head;
      tail_[k + 1] = tail_[k] + tail;
    }
    const int m = static_cast<int>(sizes.size());
    const Schedule schedule = make_schedule(kind, stages_, m, checkpoint, v);
    rank_ = schedule.stage_rank;
    // The link each boundary's copies take, as the simulator's: none where both stages are on
    // one device.
    link_.assign(stages_, nullptr);
    for (int t = 0; t + 1 < stages_; ++t) {
      if (rank_[t] == rank_[t + 1]) continue;
      link_[t] = &hardware.copy_link(rank_[t], rank_[t + 1]);
    }
    first_.assign(devices, 0);
    last_.assign(devices, -1);
    for (int r = 0; r < devices; ++r) {
      const auto& programme = schedule.per_rank[r];
      first_[r] = programme.front().stage;
      if (sends_gradient(programme.back().kind)) last_[r] = programme.back().stage;
    }
    fixed_ = overhead_ * 2.0 * v * m;
    busy_.assign(devices, 0.0);
    stage_work_.assign(stages_, 0.0);
    head_chain_.assign(stages_ + 1, 0.0);
    tail_chain_.assign(stages_ + 1, 0.0);
  }

  /// Stage t (placed after stages 0 … t − 1) holds layers [a, b).
  void place(int t, int a, int b) {
    const double speed = speed_[rank_[t]];
    stage_work_[t] = (work_[b] - work_[a]) / speed;
    busy_[rank_[t]] += stage_work_[t];
    // The chains cross the boundary after t too: an activation on the way in, a gradient (of
    // as many bytes) on the way back.
    const double copy = link_[t] ? link_[t]->transfer_ms(least_output_[b - 1]) : 0.0;
    head_chain_[t + 1] = head_chain_[t] + (head_[b] - head_[a]) / speed + overhead_ + copy;
    tail_chain_[t + 1] = tail_chain_[t] + (tail_[b] - tail_[a]) / speed + overhead_ + copy;
  }
  void unplace(int t) { busy_[rank_[t]] -= stage_work_[t]; }

  /// The bound with stages 0 … placed − 1 placed.
  double bound(int placed) const {
    double out = 0.0;
    for (std::size_t r = 0; r < busy_.size(); ++r) {
      double time = busy_[r] + fixed_;
      if (first_[r] <= placed) time += head_chain_[first_[r]];
      if (last_[r] >= 0 && last_[r] <= placed) time += tail_chain_[last_[r]];
      out = std::max(out, time);
    }
    return out;
  }

  /// The bound of one whole balance.
  double of(const std::vector<int>& balance) {
    int a = 0;
    for (int t = 0; t < stages_; ++t) {
      place(t, a, a + balance[t]);
      a += balance[t];
    }
    const double out = bound(stages_);
    for (int t = 0; t < stages_; ++t) unplace(t);
    return out;
  }

 private:
  int stages_;
  std::vector<double> speed_;  // per device (programme)
  double overhead_;
  std::vector<double> work_, head_, tail_;  // prefix sums over layers
  std::vector<double> least_output_;        // per layer, over the micro-batch sizes
  std::vector<int> rank_;                   // programme of each stage
  std::vector<const Link*> link_;           // per stage: its copies' to the next, or null
  std::vector<int> first_, last_;           // per programme: its first action's stage, and its
                                            // last's when a B or I (else -1)
  double fixed_ = 0.0;
  std::vector<double> busy_, stage_work_, head_chain_, tail_chain_;
};

// The relaxed roots' view of layers (docs/planner.md, "The relaxed root"): each layer's costs
// against its work, the least ratio bounding what a bound adds and the largest what it
// subtracts, per class of layers; layers without work add their quantity to the largest.
struct ClassRatio {
  std::vector<double> least, most;
  double workless = 0.0;
  explicit ClassRatio(int classes = 1) : least(classes, kInf), most(classes, 0.0) {}
  void add(int cls, double value, double work) {
    if (work > 0.0) {
      least[cls] = std::min(least[cls], value / work);
      most[cls] = std::max(most[cls], value / work);
    } else {
      workless += value;
    }
  }
  double lower(int cls) const { return least[cls] < kInf ? least[cls] : 0.0; }
};

// Layers grouped by the share of their forward in forward plus backward, in equal ranges of
// that share: one least ratio for all layers is loose when an embedding's backward is ten
// times its forward and a block's twice, so each class (a kind of layer, in most models) gets
// its own ratios and its own share of the work. Empty ranges are dropped.
struct RatioClasses {
  std::vector<int> of;       // per layer
  std::vector<double> work;  // per class: its layers' work
};
constexpr int kRatioClasses = 4;
RatioClasses ratio_classes(const std::vector<double>& layer_work, const SizeCosts& size) {
  const int layers = static_cast<int>(layer_work.size());
  auto share = [&](int x) {
    const double sum = size.forward_ms[x] + size.backward_ms[x];
    return sum > 0.0 ? size.forward_ms[x] / sum : 0.0;
  };
  double low = kInf, high = -kInf;
  for (int x = 0; x < layers; ++x) {
    if (!(layer_work[x] > 0.0)) continue;
    low = std::min(low, share(x));
    high = std::max(high, share(x));
  }
  // Shares that differ by rounding alone are one class: split, a profile whose every backward
  // is twice its forward got two classes of the same ratio, and its programmes twice the rows.
  const bool alike = !(high - low > 1e-9);
  std::vector<int> range(layers, 0);
  std::vector<int> used(kRatioClasses, -1);
  RatioClasses out;
  out.of.assign(layers, 0);
  for (int x = 0; x < layers; ++x) {
    if (!(layer_work[x] > 0.0) || alike) continue;
    range[x] = std::min(kRatioClasses - 1,
                        static_cast<int>(kRatioClasses * (share(x) - low) / (high - low)));
  }
  for (int x = 0; x < layers; ++x) {
    if (used[range[x]] < 0) {
      used[range[x]] = static_cast<int>(out.work.size());
      out.work.push_back(0.0);
    }
    out.of[x] = used[range[x]];
    out.work[out.of[x]] += layer_work[x];
  }
  if (out.work.empty()) out.work.push_back(0.0);
  return out;
}

// The balance whose stage ends lie nearest the running sums of `share` (a relaxed root's share
// of the work per stage) on `work`, the prefix sums of the layers' work; every stage keeps a
// layer. A first plan near the relaxed root's bound.
std::vector<int> rounded_balance(const std::vector<double>& work,
                                 const std::vector<double>& share) {
  const int layers = static_cast<int>(work.size()) - 1;
  const int stages = static_cast<int>(share.size());
  std::vector<int> balance(stages, 0);
  double share_end = 0.0;
  for (int k = 0, start = 0; k < stages; ++k) {
    share_end += share[k];
    int end =
        static_cast<int>(std::lower_bound(work.begin(), work.end(), share_end) - work.begin());
    if (end > start && end <= layers && share_end - work[end - 1] < work[end] - share_end) --end;
    end = std::clamp(end, start + 1, layers - (stages - 1 - k));
    if (k + 1 == stages) end = layers;
    balance[k] = end - start;
    start = end;
  }
  return balance;
}

// The fewest bytes a stage boundary can carry at a micro-batch size: the least output of a
// layer with a layer after it; infinity with one layer.
double least_boundary_bytes(const SizeCosts& size) {
  double least = kInf;
  for (std::size_t k = 0; k + 1 < size.output_bytes.size(); ++k)
    least = std::min(least, static_cast<double>(size.output_bytes[k]));
  return least;
}

// Some stage holds the heaviest layer whole, which continuous shares need not: the least over
// the stages of the programme with that stage's share of the layer's class at least the layer's
// work. Only where the layer is a sizeable part of a stage's share (a quarter or more), since it
// costs a fresh programme per stage and moves nothing otherwise. `floor`: the bound the caller
// has; as soon as one stage's programme is no higher, neither is the least, and it returns 0
// (the stage whose share of the class is largest in `shares` first, the likeliest to take the
// layer at no cost: on 3,000 layers and 32 stages the full loop was most of a plan's time).
double heaviest_layer_bound(const MinMaxShareProgramme& programme,
                            const std::vector<double>& layer_work, const RatioClasses& classes,
                            int stages, const std::vector<double>& shares, double floor,
                            std::uint64_t* cells = nullptr) {
  const auto heaviest = std::max_element(layer_work.begin(), layer_work.end());
  const double total = std::accumulate(layer_work.begin(), layer_work.end(), 0.0);
  if (heaviest == layer_work.end() || !(*heaviest * stages >= 0.25 * total)) return 0.0;
  const int cls = classes.of[static_cast<std::size_t>(heaviest - layer_work.begin())];
  const std::size_t block = static_cast<std::size_t>(cls) * stages;
  std::vector<int> order(stages);
  std::iota(order.begin(), order.end(), 0);
  if (shares.size() >= block + stages) {
    std::stable_sort(order.begin(), order.end(),
                     [&](int x, int y) { return shares[block + x] > shares[block + y]; });
  }
  double least = kInf;
  for (int s : order) {
    least = std::min(least, programme.solve_with_least(block + s, *heaviest, cells));
    if (!(least > floor)) return 0.0;
  }
  return least < kInf ? least : 0.0;
}

class PlanSearch {
 public:
  PlanSearch(const Profile& profile, const Hardware& hardware, const PlannerOptions& options)
      : profile_(profile),
        options_(options),
        costs_(profile),
        hardware_(hardware),
        simulator_(profile, hardware),
        stages_(static_cast<int>(hardware.devices.size())),
        layers_(static_cast<int>(profile.layers.size())),
        overhead_(hardware.launch_overhead_ms) {
    for (int j = 0; j < stages_; ++j) {
      speed_.push_back(hardware.devices[j].speed);
      capacity_.push_back(hardware.devices[j].memory_bytes);
      link_.push_back(j + 1 < stages_ ? &hardware.link_between(j, j + 1) : nullptr);
    }
    total_speed_ = std::accumulate(speed_.begin(), speed_.end(), 0.0);
    after_speed_.assign(stages_, 0.0);
    after_latency_.assign(stages_, 0.0);
    for (int j = stages_ - 2; j >= 0; --j) {
      after_speed_[j] = std::max(after_speed_[j + 1], speed_[j + 1]);
      // Links after stage j + 1, each crossed by an activation and a gradient.
      after_latency_[j] =
          j + 2 < stages_ ? after_latency_[j + 1] + 2.0 * link_[j + 1]->latency_ms : 0.0;
    }
    max_speed_ = *std::max_element(speed_.begin(), speed_.end());
  }

  PlanSearchResult run();
  StageWorkRows time_rows_of(const Plan& plan);

 private:
  enum class Objective { Time, Memory };

  std::vector<Config> configurations() const;
  void prepare(const Config& config);

  double busy(int j, int a, int b) const {
    return (work_[b] - work_[a]) / speed_[j] + overhead_ * tasks_per_stage_;
  }
  // Where the profile has launch times: what stage [a, b)'s host thread launches in one
  // iteration, one after another, whatever the device's speed (see host_bound).
  double host_busy(int a, int b) const { return host_work_[b] - host_work_[a] + host_per_stage_; }
  double host_root() const;
  // With autograd: a forward that is kept, and every recompute.
  double forward(const SizeCosts& c, int j, int a, int b) const {
    return c.forward_ms_sum(a, b) / speed_[j] + overhead_;
  }
  // A forward that may run with or without autograd, on a path the bounds follow (the least it
  // can take) or as work that fills a wait (the most): either way the bound stays a bound.
  double least_forward(const SizeCosts& c, int j, int a, int b) const {
    return std::min(c.forward_ms_sum(a, b), c.forward_nograd_ms_sum(a, b)) / speed_[j] + overhead_;
  }
  double most_forward(const SizeCosts& c, int j, int a, int b) const {
    return std::max(c.forward_ms_sum(a, b), c.forward_nograd_ms_sum(a, b)) / speed_[j] + overhead_;
  }
  double backward(const SizeCosts& c, int j, int a, int b) const {
    return c.backward_ms_sum(a, b) / speed_[j] + overhead_;
  }
  // A copy across the boundary after stage j, which ends at layer b.
  double copy(const SizeCosts& c, int j, int b) const {
    return link_[j]->transfer_ms(static_cast<double>(c.output_bytes[b - 1]));
  }
  double pass_filler(int j, int a, int b) const;
  double tail(int j, int a, int b) const;
  double chained_cost(int j, int a, int b, double recompute = 0.0) const;
  double balance_free_bound() const;
  template <typename Cost>
  double greedy_bound(Cost cost) const;
  void build_suffix_tables();
  std::vector<int> busy_balanced() const;
  std::vector<std::vector<int>> fit_ends(double share) const;
  int fitting_end(int j, int a, int end, int limit, double cap) const;
  bool capped() const {  // some device has a memory cap
    return std::any_of(capacity_.begin(), capacity_.end(), [](std::int64_t c) { return c > 0; });
  }
  bool some_balance_fits_nested() const;
  void evaluate_leaner_incumbents();
  void seed_leanest(const std::vector<Config>& configs);
  /// nested: without the received input and the sent output, whose sizes depend on where the
  /// stage starts and ends, so that the bound only grows as the stage grows at either end.
  std::int64_t memory_bound(int j, int a, int b, bool nested = false) const;
  std::int64_t full_memory_bound(int j, int a, int b, std::uint64_t walk_steps);
  // Whether stage j = [a, b) passes the nested memory bound (see build_suffix_tables()).
  bool fits_nested(int j, int a, int b) const { return fit_end_[j].empty() || b <= fit_end_[j][a]; }
  double time_bound(int j, int a, int b, double arrive, double drain) const;
  // `with_launches` false: the device's times alone, for the tables whose bounds must grow with
  // the stage's end as busy() does (a launch-paced tail or fill need not).
  StageDurations durations(int j, int a, int b, bool with_launches = true) const;
  struct Passes;
  double wait_bound(int j, int a, int b, const StageDurations& d, const Passes& before) const;
  struct Waits {
    double idle = 0.0, tail = 0.0;
  };
  Waits waits(int j, const StageDurations& d, int q, double trip_first, double trip_q) const;
  struct WaitTerms {
    struct Wait {
      bool first_trip = true;  // micro-batch 0's round trip, else q's
      double fill = 0.0;       // the stage's own work that can run meanwhile
    };
    std::array<Wait, 2> wait{};
    int count = 0;
    bool both = false;  // the waits cannot overlap: their excesses add up
    double tail = 0.0;
  };
  WaitTerms wait_terms(int j, const StageDurations& d, int q) const;
  // The relaxed root's programme, kept for capped_root(): its functions (every wait row and
  // cutting plane) and the layers' classes.
  struct RelaxedRows {
    std::vector<double> constant;
    std::vector<std::vector<double>> slope;
    std::vector<double> totals;  // per class
    std::vector<int> class_of;   // per layer
  };
  double relaxed_root(std::vector<int>& balance, RelaxedRows* rows = nullptr) const;
  double capped_root(const RelaxedRows& rows, double threshold, std::uint64_t step_limit,
                     bool& finished);
  double wait_cost(int j, int a, int b, double recompute_first = 0.0,
                   double recompute_q = 0.0) const;
  double recompute_root(double root, double ceiling) const;

  // The passes that bound stage j (see wait_bound): micro-batch 0's exact arrival and the
  // exact way back of the micro-batch that ends each stage's programme.
  struct Passes {
    double arrive = 0.0, drain_full = 0.0, drain_last = 0.0;
    // The host's: micro-batch 0's forward launches through the stages placed, and the launches
    // of the backward that ends every stage's programme back through them (see host_bound).
    double arrive_host = 0.0, drain_host = 0.0;
  };
  // Summed in another order than the simulator's: a hair below, so that a plan exactly as long
  // as its host's work is never pruned by rounding.
  double host_bound(int a, int b, const Passes& exact) const {
    return (exact.arrive_host + host_busy(a, b) + exact.drain_host) * (1.0 - 1e-12);
  }
  void search(int j, int a, double arrive, double drain, Passes exact, double worst,
              Objective objective);
  int first_open_end(int j, int a, double arrive, double drain, const Passes& exact) const;
  int last_stage_start(int j, int b, double offset, double limit) const;
  void evaluate(const std::vector<int>& balance, Objective objective);
  struct Move;
  std::vector<Move> local_moves() const;
  struct StageEnds;
  StageEnds stage_ends(const std::vector<int>& balance);
  std::vector<StageDurations> retime(const StageEnds& at, const Move& m);
  void restore(const std::vector<StageDurations>& kept, const Move& m);
  std::int64_t memory_excess(int k, int a, int b);
  bool polish(std::uint64_t step_limit);
  bool repair(std::vector<int>& balance, std::uint64_t step_limit);
  double threshold(Objective objective) const {
    return objective == Objective::Time ? std::min(config_best_, ranking_threshold_) : lean_best_;
  }

  const Profile& profile_;
  const PlannerOptions& options_;
  CostModel costs_;
  const Hardware& hardware_;
  Simulator simulator_;
  int stages_, layers_;
  double overhead_;
  std::vector<double> speed_;
  std::vector<std::int64_t> capacity_;
  std::vector<const Link*> link_;
  double total_speed_ = 0.0, max_speed_ = 0.0;
  std::vector<std::vector<int>> fit_end_;  // [j][a]: the furthest end fitting device j's cap
  StagePeakShape peak_shape_;              // of the configuration, for memory_bound()
  // full_memory_bound()'s stages of this configuration, by (j, a, b).
  std::unordered_map<std::uint64_t, std::int64_t> full_bounds_;

  // The configuration being searched.
  const Config* config_ = nullptr;
  const SizeCosts* first_size_ = nullptr;  // micro-batch 0's size
  const SizeCosts* last_size_ = nullptr;   // the last micro-batch's size
  std::vector<double> work_;               // prefix over layers of one iteration's compute
  int tasks_per_stage_ = 0;
  std::vector<double> before_, after_;  // one micro-batch's pass: prefix and suffix sums
  // Launch times (empty without): prefix sums over layers of a stage's launches in one
  // iteration, of micro-batch 0's forward launch, and of the last backward's launch.
  std::vector<double> host_work_, host_arrive_, host_drain_;
  double host_per_stage_ = 0.0, host_drain_per_stage_ = 0.0;
  void prepare_host(const Config& config);
  std::vector<std::vector<double>> suffix_, chained_;  // see build_suffix_tables()
  std::vector<std::vector<double>> fitting_;           // busy_balanced()'s table with caps
  // The same three tables made non-increasing in the suffix's start, for first_open_end().
  std::vector<std::vector<double>> suffix_floor_, chained_floor_, waits_floor_;
  std::vector<int> balance_;
  std::vector<StageDurations> durations_;       // of the stages placed, for the sweep
  std::unique_ptr<IterationSweep> sweep_;       // leaves of this configuration
  std::vector<double> pass_first_, pass_last_;  // suffix sums: see prepare()
  std::vector<double> after_speed_;             // fastest device after stage j
  // [j][b]: the least time of one pass (pass_first_, pass_last_) through layers [b, L) on the
  // stages after j at their own speeds, over the ways to place them that could beat the
  // threshold (see build_trip_tables()); empty: not built.
  std::vector<std::vector<double>> trip_first_, trip_last_;
  void build_trip_tables(double limit);
  double least_trip(const std::vector<double>& pass, const std::vector<std::vector<double>>& table,
                    int j, int b) const {
    return std::max(pass[b] / after_speed_[j], table.empty() ? 0.0 : table[j][b]);
  }
  std::vector<double> wait_before_;         // micro-batch 0's forward and the drain up to layer a
  std::vector<std::vector<double>> waits_;  // min-max of wait_cost() over suffixes
  int followed_ = 0;                        // the micro-batch whose way back wait_cost() follows
  std::vector<double> after_latency_;       // latencies of the links after stage j + 1
  double config_best_ = kInf;
  PlanCandidate config_best_candidate_;
  double ranking_threshold_ = kInf;

  // Nothing fits: the smallest largest peak found.
  double lean_best_ = kInf;
  std::optional<PlanCandidate> lean_candidate_;

  PlannerStats stats_;
  bool out_of_budget_ = false;
  std::uint64_t step_limit_ = 0;  // where the current slice of the search stops
  // Where a slice cut short stopped: per stage, the end it was at (0: from the start).
  std::vector<int> resume_;
  bool resuming_ = false;  // still on the path to resume_

  // build_suffix_tables()'s output for one configuration, kept between its slices.
  struct Tables {
    std::vector<std::vector<double>> suffix, chained, waits, suffix_floor, chained_floor,
        waits_floor, fitting;
    std::vector<std::vector<int>> fit_end;
  };
  void swap_tables(Tables& t);
  std::size_t table_bytes() const;
  std::size_t table_cache_bytes_ = 0;
  struct Entry;
  void polish_unpolished(std::vector<Entry>& entries);
  void store_tables(Entry& e);
  double ranking_threshold(const std::vector<Entry>& entries, const Entry* self) const;
  bool open(Entry& e, const std::vector<Entry>& entries, bool tables = true);
  void open_root(Entry& e, const std::vector<Entry>& entries);
  void keep(Entry& e);
  void search_slice(Entry& e, std::vector<Entry>& entries, std::uint64_t slice);
  // Multi-stage schedules (see multi_stage_slice()).
  double multi_stage_bound(const Config& c) const;
  Plan plan_of(const Config& c, std::vector<int> balance) const;
  PlanCandidate candidate_of(const Config& c, const Plan& plan, const SimulationResult& r) const;
  // r.fits(), and with worst_order_memory its worst arrival order's peaks fit as well (then
  // `worst` holds them, per device).
  bool fits(const Plan& plan, const SimulationResult& r, std::vector<std::int64_t>& worst);
  // Per device, the plan's peak in the worst arrival order (one simulation, a max-flow each;
  // not counted in the stats).
  std::vector<std::int64_t> worst_order_peaks_of(const Plan& plan);
  // Simulates `balance` for entry e, keeps it if it is e's best; its time, or infinity if it
  // does not fit (`excess`: by how much the largest peak exceeds its cap).
  struct Score {
    double excess = 0.0, time = 0.0;  // bytes over the tightest cap, simulated time
  };
  Score simulate_for(Entry& e, const std::vector<int>& balance,
                     std::vector<std::int64_t>* peaks = nullptr);
  // What a simulation costs: a step per task, and half a step per layer and micro-batch size
  // for the stages' memory walks (about 30 ns a layer: with one micro-batch on 120 layers
  // they were most of a simulation, and a budget of 10 M steps ran 2.6 s).
  std::uint64_t simulation_steps(const Config& c, const SimulationResult& r) const {
    const int sizes = c.sizes.front() == c.sizes.back() ? 1 : 2;
    return r.task_count + static_cast<std::uint64_t>(layers_ * sizes) / 2;
  }
  void multi_stage_root(Entry& e, const std::vector<Entry>& entries);
  struct LayerWork;
  struct RelaxedRootState;
  double multi_stage_relaxed_root(const Config& c, const LayerWork& work, std::uint64_t step_limit,
                                  double enough, std::unique_ptr<RelaxedRootState>& state,
                                  bool* complete, std::vector<std::vector<int>>* balances,
                                  StageWorkRows* rows);
  void multi_stage_slice(Entry& e, std::vector<Entry>& entries, std::uint64_t slice);
  void multi_stage_local_search(Entry& e, GraphSweep* sweep, std::uint64_t limit);
  // A configuration's balances timed without simulating them (GraphSweep), where that is exact;
  // null otherwise. Built per slice: a graph of every configuration held at once costs more
  // memory than its build costs time.
  std::unique_ptr<GraphSweep> graph_sweep(const Config& c);
  double swept_time(GraphSweep& sweep, const std::vector<int>& balance);
  bool fits_some_balance(Entry& e);
  bool fits_fast_enough(Entry& e, double limit);
  // Per schedule and stages per device: the last relaxed root's best model plan, each stage's
  // share of the work, where the next configuration's rounds start (see
  // multi_stage_relaxed_root()).
  std::map<std::pair<ScheduleKind, int>, std::vector<double>> model_start_;
  // Per stage of c, its device's share of the speeds: the share of the work that gives every
  // stage the same time.
  std::vector<double> equal_time_shares(const Config& c) const;
  void start_from(Entry& e, const std::vector<int>& balance);
  void first_multi_stage_plans(Entry& e, const LayerWork& work);
  void proxy_starts(Entry& e);
  std::vector<int> proxy_descent(MultiStagePeakBound& peak, const StageWorkRows& rows,
                                 std::vector<int> balance, const std::vector<double>& limit);
  // The peak bound of multi-stage configuration c, its walk over the schedule charged.
  MultiStagePeakBound& peak_bound(Entry& e);
  // What `peak`'s relaxations (may_fit()) cost: their partitions and master pivots.
  // The cells `peak`'s relaxations ran since `before` (its counts then).
  struct RelaxationCells {
    std::uint64_t partition = 0, pivot = 0;
  };
  static RelaxationCells cells_of(const MultiStagePeakBound& peak) {
    return {peak.partition_cells(), peak.pivot_cells()};
  }
  void charge_relaxation(const MultiStagePeakBound& peak, RelaxationCells before) {
    stats_.steps += (peak.partition_cells() - before.partition) / kPartitionCellsPerStep +
                    (peak.pivot_cells() - before.pivot) / kMasterCellsPerStep;
  }
  // Less memory excess, then less time.
  static bool better(const Score& x, const Score& y) {
    return x.excess < y.excess || (x.excess == y.excess && x.time < y.time);
  }
};

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

// Stage j's work after its backward of the micro-batch whose gradient the bounds follow back
// to stage 0: nothing for GPipe (micro-batch 0 ends it) and for 1F1B with equal micro-batches
// (the last one ends it); with a smaller last micro-batch, 1F1B follows the last full-size one,
// and the last one's backward (and recompute) still follow; on the last stage, whose warm-up is
// one forward, so does the last one's forward (counted at its most, so the bound stays one).
double PlanSearch::tail(int j, int a, int b) const {
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
double PlanSearch::pass_filler(int j, int a, int b) const {
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
double PlanSearch::chained_cost(int j, int a, int b, double recompute) const {
  const double own = before_[a] + busy(j, a, b) - tail(j, a, b);
  if (j + 1 == stages_) return own;
  return own + std::max(0.0, after_[b] + recompute - pass_filler(j, a, b));
}

// Bounds that hold for every balance of a configuration: no device can do more than its share
// of the work faster than all devices together, some stage holds the heaviest layer, and one
// micro-batch must go forward and one backward through every layer.
double PlanSearch::balance_free_bound() const {
  const double tasks = overhead_ * tasks_per_stage_;
  double heaviest = 0.0;
  for (int l = 0; l < layers_; ++l) heaviest = std::max(heaviest, work_[l + 1] - work_[l]);
  return std::max({work_[layers_] / total_speed_ + tasks, heaviest / max_speed_ + tasks,
                   before_[layers_] + 2.0 * overhead_ * stages_});
}

// The least possible largest stage cost, allowing empty stages (so a lower bound on the
// min-max with non-empty ones): binary search on the limit with a greedy fill, which is exact
// for costs that grow with a block's end and shrink as its start moves right.
template <typename Cost>
double PlanSearch::greedy_bound(Cost cost) const {
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

// The furthest start of the last stage over the balances of layers [a, L) into stages
// first..last - 1 whose stages all cost less than `limit`, for costs that grow with a stage's
// end and shrink as its start moves right: each stage ends as far right as it can. A stage that
// cannot take even its first layer is left empty rather than ruling the balances out: with
// devices of different speeds a balance may put that layer on a later stage. By induction the
// result is at least the start of the last stage of every such balance.
template <typename Cost>
int furthest_last_start(int first, int last, int a, int layers, double limit, Cost cost) {
  for (int k = first; k < last; ++k) {
    const int lo = a + 1, hi = layers - (last - k);
    if (lo > hi || !(cost(k, a, lo) < limit)) continue;
    a = last_holding(lo, hi, [&](int end) { return cost(k, a, end) < limit; });
  }
  return a;
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

// Two bounds on the stages not yet placed, for every suffix of layers:
//   suffix_[m][x]: the least busiest-stage time of [x, L) over the last m stages;
//   chained_[m][x]: the least largest chained_cost(); the search subtracts the part of the
//   before-pass that lies in stages it has already placed.
void PlanSearch::build_suffix_tables() {
  min_max_suffix(stages_, layers_, suffix_, [this](int j, int a, int b) { return busy(j, a, b); });
  min_max_suffix(stages_, layers_, chained_,
                 [this](int j, int a, int b) { return chained_cost(j, a, b); });
  // A stage that cannot fit its device is ruled out here too (infinitely slow; fit_end_, which
  // the caller computed): the nested memory bound only grows with the stage, so the table keeps
  // the monotony its search needs.
  // With caps, the first incumbent's table: the busiest stage among those passing the nested
  // memory bound, so that the first plan has a chance to fit.
  fitting_.clear();
  if (capped()) {
    min_max_suffix(stages_, layers_, fitting_, [this](int j, int a, int b) {
      return fits_nested(j, a, b) ? busy(j, a, b) : kInf;
    });
  }
  min_max_suffix(stages_, layers_, waits_, [this](int j, int a, int b) {
    if (!fits_nested(j, a, b)) return kInf;
    return wait_cost(j, a, b);
  });
  running_min(suffix_, suffix_floor_);
  running_min(chained_, chained_floor_);
  running_min(waits_, waits_floor_);
}

// From `end`, the furthest end up to `limit` at which stage j = [a, end) passes its nested
// memory bound under `cap` (the bound grows with the end).
int PlanSearch::fitting_end(int j, int a, int end, int limit, double cap) const {
  while (end < limit && static_cast<double>(memory_bound(j, a, end + 1, true)) <= cap) ++end;
  return end;
}

// Per stage and start, the furthest end whose nested memory bound fits `share` of the device
// (empty for a stage without a cap): it never moves left as the start moves right (the bound
// shrinks), so one pass per stage finds them all.
std::vector<std::vector<int>> PlanSearch::fit_ends(double share) const {
  std::vector<std::vector<int>> out(stages_);
  for (int j = 0; j < stages_; ++j) {
    if (capacity_[j] <= 0) continue;
    const double cap = share * static_cast<double>(capacity_[j]);
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
bool PlanSearch::some_balance_fits_nested() const {
  int start = 0;
  for (int j = 0; j < stages_; ++j) {
    const int most = layers_ - (stages_ - 1 - j);
    int end = most;
    if (capacity_[j] > 0)
      end = fitting_end(j, start, start, most, static_cast<double>(capacity_[j]));
    if (end <= start) return false;
    start = end;
  }
  return start == layers_;
}

// The busy-balanced plan fitting ever smaller shares of the caps, until one fits the simulator
// (the nested bound leaves out what crosses a stage's ends, so it can pass where the plan does
// not). Only a first incumbent: the search proper keeps the true caps.
void PlanSearch::evaluate_leaner_incumbents() {
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
std::vector<int> PlanSearch::busy_balanced() const {
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

// The full memory_bound() of stage j = [a, b), each stage walked once per configuration: the
// search meets one stage under many prefixes (bench's capped 1,000 x 16 profile, gpipe and 1f1b:
// 173,000 bounds of 3,500 stages), and the walks were a third of its time. A walk is charged
// `walk_steps`, a stage met again one step.
std::int64_t PlanSearch::full_memory_bound(int j, int a, int b, std::uint64_t walk_steps) {
  const auto ends = static_cast<std::uint64_t>(layers_) + 1;
  const std::uint64_t key =
      (static_cast<std::uint64_t>(j) * ends + static_cast<std::uint64_t>(a)) * ends +
      static_cast<std::uint64_t>(b);
  if (full_bounds_.size() >= kFullBoundsKept) full_bounds_.clear();
  auto [it, added] = full_bounds_.try_emplace(key, 0);
  if (added) {
    stats_.steps += walk_steps;
    it->second = memory_bound(j, a, b);
  } else {
    ++stats_.steps;
  }
  return it->second;
}

// A lower bound on the simulated peak of stage j's device (stage_peak_bound(), derived from the
// memory model's task effects); `nested` for the tables over suffixes.
std::int64_t PlanSearch::memory_bound(int j, int a, int b, bool nested) const {
  return stage_peak_bound(costs_, *first_size_, *last_size_, peak_shape_, j, a, b, nested);
}

// A lower bound on the simulated iteration time of any plan whose stage j is [a, b), given the
// time micro-batch 0 needs to reach stage j (`arrive`) and the time a full-size micro-batch's
// gradient needs to get back from stage j to stage 0 (`drain`).
double PlanSearch::time_bound(int j, int a, int b, double arrive, double drain) const {
  const double base = arrive + busy(j, a, b) - tail(j, a, b) + drain;
  if (j + 1 == stages_) return base;
  // The pass through the later stages and back (with its task overheads and the two copies
  // across this stage's boundary), less what of the stage's own work can fill the wait.
  const SizeCosts& onward = config_->schedule == ScheduleKind::GPipe ? *last_size_ : *first_size_;
  const double pass = after_[b] + 2.0 * overhead_ * (stages_ - 1 - j) + copy(onward, j, b) +
                      copy(*first_size_, j, b);
  return base + std::max(0.0, pass - pass_filler(j, a, b));
}

StageDurations PlanSearch::durations(int j, int a, int b, bool with_launches) const {
  return stage_durations(*first_size_, *last_size_, a, b, speed_[j], overhead_, link_[j],
                         j > 0 ? link_[j - 1] : nullptr, with_launches);
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
double PlanSearch::wait_bound(int j, int a, int b, const StageDurations& d,
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
  const double trip_first =
      least_trip(pass_first_, trip_first_, j, b) + onward + 2.0 * copy(*first_size_, j, b);
  const double trip_last =
      least_trip(pass_last_, trip_last_, j, b) + onward + 2.0 * copy(*last_size_, j, b);
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
PlanSearch::WaitTerms PlanSearch::wait_terms(int j, const StageDurations& d, int q) const {
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
PlanSearch::Waits PlanSearch::waits(int j, const StageDurations& d, int q, double trip_first,
                                    double trip_q) const {
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
double PlanSearch::wait_cost(int j, int a, int b, double recompute_first,
                             double recompute_q) const {
  const double own = wait_before_[a] + busy(j, a, b);
  const StageDurations d = durations(j, a, b, /*with_launches=*/false);
  const double onward = 2.0 * overhead_ * (stages_ - 1 - j) + after_latency_[j];
  const bool last = j + 1 == stages_;
  const double trip_first = last ? 0.0 : pass_first_[b] / max_speed_ + onward + recompute_first;
  const double trip_q = followed_ == config_->micro_batches() - 1
                            ? (last ? 0.0 : pass_last_[b] / max_speed_ + onward + recompute_q)
                            : (last ? 0.0 : trip_first - recompute_first + recompute_q);
  const Waits w = waits(j, d, followed_, trip_first, trip_q);
  return own - w.tail + (last ? 0.0 : w.idle);
}

// wait_bound() of every stage at once, with the stages' work shared out continuously (docs/
// planner.md, "The relaxed root"). The tables bound the stages not yet placed one at a time, so
// they must time every round trip through later stages at the fastest device's speed; here the
// trips go through the later stages at their own speeds, which is what decides the bubble when
// devices differ. Each stage j gets a share x_j of the iteration's work (work_); every quantity
// wait_bound() adds up over a stage's layers is bounded through its least (or, where it is
// subtracted, its largest) ratio to a layer's work, so that for every balance each stage's
// wait_bound() is at least a linear function of the shares, one per way its waits' excesses can
// be clipped at zero. The least largest of those functions over all shares (a linear programme,
// min_max_share_bound()) is at most the least largest wait_bound() over balances, so at most
// every plan's simulated time. Copies count their least size.
double PlanSearch::relaxed_root(std::vector<int>& balance, RelaxedRows* rows) const {
  const Config& c = *config_;
  const int m = c.micro_batches();
  const bool gpipe = c.schedule == ScheduleKind::GPipe;
  const bool uneven = m >= 2 && c.sizes.back() != c.sizes.front();
  const SizeCosts& f = *first_size_;
  const SizeCosts& l = *last_size_;
  std::vector<double> layer_work(layers_);
  for (int x = 0; x < layers_; ++x) layer_work[x] = work_[x + 1] - work_[x];
  const RatioClasses classes = ratio_classes(layer_work, f);
  const int n_classes = static_cast<int>(classes.work.size());
  auto ratio = [&] { return ClassRatio(n_classes); };
  // wait_bound()'s cases: the micro-batch q whose backward ends the waits and whose gradient
  // drains to stage 0 (GPipe: 0's, with the waits of M - 1; 1F1B: the last one, and with a
  // smaller last one also the last full-size one, M - 2, which follows micro-batch 0's trip).
  struct Case {
    int q;
    const SizeCosts* drained;
    bool q_trip_last;  // q's round trip is the last micro-batch's
    ClassRatio path;   // micro-batch 0's forward and q's backward through a stage
    std::vector<std::array<ClassRatio, 2>> fill;
    std::vector<ClassRatio> tail;
    // Per stage: its waits with every task its overhead alone (their shape, and the part of
    // the fillers and the tail that does not grow with the stage).
    std::vector<WaitTerms> overhead;
  };
  std::vector<Case> cases;
  cases.push_back({m - 1, gpipe ? &f : &l, true, ratio(), {}, {}, {}});
  if (!gpipe && uneven) cases.push_back({m - 2, &f, false, ratio(), {}, {}, {}});
  StageDurations overhead_only;
  overhead_only.forward = overhead_only.forward_nograd =
      overhead_only.backward = {overhead_, overhead_};
  for (Case& k : cases) {
    k.fill.assign(stages_, {ratio(), ratio()});
    k.tail.assign(stages_, ratio());
    for (int j = 0; j < stages_; ++j) k.overhead.push_back(wait_terms(j, overhead_only, k.q));
  }
  ClassRatio trip_first = ratio(), trip_last = ratio();
  for (int x = 0; x < layers_; ++x) {
    const double work = layer_work[x];
    const int cls = classes.of[x];
    trip_first.add(cls, pass_first_[x] - pass_first_[x + 1], work);
    trip_last.add(cls, pass_last_[x] - pass_last_[x + 1], work);
    // The device's times alone, as every bound here takes them: a task that the host's launches
    // pace takes longer, which can only make the iteration longer, so the bounds stay bounds.
    const StageDurations d = stage_durations(f, l, x, x + 1, 1.0, 0.0, nullptr, nullptr,
                                             /*with_launches=*/false);
    for (Case& k : cases) {
      k.path.add(
          cls,
          (c.recomputed(0) ? f.forward_nograd_ms[x] : f.forward_ms[x]) + k.drained->backward_ms[x],
          work);
      for (int j = 0; j < stages_; ++j) {
        const WaitTerms t = wait_terms(j, d, k.q);
        for (int i = 0; i < t.count; ++i) k.fill[j][i].add(cls, t.wait[i].fill, work);
        k.tail[j].add(cls, t.tail, work);
      }
    }
  }
  const double least_bytes[2] = {least_boundary_bytes(f), least_boundary_bytes(l)};
  auto least_copy = [&](int j, bool last_size) {
    const double bytes = least_bytes[last_size ? 1 : 0];
    return bytes < kInf ? link_[j]->transfer_ms(bytes) : 0.0;
  };
  // A row's slopes, one block of stages per class: a quantity of stage s at least (or, sign
  // -1, at most) its ratio to the stage's work in each class, over the stage's speed.
  const std::size_t width = static_cast<std::size_t>(n_classes) * stages_;
  auto add = [&](std::vector<double>& row, int s, const ClassRatio& r, double sign) {
    for (int k = 0; k < n_classes; ++k)
      row[k * stages_ + s] += sign * (sign > 0 ? r.lower(k) : r.most[k]) / speed_[s];
  };
  ClassRatio own = ratio();  // a stage's busy work is its work, exactly
  for (int k = 0; k < n_classes; ++k) own.least[k] = own.most[k] = 1.0;
  std::vector<double> constant;
  std::vector<std::vector<double>> slope;
  for (const Case& k : cases) {
    const bool drained_last = k.drained == &l;
    for (int j = 0; j < stages_; ++j) {
      // Micro-batch 0's forwards and q's backwards through the stages before j, with their
      // copies; stage j's own work, less what follows q's backward (1F1B's M - 2 case only).
      double base = overhead_ * tasks_per_stage_;
      std::vector<double> g(width, 0.0);
      for (int s = 0; s < j; ++s) {
        base += 2.0 * overhead_ + least_copy(s, false) + least_copy(s, drained_last);
        add(g, s, k.path, 1.0);
      }
      add(g, j, own, 1.0);
      if (k.q != m - 1) {
        base -= k.overhead[j].tail + k.tail[j].workless / speed_[j];
        add(g, j, k.tail[j], -1.0);
      }
      constant.push_back(base);
      slope.push_back(g);
      if (j + 1 == stages_) continue;
      // Each wait: the round trip through the later stages at their speeds, less the most of
      // stage j's work that fills it.
      const WaitTerms& t = k.overhead[j];
      const double onward = 2.0 * overhead_ * (stages_ - 1 - j) + after_latency_[j];
      std::array<double, 2> wait_constant{};
      std::array<std::vector<double>, 2> wait_slope;
      for (int i = 0; i < t.count; ++i) {
        const bool last_trip = !t.wait[i].first_trip && k.q_trip_last;
        wait_constant[i] = onward + 2.0 * least_copy(j, last_trip) - t.wait[i].fill -
                           k.fill[j][i].workless / speed_[j];
        wait_slope[i].assign(width, 0.0);
        for (int s = j + 1; s < stages_; ++s)
          add(wait_slope[i], s, last_trip ? trip_last : trip_first, 1.0);
        add(wait_slope[i], j, k.fill[j][i], -1.0);
      }
      // Every way of clipping the excesses: one at a time when they overlap, any set when they
      // add up.
      for (int mask = 1; mask < (1 << t.count); ++mask) {
        if (!t.both && (mask & (mask - 1)) != 0) continue;
        double a = base;
        std::vector<double> row = g;
        for (int i = 0; i < t.count; ++i) {
          if (!(mask & (1 << i))) continue;
          a += wait_constant[i];
          for (std::size_t x = 0; x < width; ++x) row[x] += wait_slope[i][x];
        }
        constant.push_back(a);
        slope.push_back(std::move(row));
      }
    }
  }
  // Paths of the iteration itself (cutting planes): every path of the task graph is at most the
  // simulated time, and its length is linear in the shares once each task is bounded by its
  // least ratios to the work. Solve, time the shares' own plan in that model, add its longest
  // path if it is longer than the bound, and solve again; each solution is a bound, and they
  // only grow. It stops when the model's plan is no longer than the bound (the continuous
  // model's optimum) or after a few rounds.
  std::array<std::array<ClassRatio, 2>, 4> task_ratio;  // [kind][slot], kinds as in PathCounts
  for (auto& kind : task_ratio) kind = {ratio(), ratio()};
  for (int x = 0; x < layers_; ++x) {
    for (int slot = 0; slot < 2; ++slot) {
      const SizeCosts& size = slot == 0 ? f : l;
      const double per[4] = {size.forward_ms[x], size.forward_nograd_ms[x], size.forward_ms[x],
                             size.backward_ms[x]};
      for (int kind = 0; kind < 4; ++kind)
        task_ratio[kind][slot].add(classes.of[x], per[kind], layer_work[x]);
    }
  }
  MinMaxShareProgramme programme(stages_, classes.work);
  for (std::size_t i = 0; i < constant.size(); ++i) programme.add(constant[i], slope[i]);
  std::vector<double> shares;
  double bound = programme.solve(&shares);
  std::vector<StageDurations> model(stages_);
  IterationSweep::PathCounts path;
  for (int round = 0; round < kRelaxedRootRounds; ++round) {
    for (int k = 0; k < stages_; ++k) {
      StageDurations& d = model[k];
      for (int slot = 0; slot < 2; ++slot) {
        auto time = [&](int kind) {
          double ms = overhead_;
          for (int x = 0; x < n_classes; ++x)
            ms += task_ratio[kind][slot].lower(x) * shares[x * stages_ + k] / speed_[k];
          return ms;
        };
        d.forward[slot] = time(0);
        d.forward_nograd[slot] = time(1);
        d.backward[slot] = time(3);
        d.activation_copy[slot] = k + 1 < stages_ ? least_copy(k, slot == 1) : 0.0;
        d.gradient_copy[slot] = k > 0 ? least_copy(k - 1, slot == 1) : 0.0;
      }
    }
    const double longest = sweep_->run_critical_path(model, path);
    if (!(longest > bound * (1.0 + 1e-9))) break;
    double a = 0.0;
    std::vector<double> row(width, 0.0);
    for (int k = 0; k < stages_; ++k) {
      for (int kind = 0; kind < 4; ++kind) {
        for (int slot = 0; slot < 2; ++slot) {
          const int n = path.tasks[k][kind * 2 + slot];
          a += n * overhead_;
          add(row, k, task_ratio[kind][slot], n);
        }
      }
      for (int slot = 0; slot < 2; ++slot) {
        if (k + 1 < stages_)
          a += (path.copies[k][slot] + path.copies[k][2 + slot]) * least_copy(k, slot == 1);
      }
    }
    programme.add(a, row);
    constant.push_back(a);
    slope.push_back(std::move(row));
    bound = std::max(bound, programme.solve(&shares));
  }
  if (rows != nullptr) *rows = {constant, slope, classes.work, classes.of};
  bound =
      std::max(bound, heaviest_layer_bound(programme, layer_work, classes, stages_, shares, bound));
  // The shares' plan, rounded to layer boundaries: a first plan near the bound.
  std::vector<double> stage_share(stages_, 0.0);
  for (int k = 0; k < stages_; ++k)
    for (int x = 0; x < n_classes; ++x) stage_share[k] += shares[x * stages_ + k];
  balance = rounded_balance(work_, stage_share);
  return std::max(0.0, bound * (1.0 - 1e-12));
}

// The relaxed root under the memory caps. The relaxed root shares the work continuously and
// knows nothing of the caps, which decide where the stage ends may go when a few layers hold
// most of a stage's memory. A stage that fits passes its nested memory bound, so it ends at
// most at fit_end_[j][its start], which only grows with the start. This searches intervals
// [lo_j, hi_j] of the ends, best-first: each node's intervals are narrowed until consistent
// (stage j starting at its latest start reaches at most fit_end_ of it; starting at its
// earliest, it must reach the next end), then its bound is the relaxed root's programme with
// every class's work before end j kept between that class's work before lo_j and before hi_j
// (true of every balance whose ends lie in the intervals). Where the programme's shares put a
// stage over what fits, the wider of its two ends is split at the shares' position. The
// children cover their parent, so the least bound over the open nodes bounds every balance
// that fits; it stops when that node's shares fit as they are, when it reaches `threshold`,
// after kCappedRootNodes nodes, or at `step_limit`: only then is `finished` false (the caller
// runs it again with a larger allowance).
double PlanSearch::capped_root(const RelaxedRows& rows, double threshold, std::uint64_t step_limit,
                               bool& finished) {
  finished = true;
  constexpr int kCappedRootNodes = 64;
  const int k_stages = stages_, n_classes = static_cast<int>(rows.totals.size());
  auto reach = [&](int j, int a) {  // the furthest end of stage j from start a that may fit
    return fit_end_[j].empty() ? layers_ : fit_end_[j][std::min(a, layers_ - 1)];
  };
  // Class c's work in layers [0, t) (work_ is all classes').
  std::vector<std::vector<double>> before(n_classes, std::vector<double>(layers_ + 1, 0.0));
  for (int t = 0; t < layers_; ++t) {
    for (int c = 0; c < n_classes; ++c) before[c][t + 1] = before[c][t];
    before[rows.class_of[t]][t + 1] += work_[t + 1] - work_[t];
  }
  struct Node {
    double value;
    std::vector<int> lo, hi;  // per end 0..K (0 and K fixed)
    std::vector<double> at;   // the shares' ends, in layers (continuous)
    // Its programme, solved: a child copies it and adds the constraints of the ends its
    // narrowing moved, going on from this basis (a fresh programme costs O(rows^2) a function
    // and a solve from the slacks).
    std::shared_ptr<const MinMaxShareProgramme> programme;
    bool operator>(const Node& o) const { return value > o.value; }
  };
  auto narrow = [&](std::vector<int>& lo, std::vector<int>& hi) {
    for (bool changed = true; changed;) {
      changed = false;
      for (int j = 0; j < k_stages; ++j) {
        auto lower_to = [&](int& v, int to) {
          if (to < v) v = to, changed = true;
        };
        auto raise_to = [&](int& v, int to) {
          if (to > v) v = to, changed = true;
        };
        if (lo[j] > hi[j] || lo[j] >= layers_) return false;
        lower_to(hi[j + 1], reach(j, hi[j]));
        raise_to(lo[j + 1], lo[j] + 1);
        lower_to(hi[j], hi[j + 1] - 1);
        int a = lo[j];
        while (a <= hi[j] && reach(j, a) < lo[j + 1]) ++a;
        raise_to(lo[j], a);
      }
      for (int j = 0; j <= k_stages; ++j)
        if (lo[j] > hi[j]) return false;
    }
    return lo[0] == 0 && hi[k_stages] == layers_;
  };
  // `parent`: the node it was split from (its programme solved), or none for the root.
  auto solve = [&](Node& node, const Node* parent) {
    auto programme = parent ? std::make_shared<MinMaxShareProgramme>(*parent->programme)
                            : std::make_shared<MinMaxShareProgramme>(
                                  static_cast<std::size_t>(k_stages), rows.totals);
    const std::uint64_t cells = programme->pivot_cells();
    if (parent) {
      stats_.steps += programme->tableau_cells() / kPivotCellsPerStep;  // the copy
    } else {
      for (std::size_t i = 0; i < rows.constant.size(); ++i)
        programme->add(rows.constant[i], rows.slope[i]);
    }
    for (int j = 1; j < k_stages; ++j) {
      // Only what is tighter than the parent's (its constraints hold here too).
      const bool low = node.lo[j] > (parent ? parent->lo[j] : j);
      const bool high = node.hi[j] < (parent ? parent->hi[j] : layers_ - (k_stages - j));
      for (int c = 0; c < n_classes && (low || high); ++c) {
        std::vector<double> a(static_cast<std::size_t>(n_classes) * k_stages, 0.0);
        for (int s = 0; s < j; ++s) a[c * k_stages + s] = 1.0;
        if (low) programme->add_constraint(a, before[c][node.lo[j]]);
        for (double& v : a) v = -v;
        if (high) programme->add_constraint(a, -before[c][node.hi[j]]);
      }
    }
    std::vector<double> shares;
    node.value = std::max(node.value, programme->solve(&shares));
    if (parent) {
      stats_.steps += (programme->pivot_cells() - cells) / kPivotCellsPerStep;
    } else {
      // The root's programme built afresh (measured: four steps per tableau cell; the
      // constraints' columns count as functions).
      const std::uint64_t columns =
          programme->functions() + 2 * static_cast<std::uint64_t>(n_classes) * k_stages;
      stats_.steps += 4 * columns * static_cast<std::uint64_t>(n_classes * k_stages + 1);
    }
    node.programme = std::move(programme);
    node.at.assign(k_stages + 1, 0.0);
    double work = 0.0;
    for (int j = 1; j <= k_stages; ++j) {
      for (int c = 0; c < n_classes; ++c) work += shares[c * k_stages + j - 1];
      const auto t = std::lower_bound(work_.begin(), work_.end(), work);
      const int x = std::clamp(static_cast<int>(t - work_.begin()), 1, layers_);
      const double span = work_[x] - work_[x - 1];
      node.at[j] = x - 1 + (span > 0.0 ? std::clamp((work - work_[x - 1]) / span, 0.0, 1.0) : 1.0);
    }
  };
  Node root{0.0, std::vector<int>(k_stages + 1), std::vector<int>(k_stages + 1), {}, {}};
  for (int j = 0; j <= k_stages; ++j) {
    root.lo[j] = j;
    root.hi[j] = layers_ - (k_stages - j);
  }
  root.hi[0] = 0;
  root.lo[k_stages] = layers_;
  if (!narrow(root.lo, root.hi)) return kInf;  // no balance passes the nested memory bounds
  solve(root, nullptr);
  std::priority_queue<Node, std::vector<Node>, std::greater<>> open;
  open.push(std::move(root));
  for (int expanded = 0; expanded < kCappedRootNodes; ++expanded) {
    if (open.empty()) return kInf;
    if (open.top().value >= threshold) break;
    if (stats_.steps >= step_limit) {
      finished = false;
      break;
    }
    Node node = open.top();
    open.pop();
    // The stage the shares put furthest over what fits, and the wider of its ends.
    int over = -1, most = 0;
    for (int j = 0; j < k_stages; ++j) {
      const int a = std::clamp(static_cast<int>(std::lround(node.at[j])), node.lo[j], node.hi[j]);
      const int b =
          std::clamp(static_cast<int>(std::lround(node.at[j + 1])), node.lo[j + 1], node.hi[j + 1]);
      if (a < layers_ && b - reach(j, a) > most) most = b - reach(j, a), over = j;
    }
    if (over < 0) {
      open.push(std::move(node));  // consistent: splitting it would not see the caps
      break;
    }
    int end = -1;
    for (int j : {over, over + 1}) {
      if (j == 0 || j == k_stages || node.lo[j] == node.hi[j]) continue;
      if (end < 0 || node.hi[j] - node.lo[j] > node.hi[end] - node.lo[end]) end = j;
    }
    if (end < 0) continue;  // both ends fixed and still over: nothing of it fits (narrow missed it)
    const int split =
        std::clamp(static_cast<int>(std::lround(node.at[end])), node.lo[end], node.hi[end] - 1);
    for (const auto& [from, to] :
         {std::pair{node.lo[end], split}, std::pair{split + 1, node.hi[end]}}) {
      Node child{node.value, node.lo, node.hi, {}, {}};
      child.lo[end] = from;
      child.hi[end] = to;
      if (!narrow(child.lo, child.hi)) continue;
      solve(child, &node);
      open.push(std::move(child));
    }
  }
  // A hair below, as the relaxed root: rounding never rules out a plan as long as the bound.
  return open.empty() ? kInf : open.top().value * (1.0 - 1e-12);
}

// The root bound with 1F1B's round trips waiting, on the last stage, for their recomputes
// (tests/sim/stage_timing_test.cpp checks that wait against the simulator). The last stage's
// layers are unknown, so for a threshold T:
// if a balance had every stage's chained_cost() and wait_cost() below T, its last stage would
// start no later than c = furthest_last_start(), so it would hold [c, L) and each round trip
// would wait at least for the recompute of [c, L); if even with that the stages cannot stay
// below T, no balance can, and T is a bound. Bisection finds the largest such T up to
// `ceiling`.
double PlanSearch::recompute_root(double root, double ceiling) const {
  const Config& c = *config_;
  const int m = c.micro_batches();
  if (c.schedule != ScheduleKind::OneFOneB || !c.recomputed(0) || stages_ < 2) return root;
  const int last = stages_ - 1;
  auto stage_cost = [&](int j, int a, int b, double r_first, double r_q, double r_pass) {
    if (!fits_nested(j, a, b)) return kInf;
    return std::max(chained_cost(j, a, b, r_pass), wait_cost(j, a, b, r_first, r_q));
  };
  // The furthest start of the last stage, or -1 when even that stage is not below `limit`.
  auto furthest = [&](double limit, double r_first, double r_q, double r_pass) {
    const int start = furthest_last_start(0, last, 0, layers_, limit, [&](int j, int a, int b) {
      return stage_cost(j, a, b, r_first, r_q, r_pass);
    });
    return stage_cost(last, start, layers_, 0.0, 0.0, 0.0) < limit ? start : -1;
  };
  const SizeCosts& q_size = followed_ == m - 1 ? *last_size_ : *first_size_;
  auto ruled_out = [&](double limit) {
    const int start = furthest(limit, 0.0, 0.0, 0.0);
    if (start < 0) return true;
    const double r_first = forward(*first_size_, last, start, layers_);
    const double r_q = c.recomputed(followed_) ? forward(q_size, last, start, layers_) : 0.0;
    // chained_cost follows the last full-size micro-batch and micro-batch 0 (pass_filler).
    const int p = m >= 2 && c.sizes.back() != c.sizes.front() ? m - 2 : m - 1;
    const double r_pass = c.recomputed(p) ? r_first : 0.0;
    return furthest(limit, r_first, r_q, r_pass) < 0;
  };
  if (!(ceiling > root)) return root;
  if (ruled_out(ceiling)) return ceiling;
  double lo = root, hi = ceiling;  // lo: ruled out (a bound), hi: not
  for (int step = 0; step < 16 && hi - lo > 1e-6 * hi; ++step) {
    const double mid = 0.5 * (lo + hi);
    (ruled_out(mid) ? lo : hi) = mid;
  }
  return lo;
}

void PlanSearch::evaluate(const std::vector<int>& balance, Objective objective) {
  const Config& c = *config_;
  Plan plan;
  plan.balance = balance;
  plan.chunks = c.chunks;
  plan.checkpoint = c.checkpoint;
  plan.schedule = c.schedule;
  plan.optimizer_state_factor = options_.optimizer_state_factor;
  if (objective == Objective::Time) {
    // The sweep gives the time (durations_ holds the balance's stages); only a plan that would
    // be the new best needs the simulator, for its memory.
    const double time = sweep_->run(durations_);
    ++stats_.sweeps;
    stats_.steps += sweep_->task_count() / kSweepTasksPerStep;
    if (!(time < config_best_)) return;
  }
  SimulationOptions lean;
  lean.record_tasks = false;
  lean.record_memory = false;
  const SimulationResult r = simulator_.run(plan, lean);
  ++stats_.simulations;
  stats_.steps += simulation_steps(c, r);

  auto candidate = [&] { return candidate_of(c, plan, r); };
  if (objective == Objective::Time) {
    std::vector<std::int64_t> worst;
    if (r.iteration_ms < config_best_ && fits(plan, r, worst)) {
      config_best_ = r.iteration_ms;
      config_best_candidate_ = candidate();
      config_best_candidate_.worst_order_peak_bytes = std::move(worst);
    }
  }
  // Every simulated plan is a candidate for the leanest, which the report gives when nothing
  // fits: the search for time has simulated the first plans of every configuration already.
  const double peak = static_cast<double>(r.max_peak_memory_bytes());
  if (peak < lean_best_) {
    lean_best_ = peak;
    lean_candidate_ = candidate();
  }
}

// Moves of a local search over balances: one stage end by up to four layers, two adjacent ends
// by up to three each, and three to five adjacent ends together by one or two layers (work
// passed along several stages at once, as 1F1B's balance wants: a stage's share depends on its
// place in the pipeline).
struct PlanSearch::Move {
  int k, d, e;  // end k moves by d, end k + 1 by e
  int run = 0;  // > 0: ends k..k + run all move by d (e unused)
  int last_stage() const { return run > 0 ? k + run + 1 : e != 0 ? k + 2 : k + 1; }
};

std::vector<PlanSearch::Move> PlanSearch::local_moves() const {
  constexpr int kReach = 4, kLongestRun = 4;
  std::vector<Move> moves;
  for (int k = 0; k + 1 < stages_; ++k) {
    for (int d = -kReach; d <= kReach; ++d)
      if (d != 0) moves.push_back({k, d, 0});
  }
  for (int k = 0; k + 2 < stages_; ++k) {
    for (int d = 1 - kReach; d < kReach; ++d) {
      for (int e = 1 - kReach; e < kReach; ++e)
        if (d != 0 && e != 0) moves.push_back({k, d, e});
    }
  }
  for (int run = 2; run <= kLongestRun; ++run) {
    for (int k = 0; k + run + 1 < stages_; ++k) {
      for (int d : {-2, -1, 1, 2}) moves.push_back({k, d, 0, run});
    }
  }
  return moves;
}

// A balance as its stages' ends, with durations_ holding each stage's durations.
struct PlanSearch::StageEnds {
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

PlanSearch::StageEnds PlanSearch::stage_ends(const std::vector<int>& balance) {
  StageEnds s;
  for (int k = 0, end = 0; k < stages_; ++k) s.ends.push_back(end += balance[k]);
  for (int k = 0; k < stages_; ++k) durations_[k] = durations(k, s.start(k), s.ends[k]);
  return s;
}

// durations_ of the stages move `m` changed, as `at` has them now; returns what they were, for
// restore().
std::vector<StageDurations> PlanSearch::retime(const StageEnds& at, const Move& m) {
  std::vector<StageDurations> kept(durations_.begin() + m.k,
                                   durations_.begin() + m.last_stage() + 1);
  for (int k = m.k; k <= m.last_stage(); ++k) durations_[k] = durations(k, at.start(k), at.ends[k]);
  return kept;
}

void PlanSearch::restore(const std::vector<StageDurations>& kept, const Move& m) {
  std::copy(kept.begin(), kept.end(), durations_.begin() + m.k);
}

// By how much stage k = [a, b)'s memory bound exceeds its device's cap (0 without one). The
// bound walks the stage's layers, counted like a sweep, the first time the configuration meets
// the stage (full_memory_bound()).
std::int64_t PlanSearch::memory_excess(int k, int a, int b) {
  if (capacity_[k] <= 0) return 0;
  const std::int64_t bound =
      full_memory_bound(k, a, b, 1 + static_cast<std::uint64_t>(b - a) / kSweepTasksPerStep);
  return std::max<std::int64_t>(0, bound - capacity_[k]);
}

// A first-improvement local search around the configuration's best plan (local_moves(), tried
// in turn, on from the last one that improved, until every move has failed in a row) or until
// `step_limit`. The depth-first search proves and this finds: a plan a few layers away from the
// first ones is often faster, more so under memory caps, where the search's order (stage by
// stage, ends from the left) reaches it late. Each plan is timed by the sweep and kept only if
// the simulator says it fits, as the search's leaves are, so the answer stays the simulator's;
// a stage whose memory bound exceeds its cap is not timed at all. True when no move improves
// the best plan.
bool PlanSearch::polish(std::uint64_t step_limit) {
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
    if (stats_.steps >= step_limit) return false;
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
bool PlanSearch::repair(std::vector<int>& balance, std::uint64_t step_limit) {
  StageEnds at = stage_ends(balance);
  std::vector<std::int64_t> excess(stages_);
  for (int k = 0; k < stages_; ++k) excess[k] = memory_excess(k, at.start(k), at.ends[k]);
  const std::vector<Move> moves = local_moves();
  for (int step = 0; step < 4 * layers_ && stats_.steps < step_limit; ++step) {
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
          stats_.steps += sweep_->task_count() / kSweepTasksPerStep;
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

// Depth-first over stage j's last layer. `arrive`/`drain`: micro-batch passes through the
// stages already placed (see time_bound); `worst`: the largest bound of those stages.
// The least end b of stage j that the bounds on the later stages do not rule out. Each of those
// bounds is at least its value with the passes through stage j left out, and at least the
// floor of that value (running_min), which only falls as b grows, so binary search finds where
// it drops below the threshold; ends before it need not be examined one by one.
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

void PlanSearch::search(int j, int a, double arrive, double drain, Passes exact, double worst,
                        Objective objective) {
  if (out_of_budget_) return;
  const bool last = j + 1 == stages_;
  const int remaining = stages_ - 1 - j;
  const int b_end = last ? layers_ : layers_ - remaining;
  const SizeCosts& drain_size = *first_size_;  // the micro-batch q of prepare()
  int b_start = last ? layers_ : a + 1;
  if (!last && objective == Objective::Time) b_start = first_open_end(j, a, arrive, drain, exact);
  // Resuming a slice cut short: every end before the path it stopped on was searched already.
  const int resume_b = resuming_ ? resume_[j] : 0;
  b_start = std::max(b_start, resume_b);
  for (int b = b_start; b <= b_end; ++b) {
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
    if (arrive + busy(j, a, b) - tail(j, a, b) + drain >= limit) break;
    // The nested memory bound only grows with b either: no further end fits.
    if (!fits_nested(j, a, b)) break;
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
      const double trip_last =
          least_trip(pass_last_, trip_last_, j, b) + onward_tasks + 2.0 * copy(*last_size_, j, b);
      const Config& c = *config_;
      const int m = c.micro_batches();
      // (1F1B's recompute on the last stage could be added the same way, but the greedy fill
      // costs more time than the pruning saves; recompute_root() uses it at the root.)
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
      ++stats_.prefix_sweeps;
      stats_.steps += 1 + sweep_->prefix_task_count(j) / kSweepTasksPerStep;
      bound = std::max(bound, sweep_->run_prefix(durations_, j, trip_first, trip_last));
      if (bound >= limit) continue;
    }
    search(j + 1, b, next_arrive, next_drain, onward, bound, objective);
    if (out_of_budget_) return;  // resume_ holds where the child stopped
  }
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
  if (!(limit < kInf) || stages_ < 2) return;
  const int last = stages_ - 1;
  auto fits = [&](int k, int a, int e) {
    return fits_nested(k, a, e) && chained_cost(k, a, e) < limit;
  };
  // furthest[k][a]: the furthest end of stage k from a that fits, a when none does.
  std::vector<std::vector<int>> furthest(stages_, std::vector<int>(layers_ + 1, 0));
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

// Each configuration's state between its slices of the search.
struct PlanSearch::Entry {
  const Config* config = nullptr;
  double root = 0.0;               // lower bound on every plan of the configuration
  double best = kInf;              // its best fitting plan so far
  PlanCandidate candidate;         // that plan
  std::uint64_t slice = 0;         // the steps its last slice was given
  std::vector<int> resume;         // where its last slice stopped (see search())
  std::unique_ptr<Tables> tables;  // its tables between slices (store_tables())
  // Multi-stage: its local search has found a local optimum (the enumeration goes on).
  bool settled = false;
  int move = 0;           // multi-stage: the layers the local search moves at a time, 0: not yet
  bool widening = false;  // multi-stage: past one layer, the moves grow again
  bool ranged = false;    // multi-stage: no move between stages further apart improves either
  std::vector<std::vector<int>> relaxed;  // multi-stage: the relaxed root's plans, rounded
  std::vector<int> balance;               // multi-stage: the local search's current balance
  Score score;                            // and its score
  std::vector<std::int64_t> peaks;        // and its simulated peak per device
  // Multi-stage: fitting starts the local search descends from once its current descent ends
  // (one descent from the best start alone ended on 2.5 % slower plans than from another).
  std::vector<std::vector<int>> starts;
  int kicks = 0;  // multi-stage: starts made by kicking the best plan (multi_stage_local_search())
  // Multi-stage: the local search starts over from `b` (its score and peaks), the widest moves
  // first (move 0 until a slice sets it).
  void restart_at(std::vector<int> b, const Score& s, std::vector<std::int64_t> p) {
    balance = std::move(b);
    score = s;
    peaks = std::move(p);
    settled = ranged = widening = false;
    move = 0;
  }
  ConfigurationStats stats;  // what was spent on it
  bool closed = false;       // searched to the end, or ruled out by a bound
  double polished = kInf;    // the best plan polish() last started from
  // With memory caps, the relaxed root's programme until capped_root() has used it.
  std::unique_ptr<RelaxedRows> capped_rows;
  // Multi-stage: the relaxed root ran all its rounds (else a slice runs it on, further).
  bool root_complete = false;
  // Multi-stage: where the relaxed root's rounds stopped, until they are complete.
  std::unique_ptr<RelaxedRootState> root_state;
  // Multi-stage, under caps: MultiStagePeakBound::may_fit() has run (it waits for the first
  // slice once the cheap pass has spent half the budget).
  bool fit_checked = false;
  // Multi-stage, under caps: the relaxed root's rows, for may_fit() with the time, and the
  // least plan to beat that it was asked about.
  std::unique_ptr<StageWorkRows> time_rows;
  double fast_checked = kInf;
  // Multi-stage, under caps: its MultiStagePeakBound, built once (peak_bound()).
  std::unique_ptr<MultiStagePeakBound> peak;
};

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
  e.root = std::max({e.root, relaxed_root(relaxed, &relaxed_rows), host_root()});
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
  e.stats.evaluated = true;
  keep(e);
  store_tables(e);
}

void PlanSearch::keep(Entry& e) {
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
  constexpr std::size_t kTableCacheBytes = std::size_t{128} << 20;
  if (e.closed || e.tables || table_cache_bytes_ + table_bytes() > kTableCacheBytes) return;
  e.tables = std::make_unique<Tables>();
  swap_tables(*e.tables);
  table_cache_bytes_ += table_bytes();
}

std::size_t PlanSearch::table_bytes() const {
  // suffix_, chained_, waits_, their floors, fitting_: doubles; fit_end_: ints.
  const std::size_t cells = static_cast<std::size_t>(stages_ + 1) * (layers_ + 1);
  return cells * (7 * sizeof(double) + sizeof(int));
}

void PlanSearch::swap_tables(Tables& t) {
  std::swap(suffix_, t.suffix);
  std::swap(chained_, t.chained);
  std::swap(waits_, t.waits);
  std::swap(suffix_floor_, t.suffix_floor);
  std::swap(chained_floor_, t.chained_floor);
  std::swap(waits_floor_, t.waits_floor);
  std::swap(fitting_, t.fitting);
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
  step_limit_ = std::min(options_.search_budget, stats_.steps + slice);
  out_of_budget_ = false;
  // The capped root and the polish take half the slice at most between them, so that the
  // search gets the rest (and its resume point is not lost to an empty slice).
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
  resume_ = e.resume;
  resuming_ = !resume_.empty();
  if (!resuming_) resume_.assign(stages_, 0);
  if (e.best < e.polished) {
    // Half the slice at most: the search still gets the rest, now against a lower threshold.
    if (polish(half_slice)) e.polished = config_best_;
  }
  build_trip_tables(threshold(Objective::Time));
  search(0, 0, 0.0, 0.0, {}, 0.0, Objective::Time);
  resuming_ = false;
  e.resume = resume_;
  e.slice = slice;
  ++e.stats.slices;
  e.stats.nodes += stats_.nodes - nodes;
  e.stats.steps += stats_.steps - steps;
  if (!out_of_budget_) e.closed = true;
  keep(e);
  store_tables(e);
}

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
//   back, at best at the fastest speed; its copies left out.
double PlanSearch::multi_stage_bound(const Config& c) const {
  const int v = c.stages_per_device, m = c.micro_batches(), stages = v * stages_;
  const bool split = splits_backward(c.schedule);
  std::vector<double> layer_work(layers_, 0.0);
  for (std::int64_t size : c.sizes) {
    const SizeCosts& s = costs_.at(size);
    for (int k = 0; k < layers_; ++k) {
      layer_work[k] += std::min(s.forward_ms[k], s.forward_nograd_ms[k]) +
                       std::min(s.backward_ms[k], s.backward_input_ms[k] + s.backward_weight_ms[k]);
    }
  }
  const SizeCosts& first = costs_.at(c.sizes.front());
  double chain = 0.0;
  for (int k = 0; k < layers_; ++k) {
    chain +=
        std::min(first.forward_ms[k], first.forward_nograd_ms[k]) +
        (split ? std::min(first.backward_input_ms[k], first.backward_ms[k]) : first.backward_ms[k]);
  }
  const double total = std::accumulate(layer_work.begin(), layer_work.end(), 0.0);
  const double heaviest = *std::max_element(layer_work.begin(), layer_work.end());
  const double tasks = overhead_ * 2.0 * v * m;
  return std::max({total / total_speed_ + tasks, heaviest / max_speed_ + tasks,
                   chain / max_speed_ + overhead_ * 2.0 * stages});
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

// Each layer's share of a configuration's work: its forward and backward at every micro-batch
// (the multi-stage relaxed root's shares are of this), and the prefix sums of those.
struct PlanSearch::LayerWork {
  std::vector<double> each, prefix;
  LayerWork(const CostModel& costs, const Config& c)
      : each(costs.layer_count(), 0.0), prefix(costs.layer_count() + 1, 0.0) {
    for (std::int64_t size : c.sizes) {
      const SizeCosts& s = costs.at(size);
      for (int k = 0; k < costs.layer_count(); ++k) each[k] += s.forward_ms[k] + s.backward_ms[k];
    }
    for (int k = 0; k < costs.layer_count(); ++k) prefix[k + 1] = prefix[k] + each[k];
  }
};

// e's MultiStagePeakBound with nothing placed: built (and charged) once per configuration,
// its programmes' moments collected from the schedule (building one for every use was a tenth
// of a capped every-schedule plan's time).
MultiStagePeakBound& PlanSearch::peak_bound(Entry& e) {
  const Config& c = *e.config;
  if (!e.peak) {
    stats_.steps +=
        static_cast<std::uint64_t>(3 * c.micro_batches() * c.stages_per_device * stages_) /
        kSweepTasksPerStep;
    e.peak =
        std::make_unique<MultiStagePeakBound>(costs_, c.sizes, c.schedule, c.checkpoint, stages_,
                                              c.stages_per_device, options_.optimizer_state_factor);
  } else {
    e.peak->unplace_all();
  }
  return *e.peak;
}

// The relaxed root of a multi-stage configuration (docs/planner.md): each stage s gets a share
// x_s of the work (LayerWork), every task is bounded by its least ratio to a layer's work
// over its stage's share (plus its overhead; a copy by the least bytes a boundary can carry),
// and the plan is at least every path of its task graph, which depends on the schedule alone,
// not on the balance. Rows: each device's busy time, then (cutting planes) long paths of model
// plans (first the last root's best model plan of the same schedule and stages per device, or
// equal time per stage; then each a step from the best model plan towards the solve's shares,
// and the shares themselves where the step's paths are not above the bound), timed by a
// sweep, until no path of the solve's shares is timed longer than the bound, then on with the
// paths' own rows (above their timed lengths, see add_paths) until none of those is above it
// either, or until the bound reaches `enough`. `rows`, where given, receives the programme's
// functions. `complete`: whether the rounds ended by themselves (no path longer, all of them run,
// or `enough`) rather than at `step_limit`, a count of stats_.steps; while they did not, `state`
// holds where they stopped, for a later call to go on from (a fresh start each time never completed
// a root that needs more than the steps given). `balances`: the best model plan timed and the last
// solve's shares (once a round has run), and the two where no path was timed above the bound any
// more, each rounded to layer boundaries (on random models each was the better start for the
// local search on some).
struct PlanSearch::RelaxedRootState {
  MinMaxShareProgramme programme;
  std::vector<double> shares;      // the last solve's
  std::vector<double> model_plan;  // the shares the next round times
  std::vector<double> best_plan;   // the model plan timed shortest so far
  double best_plan_ms = kInf;
  double bound = 0.0;
  int rounds = 0;
  // Rows are added for paths the model plan's timing puts above the bound, until none is;
  // then for paths whose rows are above it (see add_paths), which the timing misses.
  bool by_timing = true;
  std::vector<std::vector<double>> timed_plans;  // best_plan and shares at that switch
  // A stage's least ratios per count vector (see slopes below).
  std::map<std::array<int, 14>, std::vector<double>> least_of_counts;
  RelaxedRootState(int stages, const std::vector<double>& class_work)
      : programme(static_cast<std::size_t>(stages), class_work) {}
};

double PlanSearch::multi_stage_relaxed_root(const Config& c, const LayerWork& layer_work,
                                            std::uint64_t step_limit, double enough,
                                            std::unique_ptr<RelaxedRootState>& state,
                                            bool* complete, std::vector<std::vector<int>>* balances,
                                            StageWorkRows* rows) {
  const std::vector<double>& work = layer_work.each;
  const int v = c.stages_per_device, m = c.micro_batches(), stages = v * stages_;
  std::vector<int> device_of(stages);
  for (int s = 0; s < stages; ++s) device_of[s] = stage_rank(c.schedule, s, stages, v);
  TaskGraph graph;
  build_task_graph(graph, make_schedule(c.schedule, stages, m, c.checkpoint, v), device_of,
                   stages_);
  const SizeCosts* size_of[2] = {&costs_.at(c.sizes.front()), &costs_.at(c.sizes.back())};
  std::vector<int> slot_of(m);
  for (int i = 0; i < m; ++i) slot_of[i] = c.sizes[i] == c.sizes.front() ? 0 : 1;
  const RatioClasses classes = ratio_classes(work, *size_of[0]);
  const int n_classes = static_cast<int>(classes.work.size());
  // [kind * 2 + slot][layer]: a task's cost on each layer; kinds as TaskKind, with the forward
  // without autograd at SendActivation's place (no copy needs one).
  std::array<std::vector<double>, 14> cost;
  const double least_bytes[2] = {least_boundary_bytes(*size_of[0]),
                                 least_boundary_bytes(*size_of[1])};
  for (int slot = 0; slot < 2; ++slot) {
    const SizeCosts& sc = *size_of[slot];
    const std::vector<double>* per[7] = {
        &sc.forward_ms, &sc.forward_ms,        &sc.backward_ms,       &sc.forward_nograd_ms,
        nullptr,        &sc.backward_input_ms, &sc.backward_weight_ms};
    for (int kind = 0; kind < 7; ++kind)
      cost[kind * 2 + slot] = per[kind] ? *per[kind] : std::vector<double>(layers_, 0.0);
  }
  // Per task: its least cost per unit of work, per class.
  std::array<ClassRatio, 14> ratio;
  for (int x = 0; x < 14; ++x) {
    ratio[x] = ClassRatio(n_classes);
    for (int k = 0; k < layers_; ++k) ratio[x].add(classes.of[k], cost[x][k], work[k]);
  }
  const auto nograd_kind = static_cast<int>(TaskKind::SendActivation);
  auto kind_of = [&](const SimTask& t) {
    return t.kind == TaskKind::Forward && graph.schedule.recomputes(t.micro_batch)
               ? nograd_kind
               : static_cast<int>(t.kind);
  };
  auto copy_ms = [&](const SimTask& t) {
    const double bytes = least_bytes[slot_of[t.micro_batch]];
    return bytes < kInf ? hardware_.link_between(t.device, t.peer).transfer_ms(bytes) : 0.0;
  };
  // A row's compute tasks, counted per stage, kind and slot; their least time as slopes on the
  // stages' shares, one block per class: per stage, the least over a class's layers of what
  // those tasks cost on the layer against its work (tighter than a least ratio per task when
  // a backward's halves vary unlike each other from layer to layer).
  const std::size_t width = static_cast<std::size_t>(n_classes) * stages;
  using Counts = std::vector<std::array<int, 14>>;  // [stage][kind * 2 + slot]
  auto count_task = [&](Counts& counts, const SimTask& t) {
    ++counts[t.stage][kind_of(t) * 2 + slot_of[t.micro_batch]];
  };
  const bool fresh = !state;
  if (fresh) state = std::make_unique<RelaxedRootState>(stages, classes.work);
  RelaxedRootState& st = *state;
  MinMaxShareProgramme& programme = st.programme;
  // A stage's least ratios depend on its counts alone, and paths cross many stages with the
  // same counts (a forward and a backward of one micro-batch): each count vector is walked over
  // the layers once (that walk was most of the root's time).
  auto& least_of_counts = st.least_of_counts;
  auto slopes = [&](const Counts& counts) {
    std::vector<double> row(width, 0.0);
    for (int s = 0; s < stages; ++s) {
      const std::array<int, 14>& n = counts[s];
      if (std::all_of(n.begin(), n.end(), [](int x) { return x == 0; })) continue;
      auto [it, added] = least_of_counts.try_emplace(n);
      if (added) {
        ClassRatio r(n_classes);
        for (int k = 0; k < layers_; ++k) {
          double sum = 0.0;
          for (int x = 0; x < 14; ++x)
            if (n[x] > 0) sum += n[x] * cost[x][k];
          r.add(classes.of[k], sum, work[k]);
        }
        it->second.resize(n_classes);
        for (int k = 0; k < n_classes; ++k) it->second[k] = r.lower(k);
      }
      for (int k = 0; k < n_classes; ++k)
        row[k * stages + s] = it->second[k] / speed_[device_of[s]];
    }
    return row;
  };
  // The rounds count against the budget (their pivots, columns and sweeps) and stop at
  // `step_limit`, the bound so far standing, or once the bound reaches `enough`.
  auto charge = [&](std::uint64_t cells_before) {
    stats_.steps += (programme.pivot_cells() - cells_before) / kPivotCellsPerStep;
  };
  if (fresh) {
    std::vector<Counts> busy(stages_, Counts(stages));
    std::vector<double> tasks(stages_, 0.0);
    for (const SimTask& t : graph.tasks) {
      if (!is_compute(t.kind)) continue;
      count_task(busy[t.device], t);
      tasks[t.device] += overhead_;
    }
    for (int r = 0; r < stages_; ++r) programme.add(tasks[r], slopes(busy[r]));
    st.bound = programme.solve(&st.shares);
    charge(0);
    // The first model plan gives each stage the same time on its device, whatever the solve's
    // shares (the busy rows alone leave them arbitrary, and the first rounds' paths from such
    // extreme plans raised nothing: 9 rounds without a gain on 1,000 layers x 32 stages); or,
    // where a root of the same schedule ran before, that root's best model plan, stage by
    // stage: configurations of one schedule want much the same balance, and the rounds start
    // nearer it.
    st.model_plan.assign(st.shares.size(), 0.0);
    std::vector<double> start = equal_time_shares(c);
    if (auto it = model_start_.find({c.schedule, v}); it != model_start_.end()) start = it->second;
    for (int k = 0; k < n_classes; ++k)
      for (int s = 0; s < stages; ++s) st.model_plan[k * stages + s] = classes.work[k] * start[s];
    st.best_plan = st.model_plan;
  }
  // Every resource runs its tasks in a fixed order and no task is paced, so a model plan's
  // times are the longest paths over the engine's edges: a sweep in topological order, several
  // times faster than the event queue (which was most of the root's time).
  const int n_tasks = static_cast<int>(graph.tasks.size());
  stats_.steps += 1 + graph.tasks.size() / kSweepTasksPerStep;
  const TaskOrder sorted = topological_order(graph);
  const std::vector<int>& order = sorted.order;
  std::vector<double> duration(n_tasks), start(n_tasks), finish(n_tasks);
  *complete = false;
  bool cut = false;  // the rounds stopped at step_limit
  // As returned: a hair below, and the configuration closes only on the value returned.
  auto reaches = [&](double bound) { return bound * (1.0 - 1e-12) >= enough; };
  // A model plan's makespan (start and finish hold its tasks' times); the best so far is kept.
  auto time_model_plan = [&](const std::vector<double>& plan) {
    stats_.steps += 1 + graph.tasks.size() / kSweepTasksPerStep;
    for (std::size_t id = 0; id < graph.tasks.size(); ++id) {
      const SimTask& t = graph.tasks[id];
      double ms = 0.0;
      if (is_compute(t.kind)) {
        const ClassRatio& r = ratio[kind_of(t) * 2 + slot_of[t.micro_batch]];
        ms = overhead_;
        for (int k = 0; k < n_classes; ++k)
          ms += r.lower(k) * plan[k * stages + t.stage] / speed_[t.device];
      } else {
        ms = copy_ms(t);
      }
      duration[id] = ms;
    }
    double makespan = 0.0;
    for (int id : order) {
      double at = 0.0;
      for (int u : sorted.predecessors(id)) at = std::max(at, finish[u]);
      start[id] = at;
      finish[id] = at + duration[id];
      makespan = std::max(makespan, finish[id]);
    }
    if (makespan < st.best_plan_ms) {
      st.best_plan_ms = makespan;
      st.best_plan = plan;
    }
    return makespan;
  };
  // Rows per path of `plan`, the plan last timed: back from a task, each time to a predecessor
  // that ended as it started. From the task that ends last and from the last tasks of the
  // devices that end next, `count` of them (two rows a round gave 1,000 layers on 32 stages a
  // root 4 % higher in the same 40 rounds than one; the first round takes every device's).
  // A row is added where its value, at `plan` or at the last solve's shares, is above the
  // bound and the programme lacks it: the row prices a stage's tasks together at their joint
  // least ratio, above the sum of their least ratios that the timing takes, so a plan timed
  // below the bound may still have rows above it. Returns the rows added.
  auto add_paths = [&](const std::vector<double>& plan, int count) {
    std::vector<int> last(stages_, -1);
    for (int id = 0; id < n_tasks; ++id) {
      int& l = last[graph.tasks[id].device];
      if (l < 0 || finish[id] > finish[l]) l = id;
    }
    std::erase_if(last, [&](int id) {
      return id < 0 || (st.by_timing && !(finish[id] > st.bound * (1.0 + 1e-9)));
    });
    std::sort(last.begin(), last.end(), [&](int x, int y) { return finish[x] > finish[y]; });
    if (static_cast<int>(last.size()) > count) last.resize(count);
    auto value_at = [&](double constant, const std::vector<double>& slope,
                        const std::vector<double>& at) {
      if (at.size() != slope.size()) return 0.0;
      double value = constant;
      for (std::size_t x = 0; x < slope.size(); ++x) value += slope[x] * at[x];
      return value;
    };
    int added = 0;
    for (int at : last) {
      double constant = 0.0;
      Counts on_path(stages);
      while (at >= 0) {
        const SimTask& t = graph.tasks[at];
        if (is_compute(t.kind)) {
          count_task(on_path, t);
          constant += overhead_;
        } else {
          constant += copy_ms(t);
        }
        int next = -1;
        for (int u : sorted.predecessors(at)) {
          if (finish[u] >= start[at]) next = u;
        }
        at = start[at] > 0.0 ? next : -1;
      }
      std::vector<double> slope = slopes(on_path);
      stats_.steps += 1 + 2 * width / kPivotCellsPerStep;
      const double above = st.bound * (1.0 + 1e-9);
      if (!(value_at(constant, slope, plan) > above) &&
          !(st.rounds > 0 && value_at(constant, slope, st.shares) > above))
        continue;
      bool known = false;
      for (std::size_t i = 0; i < programme.functions() && !known; ++i)
        known = programme.constant(i) == constant && programme.slope(i) == slope;
      stats_.steps += programme.functions() * width / kPivotCellsPerStep;
      if (known) continue;
      programme.add(constant, std::move(slope));
      stats_.steps += (width + 1) * (width + 1) / kPivotCellsPerStep;  // the column's pricing
      ++added;
    }
    return added;
  };
  for (; st.rounds < kRelaxedRootRounds && !reaches(st.bound); ++st.rounds) {
    if (stats_.steps >= step_limit) {
      cut = true;
      break;
    }
    time_model_plan(st.model_plan);
    if (add_paths(st.model_plan, st.rounds == 0 ? stages_ : 2) == 0) {
      // No row of the stepped plan's paths is above the bound, which says nothing of the
      // solve's vertex: its own paths then (Kelley's cut), and where none of theirs is above
      // the bound either, the rounds are done. (Ending on the stepped plan alone, a 120-layer
      // configuration on 2 devices stopped after one round at 283.367 ms against 291.784.)
      time_model_plan(st.shares);
      if (add_paths(st.shares, 2) == 0) {
        if (!st.by_timing) break;
        // No path is timed above the bound: the rows of the paths themselves from now on,
        // and the plans here kept as starts (the rounds after them move the model plans, and
        // the local search from those alone ended up to 2.5 % slower on random instances).
        st.by_timing = false;
        st.timed_plans = {st.best_plan};
        // (Before the first solve the shares are the busy rows' arbitrary vertex.)
        if (st.rounds > 0) st.timed_plans.push_back(st.shares);
        continue;
      }
    }
    const std::uint64_t cells = programme.pivot_cells();
    st.bound = std::max(st.bound, programme.solve(&st.shares));
    charge(cells);
    // Not the solve's shares but a step from the best model plan towards them (Kelley's method
    // stabilised): the shares jump between far vertices, whose paths raise the bound little.
    // On bench's capped 1,000-layer profile, x12 except_last interleaved-1f1b, 40 rounds took
    // the bound to 1841 ms with the shares and to 1876 with a step of 0.3 (its best plan:
    // about 1905).
    st.model_plan.resize(st.shares.size());
    for (std::size_t x = 0; x < st.model_plan.size(); ++x)
      st.model_plan[x] = kModelPlanStep * st.shares[x] + (1.0 - kModelPlanStep) * st.best_plan[x];
  }
  double bound = st.bound;
  if (!cut) {
    if (!reaches(bound)) {
      std::uint64_t cells = 0;
      bound = std::max(
          bound, heaviest_layer_bound(programme, work, classes, stages, st.shares, bound, &cells));
      stats_.steps += cells / kPivotCellsPerStep;
    }
    *complete = true;
  }
  balances->clear();
  std::vector<const std::vector<double>*> plans = {&st.best_plan};
  // Before the first round the solve's shares are the busy rows' arbitrary vertex.
  if (st.rounds > 0) plans.push_back(&st.shares);
  for (const std::vector<double>& plan : st.timed_plans) plans.push_back(&plan);
  for (const std::vector<double>* shares : plans) {
    std::vector<double> stage_share(stages, 0.0);
    for (int s = 0; s < stages; ++s)
      for (int k = 0; k < n_classes; ++k) stage_share[s] += (*shares)[k * stages + s];
    std::vector<int> balance = rounded_balance(layer_work.prefix, stage_share);
    if (std::find(balances->begin(), balances->end(), balance) == balances->end())
      balances->push_back(std::move(balance));
  }
  if (st.rounds > 0) {  // the next root of this schedule starts from its best model plan
    std::vector<double> share(stages, 0.0);
    for (int k = 0; k < n_classes; ++k)
      for (int s = 0; s < stages; ++s) share[s] += st.best_plan[k * stages + s];
    const double sum = std::accumulate(share.begin(), share.end(), 0.0);
    if (sum > 0.0) {
      for (double& x : share) x /= sum;
      model_start_[{c.schedule, v}] = std::move(share);
    }
  }
  if (rows != nullptr) {
    rows->layer_class = classes.of;
    rows->layer_work = work;
    rows->classes = n_classes;
    rows->constant.resize(programme.functions());
    rows->slope.resize(programme.functions());
    for (std::size_t i = 0; i < programme.functions(); ++i) {
      rows->constant[i] = programme.constant(i);
      rows->slope[i] = programme.slope(i);
    }
  }
  if (*complete) state.reset();
  return std::max(0.0, bound * (1.0 - 1e-12));
}

StageWorkRows PlanSearch::time_rows_of(const Plan& plan) {
  Config c;
  c.sizes = split_batch(profile_.batch_size, plan.chunks);
  c.chunks = plan.chunks;
  c.checkpoint = plan.checkpoint;
  c.schedule = plan.schedule;
  c.stages_per_device = plan.stages_per_device;
  const LayerWork work(costs_, c);
  std::unique_ptr<RelaxedRootState> state;
  bool complete = false;
  std::vector<std::vector<int>> balances;
  StageWorkRows rows;
  multi_stage_relaxed_root(c, work, std::numeric_limits<std::uint64_t>::max(), kInf, state,
                           &complete, &balances, &rows);
  return rows;
}

// The cheap pass: under caps, the memory relaxation (MultiStagePeakBound::may_fit()); the
// relaxed root, to a quarter of the budget; and the first plans (first_multi_stage_plans()),
// unless the cheap pass has spent half the budget.
void PlanSearch::multi_stage_root(Entry& e, const std::vector<Entry>& entries) {
  const Config& c = *e.config;
  auto note = [&] {
    e.stats.best_ms = e.best < kInf ? e.best : 0.0;
    e.stats.lower_bound_ms = e.root;
  };
  if (e.root >= ranking_threshold(entries, &e)) {
    e.closed = true;
    note();
    return;
  }
  // The memory relaxation and the first plans whatever the budget, while the cheap pass has
  // spent less than half of it (or 2^20 steps, so that a small budget still gets them); after
  // that in the configuration's first slice. A batch of 1,024 makes thousands of multi-stage
  // configurations: simulating all their first plans left nothing of the budget to search the
  // single-stage ones (3,000 layers on 4 devices: their proven best, 0.4 % faster, not found),
  // and their relaxations alone took 32 M steps of a 10 M budget (2,000 layers on 16 devices
  // under a cap, 6 s).
  const bool cheap_left =
      stats_.steps < std::max<std::uint64_t>(options_.search_budget / 2, 1 << 20);
  if (cheap_left && !fits_some_balance(e)) {
    e.closed = true;
    note();
    return;
  }
  // With 32 stages and a few classes a solve takes a few milliseconds, and a model of 64
  // samples has a few hundred configurations: in the cheap pass the rounds stop at a quarter
  // of the budget (at least about 50 ms of work, so that a small budget still gets the roots
  // of small models), so that the search for plans keeps the rest. Those cut short go on in
  // their configuration's slices (multi_stage_slice()); past half the budget a root does not
  // start here (its graph and first solve alone were 9.6 M steps over thousands of
  // configurations).
  const std::uint64_t allowance = std::max<std::uint64_t>(options_.search_budget / 4, 1 << 20);
  const LayerWork work(costs_, c);
  if (!cheap_left) {
    // Its first plans still start from equal time per stage, as the root's first round would.
    std::vector<double> stage_share = equal_time_shares(c);
    for (double& x : stage_share) x *= work.prefix[layers_];
    e.relaxed = {rounded_balance(work.prefix, stage_share)};
  } else {
    std::vector<std::vector<int>> relaxed;
    if (capped()) e.time_rows = std::make_unique<StageWorkRows>();
    e.root = std::max(e.root, multi_stage_relaxed_root(
                                  c, work, allowance, ranking_threshold(entries, &e), e.root_state,
                                  &e.root_complete, &relaxed, e.time_rows.get()));
    if (e.root >= ranking_threshold(entries, &e) ||
        !fits_fast_enough(e, ranking_threshold(entries, &e))) {
      e.closed = true;
      note();
      return;
    }
    e.relaxed = std::move(relaxed);
  }
  if (cheap_left) first_multi_stage_plans(e, work);
  e.stats.evaluated = true;
  note();
}

std::vector<double> PlanSearch::equal_time_shares(const Config& c) const {
  const int v = c.stages_per_device, stages = v * stages_;
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
bool PlanSearch::fits_some_balance(Entry& e) {
  if (!capped() || e.fit_checked) return true;
  e.fit_checked = true;
  MultiStagePeakBound& peak = peak_bound(e);
  const RelaxationCells before = cells_of(peak);
  const bool may_fit = peak.may_fit(capacity_);
  charge_relaxation(peak, before);
  return may_fit;
}

// Under caps, whether some balance of e's configuration may both fit and beat `limit`:
// may_fit() over the devices' levels and the relaxed root's rows together. False closes the
// configuration: every fitting balance has a row, so its time, above `limit`.
bool PlanSearch::fits_fast_enough(Entry& e, double limit) {
  if (!capped() || !e.time_rows || e.time_rows->constant.empty() || !(limit < kInf)) return true;
  // Only with the root's rows complete: with fewer it rarely proves anything and cost the
  // capped 1,000-layer bench case the roots of a fifth of its configurations.
  if (!e.root_complete) return true;
  // Asked again only once the plan to beat has fallen a little.
  if (!(limit < e.fast_checked * (1.0 - 1e-3))) return true;
  e.fast_checked = limit;
  MultiStagePeakBound& peak = peak_bound(e);
  const RelaxationCells before = cells_of(peak);
  const bool may_fit = peak.may_fit(capacity_, *e.time_rows, limit);
  charge_relaxation(peak, before);
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
std::vector<int> PlanSearch::proxy_descent(MultiStagePeakBound& peak, const StageWorkRows& rows,
                                           std::vector<int> balance,
                                           const std::vector<double>& limit) {
  const int stages = static_cast<int>(balance.size());
  const int classes = rows.classes;
  const std::size_t n_rows = rows.constant.size();
  const std::vector<std::vector<double>> prefix = rows.class_prefix();
  std::vector<int> start(stages + 1, 0);
  for (int t = 0; t < stages; ++t) start[t + 1] = start[t] + balance[t];
  std::vector<double> value = rows.values(balance);
  stats_.steps += static_cast<std::uint64_t>(layers_ * classes) / kSweepTasksPerStep +
                  n_rows * static_cast<std::size_t>(stages * classes) / kPivotCellsPerStep;
  peak.unplace_all();
  std::vector<double> excess_of(stages_, 0.0);
  for (int t = 0; t < stages; ++t) {
    const int r = peak.device_of(t);
    excess_of[r] =
        std::max(0.0, static_cast<double>(peak.place(t, start[t], start[t + 1])) - limit[r]);
  }
  double excess = std::accumulate(excess_of.begin(), excess_of.end(), 0.0);
  double time = *std::max_element(value.begin(), value.end());
  std::vector<double> moved(n_rows);
  std::vector<std::pair<int, double>> devices;  // (device, its excess) after a move
  // The ends of stages first, first + 1, ... become `to` (stages first .. first + to.size()
  // change): kept, and true, when that lowers the excess, or keeps it and lowers the time.
  auto try_move = [&](int first, std::initializer_list<int> to) {
    const int changed = static_cast<int>(to.size()) + 1;
    std::array<int, 4> from{}, until{};  // the changed stages' new ranges
    for (int i = 0; i < changed; ++i) {
      from[i] = i == 0 ? start[first] : *(to.begin() + i - 1);
      until[i] = i + 1 < changed ? *(to.begin() + i) : start[first + changed];
    }
    std::copy(value.begin(), value.end(), moved.begin());
    for (int i = 0; i < changed; ++i) {
      const int t = first + i;
      for (int x = 0; x < classes; ++x) {
        const double delta = (prefix[x][until[i]] - prefix[x][from[i]]) -
                             (prefix[x][start[t + 1]] - prefix[x][start[t]]);
        if (delta == 0.0) continue;
        for (std::size_t row = 0; row < n_rows; ++row)
          moved[row] += rows.slope[row][x * stages + t] * delta;
      }
    }
    // The rows' updates, copy and largest, and the devices' bounds (a few moments each).
    stats_.steps +=
        1 + n_rows * static_cast<std::size_t>(classes * changed + 2) / kPivotCellsPerStep;
    // A device's bound as its last changed stage is placed counts every change on it.
    std::array<std::int64_t, 4> placed{};
    for (int i = 0; i < changed; ++i) placed[i] = peak.place(first + i, from[i], until[i]);
    double new_excess = excess;
    devices.clear();
    for (int i = changed - 1; i >= 0; --i) {
      const int r = peak.device_of(first + i);
      if (std::any_of(devices.begin(), devices.end(), [&](const auto& d) { return d.first == r; }))
        continue;
      const double x = std::max(0.0, static_cast<double>(placed[i]) - limit[r]);
      new_excess += x - excess_of[r];
      devices.emplace_back(r, x);
    }
    const double new_time = *std::max_element(moved.begin(), moved.end());
    if (new_excess < excess - 0.5 || (!(new_excess > excess) && new_time < time * (1.0 - 1e-12))) {
      for (int i = 0; i + 1 < changed; ++i) start[first + i + 1] = until[i];
      value.swap(moved);
      for (const auto& [r, x] : devices) excess_of[r] = x;
      excess = new_excess;
      time = new_time;
      return true;
    }
    for (int i = 0; i < changed; ++i) peak.place(first + i, start[first + i], start[first + i + 1]);
    return false;
  };
  constexpr int kEndMoves[] = {1, -1, 2, -2, 4, -4, 8, -8};
  constexpr int kBlockMoves[] = {1, -1, 2, -2};
  const std::uint64_t limit_steps = stats_.steps + 4 * static_cast<std::uint64_t>(stages) * layers_;
  for (bool improved = true; improved && stats_.steps < limit_steps;) {
    improved = false;
    for (int t = 1; t < stages; ++t) {  // the end of stage t - 1
      for (int d : kEndMoves) {
        const int to = start[t] + d;
        if (to <= start[t - 1] || to >= start[t + 1]) continue;
        if (try_move(t - 1, {to})) improved = true;
      }
    }
    for (int t = 1; t + 1 < stages; ++t) {  // stage t as a block
      for (int d : kBlockMoves) {
        const int a = start[t] + d, b = start[t + 1] + d;
        if (a <= start[t - 1] || b >= start[t + 2]) continue;
        if (try_move(t - 1, {a, b})) improved = true;
      }
    }
  }
  for (int t = 0; t < stages; ++t) balance[t] = start[t + 1] - start[t];
  return balance;
}

// The min-max partition of the work on the stages' devices, then the relaxed root's rounded
// plans where they are better; under caps, then proxy_descent()'s start where it is better.
void PlanSearch::first_multi_stage_plans(Entry& e, const LayerWork& layer_work) {
  const Config& c = *e.config;
  const int v = c.stages_per_device, stages = v * stages_;
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
  stats_.steps += evaluations / kPartitionEvaluationsPerStep;
  e.balance = p.sizes;
  e.score = simulate_for(e, e.balance, &e.peaks);
  for (const std::vector<int>& start : e.relaxed) start_from(e, start);
  proxy_starts(e);
  e.stats.evaluated = true;
}

// Under caps, proxy_descent()'s starts from e's best balance (its first plans). Each device's
// bound against that balance's simulated peak says how far below the simulator the bound keeps
// it: the proxy holds each device's bound to its cap times that ratio, then to less of it while
// the start does not fit. (Run again in later slices with the rows the root added since, where
// no plan fitted yet, it found none on bench's capped case and cost its gap 4.2 -> 9.4 %.)
void PlanSearch::proxy_starts(Entry& e) {
  if (!capped() || !e.time_rows || e.time_rows->constant.empty() ||
      e.peaks.size() != static_cast<std::size_t>(stages_))
    return;
  const std::vector<std::int64_t> peaks = e.peaks;  // the best start's, as the bounds below
  MultiStagePeakBound& peak = peak_bound(e);
  const std::vector<std::int64_t> bounds = peak.of(e.balance);
  std::vector<double> limit(stages_, kInf);
  for (double share : {1.0, 0.95, 0.9}) {
    for (int r = 0; r < stages_; ++r) {
      if (capacity_[r] <= 0 || peaks[r] <= 0) continue;
      limit[r] = share * static_cast<double>(capacity_[r]) * static_cast<double>(bounds[r]) /
                 static_cast<double>(peaks[r]);
    }
    start_from(e, proxy_descent(peak, *e.time_rows, e.balance, limit));
    if (!(e.score.excess > 0.0)) break;
  }
}

// The local search goes on from `balance` if it fits better or is faster than its current one;
// otherwise, if it fits, it is a start descended from later (as is the one it replaces).
void PlanSearch::start_from(Entry& e, const std::vector<int>& balance) {
  if (balance == e.balance ||
      std::find(e.starts.begin(), e.starts.end(), balance) != e.starts.end())
    return;
  std::vector<std::int64_t> peaks;
  const Score score = simulate_for(e, balance, &peaks);
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

std::unique_ptr<GraphSweep> PlanSearch::graph_sweep(const Config& c) {
  if (!GraphSweep::exact_for(profile_)) return nullptr;
  const int stages = c.stages_per_device * stages_;
  const Schedule schedule =
      make_schedule(c.schedule, stages, c.micro_batches(), c.checkpoint, c.stages_per_device);
  std::vector<int> device_of(stages);
  for (int s = 0; s < stages; ++s)
    device_of[s] = stage_rank(c.schedule, s, stages, c.stages_per_device);
  auto sweep = std::make_unique<GraphSweep>(costs_, hardware_, schedule, device_of, c.sizes);
  stats_.steps += sweep->task_count();  // its graph, as a simulation's
  return sweep;
}

double PlanSearch::swept_time(GraphSweep& sweep, const std::vector<int>& balance) {
  ++stats_.sweeps;
  stats_.steps += 1 + (sweep.task_count() + 8 * balance.size()) / kSweepTasksPerStep;
  return sweep.run(balance);
}

// The multi-stage local search of multi_stage_slice(), until `limit` (a count of stats_.steps)
// or until no move improves from any start: from e's balance, moves of one stage end, least
// memory excess first, then time, each taken where it is better; then, where `sweep` times
// balances, a layer moved between two stages further apart; then the next start, and kicks of
// the best plan. Where it stops is kept in e for the next slice.
void PlanSearch::multi_stage_local_search(Entry& e, GraphSweep* sweep, std::uint64_t limit) {
  const Config& c = *e.config;
  const int stages = c.stages_per_device * stages_;
  // Moves of a quarter of an average stage first, and of half as many layers where none
  // improves, down to one: on thousands of layers a start far from fitting (the min-max
  // partition of time under a cap) took a simulation per layer moved.
  const int widest = std::max(1, layers_ / stages / 4);
  if (e.move == 0) e.move = widest;
  // e's balance becomes `next` where that is better; false otherwise.
  auto take_if_better = [&](std::vector<int> next) {
    // Where the balance fits (or nothing is capped), only a faster one can be better: the
    // sweep's time rules the others out without a simulation.
    if (sweep && !(e.score.excess > 0.0) && !(swept_time(*sweep, next) < e.score.time))
      return false;
    std::vector<std::int64_t> peaks;
    const Score score = simulate_for(e, next, &peaks);
    if (!better(score, e.score)) return false;
    e.balance = std::move(next);
    e.score = score;
    e.peaks = std::move(peaks);
    return true;
  };
  for (;;) {
    // Once every start is descended, kicks (iterated local search): the best plan so far with
    // a few layers moved between random stages (the same for the same configuration, so that
    // the search stays deterministic), descended from as a start. (Kicks held back until the
    // enumeration below had been cut short by the budget were measured too: 13 answers of the
    // random instances faster instead of 16.)
    if (e.settled && e.ranged && e.starts.empty() && sweep && e.kicks < kLocalSearchKicks &&
        e.best < kInf && stats_.steps < limit) {
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
    if (e.settled && e.ranged && !e.starts.empty() && stats_.steps < limit) {
      // The next start's descent.
      std::vector<int> start = std::move(e.starts.front());
      e.starts.erase(e.starts.begin());
      std::vector<std::int64_t> peaks;
      const Score score = simulate_for(e, start, &peaks);
      e.restart_at(std::move(start), score, std::move(peaks));
      e.move = widest;
    }
    if (!(stats_.steps < limit) || (e.settled && e.ranged)) break;
    while (!e.settled && stats_.steps < limit) {
      bool improved = false;
      for (int i = 0; i + 1 < stages && !improved && stats_.steps < limit; ++i) {
        for (int delta : {-e.move, e.move}) {
          std::vector<int> next = e.balance;
          next[i] += delta;
          next[i + 1] -= delta;
          if (next[i] < 1 || next[i + 1] < 1) continue;
          if (take_if_better(std::move(next))) {
            improved = true;
            break;
          }
        }
      }
      if (improved) {
        e.widening = false;
        e.ranged = false;
      } else if (stats_.steps < limit) {
        // Down to one layer, then once more up from two: a block moved at once can still gain
        // where no single layer does.
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
    // Then, where balances are swept, a layer moved between two stages that are not neighbours
    // (the stages between them shift by one): a time that is the maximum of several paths can
    // need two ends to move at once, where moving either alone gains nothing. Where one does,
    // the one-end moves go on from it.
    if (!sweep) e.ranged = true;
    bool moved = false, cut = false;
    for (int i = 0; i + 2 < stages && !e.ranged && !moved && !cut; ++i) {
      for (int j = i + 2; j < stages && !moved && !cut; ++j) {
        for (int delta : {1, -1}) {
          if (!(stats_.steps < limit)) {
            cut = true;  // the next slice starts the moves over
            break;
          }
          std::vector<int> next = e.balance;
          next[i] += delta;
          next[j] -= delta;
          if (next[i] < 1 || next[j] < 1) continue;
          if (take_if_better(std::move(next))) {
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
}

// A slice: the relaxed root's rounds if the cheap pass cut them short; the first plans if the cheap
// pass deferred them; then a first-improvement local search that moves one stage boundary (wide
// moves first, see below), least memory excess first, then time, until no move improves, then a
// layer between distant stages, from every start and then from kicks of the best plan (a good
// plan early makes the enumeration below prune more); then the enumeration of every balance, stage
// by stage, where a prefix whose MultiStageBalanceBound is not below the plan to beat, or whose
// last stage's device cannot fit its memory bound, is not extended, and a whole balance is
// timed only when its bound is below it. Balances are timed by GraphSweep where it equals the
// simulator, and simulated only where they could become the configuration's best or the
// current one does not fit. The enumeration resumes where the last slice stopped
// (the plan to beat only falls, so what it skipped stays skipped); when it ends, the configuration
// is closed with its exact best.
void PlanSearch::multi_stage_slice(Entry& e, std::vector<Entry>& entries, std::uint64_t slice) {
  const Config& c = *e.config;
  ranking_threshold_ = ranking_threshold(entries, &e);
  const std::uint64_t steps = stats_.steps;
  auto note = [&] {
    ++e.stats.slices;
    e.slice = slice;
    e.stats.steps += stats_.steps - steps;
    e.stats.best_ms = e.best < kInf ? e.best : 0.0;
    e.stats.lower_bound_ms = e.root;
  };
  auto beat = [&] { return std::min(ranking_threshold_, e.best); };
  if (e.root >= beat() || !fits_some_balance(e) || !fits_fast_enough(e, beat())) {
    e.closed = true;
    note();
    return;
  }
  const int stages = c.stages_per_device * stages_;
  const std::uint64_t limit = std::min(options_.search_budget, steps + slice);
  // A relaxed root that the cheap pass cut short goes on where it stopped, to half the slice:
  // with many configurations most got no round there, and their balance-free bounds held the
  // gap open.
  std::optional<LayerWork> work;
  if (!e.root_complete || e.balance.empty()) work.emplace(costs_, c);
  if (!e.root_complete) {
    const std::vector<std::vector<int>> tried = e.relaxed;
    if (capped() && !e.time_rows) e.time_rows = std::make_unique<StageWorkRows>();
    e.root = std::max(e.root, multi_stage_relaxed_root(c, *work, std::min(limit, steps + slice / 2),
                                                       beat(), e.root_state, &e.root_complete,
                                                       &e.relaxed, e.time_rows.get()));
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

  MultiStageBalanceBound bound(costs_, c.sizes, c.schedule, c.checkpoint, stages_,
                               c.stages_per_device, speed_, overhead_, hardware_);
  // Under caps, a stage whose device's peak bound exceeds its cap ends every balance below it:
  // no plan there fits, and a longer stage only needs more.
  MultiStagePeakBound* peak = capped() ? &peak_bound(e) : nullptr;
  // Places stage t in `peak` and says whether its device's bound now exceeds its cap.
  auto placed_overflows = [&](int t, int a, int b) {
    if (!peak) return false;
    const std::int64_t cap = capacity_[peak->device_of(t)];
    // Its device's moments, each a sum over its stages: with every balance swept rather than
    // simulated, these sums became most of a capped enumeration's time.
    const std::uint64_t cells = peak->level_cells();
    const bool over = peak->place(t, a, b) > cap && cap > 0;
    stats_.steps += (peak->level_cells() - cells) / kLevelCellsPerStep;
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
      if (stats_.steps >= limit) {
        out = true;
        e.resume = ends;
        e.resume.push_back(b);
        return;
      }
      ++stats_.steps;
      ++stats_.nodes;
      if (placed_overflows(t, a, b)) {
        peak->unplace(t);
        break;
      }
      bound.place(t, a, b);
      if (t + 2 == stages) {  // the last stage takes the rest
        bound.place(t + 1, b, layers_);
        if (!placed_overflows(t + 1, b, layers_) && below_beat(bound.bound(stages))) {
          std::vector<int> balance;
          int from = 0;
          for (int end : ends) {
            balance.push_back(end - from);
            from = end;
          }
          balance.push_back(b - from);
          balance.push_back(layers_ - b);
          // Simulated only if faster than the configuration's best, or as fast (it may need
          // less memory): nothing else changes it.
          if (!sweep || !(swept_time(*sweep, balance) > e.best)) simulate_for(e, balance);
        }
        bound.unplace(t + 1);
        if (peak) peak->unplace(t + 1);
      } else if (below_beat(bound.bound(t + 1))) {
        ends.push_back(b);
        enumerate(t + 1, b);
        ends.pop_back();
      }
      bound.unplace(t);
      if (peak) peak->unplace(t);
    }
  };
  if (stats_.steps < limit) {
    enumerate(0, 0);
    if (!out) {
      e.closed = true;
      e.resume.clear();
    }
  }
  note();
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

PlanSearchResult PlanSearch::run() {
  std::vector<Config> configs = configurations();
  stats_.configurations = configs.size();
  // Cheap bounds first, to visit the promising configurations early and skip the rest.
  for (auto& c : configs) {
    if (c.multi_stage()) {
      c.lower_bound = multi_stage_bound(c);
      continue;
    }
    prepare(c);
    c.lower_bound = std::max(
        {balance_free_bound(), greedy_bound([this](int j, int a, int b) { return busy(j, a, b); }),
         greedy_bound([this](int j, int a, int b) { return chained_cost(j, a, b); }),
         greedy_bound([this](int j, int a, int b) { return wait_cost(j, a, b); })});
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
  // The cheap pass over every configuration, whatever the budget: its root bound and a good
  // incumbent, so that no configuration goes unseen and the threshold is good from the start.
  std::size_t done = 0;
  for (Entry& e : entries) {
    if (options_.progress) options_.progress(done++, entries.size());
    open_root(e, entries);
    if (e.closed) {  // a relaxed root cut short, and its rows: nothing to go on with
      e.root_state.reset();
      e.time_rows.reset();
      e.peak.reset();
    }
  }
  // Then the budget, in rounds, to the configurations whose bound is below the threshold, the
  // one with the fastest plan first (its search is the likeliest to lower the threshold that
  // the others must beat, and so to shorten their searches): each gets a share of what is left
  // in proportion to its room below the threshold, and at least twice its last slice so that
  // the rounds (each rebuilds the configuration's tables) are few. A slice resumes where the
  // last one stopped.
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
      if (e.closed) {
        e.root_state.reset();
        e.time_rows.reset();
        e.peak.reset();
      }
      progressed = true;
    }
    if (!progressed) break;
  }
  polish_unpolished(entries);
  if (options_.progress) options_.progress(entries.size(), entries.size());

  Ranking ranking(options_.top);
  double unexplored = kInf;  // the least bound over configurations the budget cut short
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

  PlanSearchResult result;
  result.ranked = ranking.take();
  if (result.ranked.empty()) {
    // Nothing fits: find the plan whose largest per-device peak is smallest, with what is
    // left of the budget.
    step_limit_ = options_.search_budget;
    out_of_budget_ = stats_.steps >= step_limit_;
    balance_.assign(stages_, 0);
    seed_leanest(configs);
    // (Among the single-stage configurations only: the memory bounds are theirs.) The first
    // plans of every configuration were simulated already: lean_best_ starts from the leanest.
    for (const Config& config : configs) {
      if (config.multi_stage()) continue;
      prepare(config);
      search(0, 0, 0.0, 0.0, {}, 0.0, Objective::Memory);
    }
    result.leanest = lean_candidate_;
    result.leanest_proven = !out_of_budget_;
    if (result.leanest && options_.worst_order_memory) {
      // Leanest as predicted; what it needs in every arrival order is said beside it.
      result.leanest->worst_order_peak_bytes = worst_order_peaks_of(result.leanest->plan);
    }
    proven = proven && !out_of_budget_;
  }
  stats_.proven = proven;
  result.stats = stats_;
  return result;
}

}  // namespace

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

StageWorkRows multi_stage_time_rows(const Profile& profile, const Hardware& hardware,
                                    const Plan& plan) {
  PlanSearch search(profile, hardware, PlannerOptions{});
  return search.time_rows_of(plan);
}

}  // namespace pipetune
