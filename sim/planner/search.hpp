#pragma once
// The planner's search behind find_best_plans() (docs/planner.md), internal to sim/planner/: one
// PlanSearch per call, its members defined by concept across
//   search.cpp               configurations, their slices of the budget, the ranking;
//   stage_bounds.cpp         time bounds on single-stage balances and their stage tables;
//   memory_bound.cpp         memory bounds on single-stage stages and the ends caps allow;
//   relaxed_root.cpp         single-stage roots over continuous shares of the work;
//   prefix_bound.cpp         the relaxed root's programme held at a prefix of stages;
//   branch_and_bound.cpp     the exact search over single-stage balances, its round trip
//                            tables, and the same search around the best plan;
//   polish.cpp               local search on single-stage plans (polish, repair);
//   multi_stage_root.cpp     multi-stage roots over continuous shares of the work;
//   multi_stage_search.cpp   multi-stage balances: starts, local search, enumeration.
// Its tuning constants are in tuning.hpp.

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sim/cost_model.hpp"
#include "sim/hardware.hpp"
#include "sim/memory_model.hpp"
#include "sim/partition.hpp"
#include "sim/planner/graph_sweep.hpp"
#include "sim/planner/minimax_bound.hpp"
#include "sim/planner/multi_stage_peak_bound.hpp"
#include "sim/planner/planner.hpp"
#include "sim/planner/stage_timing.hpp"
#include "sim/planner/tuning.hpp"
#include "sim/profile.hpp"
#include "sim/schedule.hpp"
#include "sim/simulator.hpp"

namespace pipetune::planning {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

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
int recompute_stop(const Config& config);

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

// Layers grouped by the share of their forward in forward plus backward: one least ratio for
// all layers is loose when an embedding's backward is ten times its forward and a block's
// twice, so each class (a kind of layer, in most models) gets its own ratios and its own share
// of the work.
struct RatioClasses {
  std::vector<int> of;       // per layer
  std::vector<double> work;  // per class: its layers' work
};
// The single-stage relaxed root's classes: as many as keep its programme near kRatioCoordinates
// coordinates (stages x classes), within [kFewestRatioClasses, kMostRatioClasses].
inline int max_ratio_classes(int stages) {
  return std::clamp(kRatioCoordinates / std::max(stages, 1), kFewestRatioClasses,
                    kMostRatioClasses);
}
// EqualRanges: `max_classes` equal ranges of the share, the empty ones dropped (what the
// multi-stage roots use). LeastLoss: at most `max_classes` classes, each split where its layers
// lose most (their work times the class's width of shares; see ratio_classes()).
enum class ClassSplit { EqualRanges, LeastLoss };
RatioClasses ratio_classes(const std::vector<double>& layer_work, const SizeCosts& size,
                           int max_classes, ClassSplit split);

// A stage's tasks on a path priced together: per class, the least over its layers of what
// `counts[q]` tasks of each kind q cost on the layer (`cost(q, x)`) against its work. At least
// the sum of the kinds' own least ratios, and tighter when they vary unlike each other.
template <std::size_t Kinds, typename Cost>
std::vector<double> joint_least_ratios(const std::array<int, Kinds>& counts, Cost cost,
                                       const RatioClasses& classes,
                                       const std::vector<double>& layer_work) {
  ClassRatio r(static_cast<int>(classes.work.size()));
  for (std::size_t x = 0; x < layer_work.size(); ++x) {
    double sum = 0.0;
    for (std::size_t q = 0; q < Kinds; ++q)
      if (counts[q] > 0) sum += counts[q] * cost(static_cast<int>(q), static_cast<int>(x));
    r.add(classes.of[x], sum, layer_work[x]);
  }
  std::vector<double> least(classes.work.size());
  for (std::size_t c = 0; c < least.size(); ++c) least[c] = r.lower(static_cast<int>(c));
  return least;
}

// What the single-stage relaxed root prices the iteration's paths with (PlanSearch::path_row()):
// each kind of task's least and mean ratio to a layer's work per class, its total over the
// model, and a stage's tasks on a path priced together (joint_least(), each count vector walked
// over the layers once). Kept with the root's programme, so that the search's prefix
// programmes add the paths of their own shares.
struct RootPaths {
  RootPaths(const SizeCosts& first, const SizeCosts& last, RatioClasses classes,
            std::vector<double> layer_work, int stages);
  // A task's cost on layer x, kinds as in IterationSweep::PathCounts (a recompute is a forward
  // with autograd), slot 0 the first micro-batch's size and 1 the last one's.
  double task_ms(int kind, int slot, int x) const {
    const SizeCosts& size = slot == 0 ? *first : *last;
    return kind == 1   ? size.forward_nograd_ms[x]
           : kind == 3 ? size.backward_ms[x]
                       : size.forward_ms[x];
  }
  const std::vector<double>& joint_least(const std::array<int, 8>& counts);

  const SizeCosts* first;
  const SizeCosts* last;
  RatioClasses classes;
  std::vector<double> layer_work;
  int n_classes = 0;
  std::size_t width = 0;                                // classes x stages
  std::array<std::array<ClassRatio, 2>, 4> task_ratio;  // [kind][slot]
  std::array<std::array<double, 2>, 4> task_total{};    // [kind][slot]: the whole model's
  std::array<std::array<std::vector<double>, 2>, 4> task_mean_ratio;  // [kind][slot][class]
  bool mean_is_least = false;  // every task's mean ratio is its least: one model, one path
  std::map<std::array<int, 8>, std::vector<double>> joint;  // (keeps references valid)
  std::vector<StageDurations> model;                        // the shares' plan, per stage
  IterationSweep::PathCounts path;                          // its longest path
};

// Contiguity for a relaxed root's shares (one block of stages per class, as
// MinMaxShareProgramme lays them out). The shares let a stage hold any mix of the classes, but
// a stage is a run of layers: after each stage end the work of class c so far and the work of
// all classes so far are a point of the model's own curve (T(e), C_c(e)) over the layer
// boundaries e, so within its convex hull. Each edge of the hull's lower (upper) side is a line
// such a point stays on or above (below): a linear constraint on the shares.
class ContiguityHull {
 public:
  ContiguityHull(const std::vector<double>& layer_work, const RatioClasses& classes);
  /// Adds to `programme` the edge constraints that `shares` (of `stages` stages) cross by more
  /// than a billionth of the work, one per stage end, class and side; returns how many.
  int add_crossed(MinMaxShareProgramme& programme, const std::vector<double>& shares, int stages);

 private:
  struct Side {
    std::vector<double> t, c;  // vertices, t increasing
  };
  std::vector<Side> lower_, upper_;  // per class; empty with one class
  double slack_ = 0.0;
  std::set<std::array<int, 4>> added_;  // (stage end, class, side, edge) of the cuts so far
};

// The balance whose stage ends lie nearest the running sums of `share` (a relaxed root's share
// of the work per stage) on `work`, the prefix sums of the layers' work; every stage keeps a
// layer. A first plan near the relaxed root's bound.
std::vector<int> rounded_balance(const std::vector<double>& work, const std::vector<double>& share);

// The fewest bytes a stage boundary can carry at a micro-batch size: the least output of a
// layer with a layer after it; infinity with one layer.
double least_boundary_bytes(const SizeCosts& size);

// The least that a path's copies cost beyond their latencies over every balance. Stage ends
// strictly increase, so the boundaries of a balance carry the outputs of as many distinct
// layers (each with a layer after it); boundary k's copies at one micro-batch size cost
// weight[k] (milliseconds per byte, summed over them) times its output. By the rearrangement
// inequality the heaviest weights take the smallest outputs: `ascending` holds every output a
// boundary can carry at that size, smallest first.
double least_boundary_copies_ms(std::vector<double> weight, const std::vector<double>& ascending);

// A copy's milliseconds per byte over `link` (beyond its latency).
inline double ms_per_byte(const Link& link) {
  return link.bandwidth_bytes_per_s == std::numeric_limits<double>::infinity()
             ? 0.0
             : 1e3 / link.bandwidth_bytes_per_s;
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
                            std::uint64_t* cells = nullptr);
// Whether heaviest_layer_bound() would look at the stages at all.
bool heaviest_layer_matters(const std::vector<double>& layer_work, int stages);

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
    const std::vector<int> memory = device_memories(hardware);
    for (int j = 0; j < stages_; ++j) {
      speed_.push_back(hardware.devices[j].speed);
      capacity_.push_back(hardware.devices[j].memory_bytes);
      // Stage j on device j: on a share of its sender's GPU it receives the tensor itself.
      receives_senders_tensor_.push_back(j > 0 && memory[j] == memory[j - 1]);
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
  double configuration_bound_of(const Plan& plan) const;
  std::vector<std::vector<double>> prefix_bounds_of(const std::vector<Plan>& plans, int widen,
                                                    double limit);
  PlanCandidate best_around_of(const Plan& centre, int radius);

 private:
  enum class Objective { Time, Memory };

  std::vector<Config> configurations() const;
  // run()'s phases, in order.
  struct Entry;
  std::vector<Entry> entries_by_cheap_bound(std::vector<Config>& configs);
  void cheap_pass(std::vector<Entry>& entries);
  void share_the_budget(std::vector<Entry>& entries);
  bool rank(std::vector<Entry>& entries, Ranking& ranking, double& unexplored);
  bool find_leanest(const std::vector<Config>& configs, PlanSearchResult& result, bool proven,
                    double unexplored);
  static void release_closed(Entry& e);
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
  double least_copies(const Config& c) const;
  // A prepared single-stage configuration's bound before any search: the balance-free bound and
  // the least largest stage of each kind of stage cost (greedy_bound()).
  double cheap_bound() const;
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
  // `programme`, if given, receives the final programme's functions that carry weight at its
  // optimum and every hull edge, solved; `paths`, its pricing of paths.
  double relaxed_root(std::vector<int>& balance, RelaxedRows* rows = nullptr,
                      std::shared_ptr<const MinMaxShareProgramme>* programme = nullptr,
                      std::shared_ptr<RootPaths>* paths = nullptr) const;
  // The row of the longest path of the plan of `shares` (stages x classes, as the programme
  // lays them out), its tasks timed at their classes' least ratios (`mean` false) or at their
  // mean ratios: a function of the shares no larger than the simulated time of any balance.
  // Returns its value at `shares`.
  double path_row(RootPaths& paths, const std::vector<double>& shares, bool mean, double& a,
                  std::vector<double>& row) const;
  struct RootCase;
  std::vector<RootCase> root_cases(const RatioClasses& classes,
                                   const std::vector<double>& layer_work, ClassRatio& trip_first,
                                   ClassRatio& trip_last) const;
  void root_wait_rows(const RootPaths& paths, const std::vector<RootCase>& cases,
                      const ClassRatio& trip_first, const ClassRatio& trip_last,
                      RelaxedRows& rows) const;
  double root_cutting_planes(MinMaxShareProgramme& programme, RootPaths& paths,
                             ContiguityHull& hull, RelaxedRows& rows,
                             std::vector<double>& shares) const;
  // A copy of a boundary's least output over its link (slot 1: at the last micro-batch's size).
  double least_copy(const RootPaths& paths, int j, bool last_size) const;
  // The relaxed root's programme with the stages placed so far held at their work
  // (PrefixProgrammes): a bound on every completion of a prefix.
  struct PrefixProgrammes {
    std::shared_ptr<const MinMaxShareProgramme> root;
    std::shared_ptr<RootPaths> paths;         // the root's pricing of paths, for the prefixes' rows
    std::size_t bytes = 0;                    // about what it holds
    std::vector<std::vector<double>> before;  // [class][t]: the class's work in layers [0, t)
  };
  double prefix_programme_bound(int j, int lo, int hi, double limit);
  std::uint64_t update_prefix_levels(int j, int lo, int hi, std::uint64_t rows_cells);
  // prefix_programme_bound() at stage j's ends [lo, hi], counted in the stage's PrefixDepth
  // (`single`: a call for one end, not a run).
  double counted_prefix_bound(int j, int lo, int hi, double limit, bool single);
  int last_open_end(int j, int a, int first, int last, double arrive, double drain) const;
  void prefix_alive(int j, int lo, int hi, std::vector<std::pair<int, int>>& alive);
  // Per placed stage along the search's path: its programme, the version of its parent's (the
  // stage before's, or the root's) it was copied from, its own version and its first
  // constraint. A sibling whose parent has not changed only moves its constraints' limits.
  // A stage's programme is brought up to date with the path only when a bound needs it.
  struct PrefixLevel {
    MinMaxShareProgramme programme{1, 0.0};
    std::uint64_t parent_version = 0, version = 0;
    std::size_t first_constraint = 0;
    int lo = 0, hi = 0;  // the stage's ends its constraints hold it between
  };
  std::vector<PrefixLevel> prefix_levels_;
  // Per stage, for the open configuration: the prefix programme's calls there, how many it
  // ruled out, their steps, and the steps of the searches below the prefixes that went on.
  struct PrefixDepth {
    std::uint64_t calls = 0, pruned = 0, steps = 0, skipped = 0, subtrees = 0, subtree_steps = 0;
    std::uint64_t trial_steps = 0;  // of calls before it paid, or where it did not
    // Of them, those for one end (not a run; pruned: ends ruled out, a run's counting each).
    std::uint64_t single_calls = 0, single_pruned = 0;
    bool trial = false;  // the last call was one of those
    // The programmes' cutting-plane sweeps here, those that found a longer path, and the
    // programmes (not ruled out by their first solve) asked whether to sweep (cut_due()).
    std::uint64_t cut_sweeps = 0, cut_rows = 0, cut_asked = 0;
    bool cut_due() {
      ++cut_asked;
      return cut_sweeps < kPrefixCutsJudged || kPrefixCutsHit * cut_rows >= cut_sweeps ||
             cut_asked % kPrefixCutsEvery == 0;
    }
  };
  std::vector<PrefixDepth>* prefix_depths_ = nullptr;  // the open configuration's
  bool prefix_pays(int j);
  // Whether the search may use them (the main search of a slice), and the configuration's
  // steps before this slice less the step count at its start.
  bool prefix_allowed_ = false;
  std::int64_t prefix_steps_before_ = 0;
  std::uint64_t prefix_versions_ = 0, prefix_root_version_ = 0;
  std::size_t prefix_bytes_ = 0;  // what the open configurations' PrefixProgrammes hold
  // Every output a stage boundary can carry at a micro-batch size, smallest first (for
  // least_boundary_copies_ms()), sorted once per size.
  const std::vector<double>& boundary_bytes_ascending(const SizeCosts& size) const;
  mutable std::map<const SizeCosts*, std::vector<double>> boundary_bytes_;
  // [class][t]: the work of the layers of each class in [0, t) (work_ is all classes').
  std::vector<std::vector<double>> class_work_before(const std::vector<int>& class_of,
                                                     int classes) const;
  double capped_root(const RelaxedRows& rows, double threshold, std::uint64_t step_limit,
                     bool& finished);
  struct CappedNode;
  int furthest_fitting_end(int j, int a) const;
  bool narrow_ends(std::vector<int>& lo, std::vector<int>& hi) const;
  void solve_capped_node(CappedNode& node, const CappedNode* parent, const RelaxedRows& rows,
                         const std::vector<std::vector<double>>& before);
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
  // One walk of search() over a configuration's balances: the stage ends it may try, where it
  // resumes and where it stops. An argument, never a member: the windows' walks inside a slice
  // leave the slice's own walk as it was.
  struct Walk {
    std::vector<std::pair<int, int>> window;  // per stage: the ends search() tries; empty: all
    std::vector<int> resume;  // per stage: the end a walk cut short stopped at (0: from the start)
    bool resuming = false;    // still on the path to `resume`
    std::uint64_t step_limit = 0;  // the walk stops here (out_of_budget_; `resume` says where)
    bool windowed() const { return !window.empty(); }
  };
  void search(int j, int a, double arrive, double drain, Passes exact, double worst,
              Objective objective, Walk& walk);
  // The ends of a stage search() examines, in turn: [first, last] left to right, or in a
  // window from its centre outwards (turn 0 the centre, then one layer left, one right, two
  // left, ...), within the runs the prefix programme leaves alive where it ruled out some.
  struct EndOrder {
    int first = 0, last = 0;
    int resume = 0;  // the end a resumed walk continues from
    bool from_centre = false;
    int centre = 0, turn = -1;
    std::vector<std::pair<int, int>> alive;  // empty: every end
    std::size_t run = 0;                     // the run of `alive` reached
    int start() { return from_centre ? next(0) : first; }
    // The end after b: the first turn from here within [first, last], or last + 1.
    int next(int b) {
      if (!from_centre) return b + 1;
      for (;;) {
        ++turn;
        const int right = centre + turn / 2, left = centre - (turn + 1) / 2;
        if (right > last && left < first) return last + 1;
        const int end = turn % 2 == 0 ? right : left;
        if (end >= first && end <= last) return end;
      }
    }
    // Moves b into the next run alive at or after it; false past the last run.
    bool skip_to_alive(int& b) {
      if (alive.empty()) return true;
      while (run < alive.size() && alive[run].second < b) ++run;
      if (run == alive.size()) return false;
      b = std::max(b, alive[run].first);
      return true;
    }
  };
  bool end_order(int j, int a, double arrive, double drain, const Passes& exact,
                 Objective objective, const Walk& walk, EndOrder& order);
  Passes onward_passes(int a, int b, const StageDurations& d, const Passes& exact) const;
  bool memory_node(int j, int a, int b, double worst, double limit, Walk& walk);
  double prefix_sweep_bound(int j, int b, const Passes& onward, double drain, double limit);
  // The exact search with every stage end within kAroundBestRadius of the best plan's, for a
  // plan faster by kAroundBestMargin at least, again around each one it finds, until none is or
  // `step_limit`. A heuristic (the margin and the window prove nothing): the moves of polish()
  // stall where the next faster plan shifts a run of ends by one or two layers each.
  void search_around_best(std::uint64_t step_limit);
  // The exact search with every stage end within `radius` of `centre`'s, each stage's ends
  // from there outwards, for a plan faster than the best by kAroundBestMargin at least, until
  // `step_limit`; the main search's resume path kept. Returns whether it finished.
  bool search_around(const std::vector<int>& centre, int radius, std::uint64_t step_limit);
  int first_open_end(int j, int a, double arrive, double drain, const Passes& exact,
                     bool windowed) const;
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
  // What a plan must beat; in a window (`windowed`), by kAroundBestMargin.
  double threshold(Objective objective, bool windowed = false) const {
    if (objective == Objective::Memory) return lean_best_;
    const double time = std::min(config_best_, ranking_threshold_);
    return windowed ? time * (1.0 - kAroundBestMargin) : time;
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
  std::vector<std::vector<int>> fit_end_;      // [j][a]: the furthest end fitting device j's cap
  StagePeakShape peak_shape_;                  // of the configuration, for memory_bound()
  std::vector<bool> receives_senders_tensor_;  // per stage: StagePeakShape's, from the hardware
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
  // 1F1B: the least busiest steady_work() of the later stages, per suffix (min-max as suffix_).
  std::vector<std::vector<double>> steady_, steady_floor_;
  double steady_work(int j, int a, int b) const;
  // The same three tables made non-increasing in the suffix's start, for first_open_end().
  std::vector<std::vector<double>> suffix_floor_, chained_floor_, waits_floor_;
  std::vector<int> balance_;
  std::vector<StageDurations> durations_;           // of the stages placed, for the sweep
  std::shared_ptr<const PrefixProgrammes> prefix_;  // the open configuration's, if any
  std::unique_ptr<IterationSweep> sweep_;           // leaves of this configuration
  std::vector<double> pass_first_, pass_last_;      // suffix sums: see prepare()
  std::vector<double> after_speed_;                 // fastest device after stage j
  // [j][b]: the least time of one pass (pass_first_, pass_last_) through layers [b, L) on the
  // stages after j at their own speeds, over the ways to place them that could beat the
  // threshold (see build_trip_tables()); empty: not built.
  std::vector<std::vector<double>> trip_first_, trip_last_;
  // [k][a]: the furthest end of stage k (0 < k < K - 1) from a over the same ways to place the
  // later stages, a where it cannot take a layer (see build_trip_tables()); empty with them.
  std::vector<std::vector<int>> furthest_;
  std::vector<SteadyPace> steady_paces_;  // the prefix sweep's, reused
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

  // build_suffix_tables()'s output for one configuration, kept between its slices.
  struct Tables {
    std::vector<std::vector<double>> suffix, chained, waits, suffix_floor, chained_floor,
        waits_floor, fitting, steady, steady_floor;
    std::vector<std::vector<int>> fit_end;
  };
  void swap_tables(Tables& t);
  std::size_t table_bytes() const;
  std::size_t table_cache_bytes_ = 0;
  double keep_prefix_programme(Entry& e, std::vector<int>& relaxed, RelaxedRows* rows = nullptr);
  std::vector<PrefixDepth>* open_alone(Entry& e);
  void polish_unpolished(std::vector<Entry>& entries);
  void store_tables(Entry& e);
  double ranking_threshold(const std::vector<Entry>& entries, const Entry* self) const;
  bool open(Entry& e, const std::vector<Entry>& entries, bool tables = true);
  void open_root(Entry& e, const std::vector<Entry>& entries);
  void keep(Entry& e);
  void search_slice(Entry& e, std::vector<Entry>& entries, std::uint64_t slice);
  // Multi-stage schedules (see multi_stage_slice()).
  // A configuration's stage count: its stages per device on every device.
  int stage_count(const Config& c) const { return c.stages_per_device * stages_; }
  double multi_stage_bound(const Config& c, bool with_copies = false) const;
  Config config_of(const Plan& plan) const;
  // Per stage of c, its device (torch's stage-to-programme mapping, programme r on device r).
  std::vector<int> stage_devices_of(const Config& c) const;
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
                                  StageWorkRows* rows, double* copies_bound = nullptr);
  class MultiStageRoot;
  void keep_root_plans(const MultiStageRoot& root, const LayerWork& layer_work,
                       std::vector<std::vector<int>>& balances);
  void root_rows(const MultiStageRoot& root, StageWorkRows& rows) const;
  void multi_stage_slice(Entry& e, std::vector<Entry>& entries, std::uint64_t slice);
  void enumerate_balances(Entry& e, GraphSweep* sweep, std::uint64_t limit);
  void multi_stage_local_search(Entry& e, GraphSweep* sweep, std::uint64_t limit);
  bool take_if_better(Entry& e, GraphSweep* sweep, std::vector<int> next);
  void next_start(Entry& e, GraphSweep* sweep, int widest, std::uint64_t limit);
  void descend_one_end(Entry& e, GraphSweep* sweep, int widest, std::uint64_t limit);
  void move_between_distant_stages(Entry& e, GraphSweep* sweep, std::uint64_t limit);
  // A configuration's balances timed without simulating them (GraphSweep), where that is exact;
  // null otherwise. Built per slice: a graph of every configuration held at once costs more
  // memory than its build costs time.
  std::unique_ptr<GraphSweep> graph_sweep(const Config& c);
  double swept_time(GraphSweep& sweep, const std::vector<int>& balance);
  bool fits_some_balance(Entry& e);
  bool later_stages_may_fit(MultiStagePeakBound& peak, int t, int b);
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
  class ProxyMoves;
  std::vector<int> proxy_descent(MultiStagePeakBound& peak, const StageWorkRows& rows,
                                 std::vector<int> balance, const std::vector<double>& limit);
  // The peak bound of multi-stage configuration c, its walk over the schedule charged.
  MultiStagePeakBound& peak_bound(Entry& e);
  // `relax()`, one of `peak`'s relaxations (may_fit()), with what it costs charged: its
  // partitions' and master programme's cells.
  template <typename Relax>
  bool charged(const MultiStagePeakBound& peak, Relax&& relax) {
    const std::uint64_t partition = peak.partition_cells(), pivot = peak.pivot_cells();
    const bool out = relax();
    stats_.steps += (peak.partition_cells() - partition) / kPartitionCellsPerStep +
                    (peak.pivot_cells() - pivot) / kMasterCellsPerStep;
    return out;
  }
  // A sweep of stages 0..last of a single-stage plan (IterationSweep), charged.
  void charge_sweep(int last) {
    stats_.steps += 1 + sweep_->prefix_task_count(last) / kIterationSweepTasksPerStep;
  }
  // Less memory excess, then less time.
  static bool better(const Score& x, const Score& y) {
    return x.excess < y.excess || (x.excess == y.excess && x.time < y.time);
  }
};

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

// Where a multi-stage relaxed root's rounds stopped, for the next slice to go on from (see
// multi_stage_relaxed_root()).
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
  // Per function of the programme: how much more its path's copies cost, over every balance,
  // than at the least output each (least_boundary_copies_ms()); and the last solve's value and
  // weights, with which these raise the bound (copies_bound of multi_stage_relaxed_root()).
  std::vector<double> copy_excess;
  std::vector<double> weights;
  double last_value = 0.0;
  RelaxedRootState(int stages, const std::vector<double>& class_work)
      : programme(static_cast<std::size_t>(stages), class_work) {}
};

// Each configuration's state between its slices of the search.
struct PlanSearch::Entry {
  const Config* config = nullptr;
  double root = 0.0;               // lower bound on every plan of the configuration
  double best = kInf;              // its best fitting plan so far
  PlanCandidate candidate;         // that plan
  std::uint64_t slice = 0;         // the steps its last slice was given
  std::vector<int> resume;         // where its last slice stopped (see search())
  std::vector<int> relaxed_plan;   // single-stage: the relaxed root's, until searched around
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
  // Single-stage: the relaxed root's programme for the prefix bound, and what it did per stage.
  std::shared_ptr<const PrefixProgrammes> prefix;
  std::vector<PrefixDepth> prefix_depths;
  // Multi-stage: the relaxed root ran all its rounds (else a slice runs it on, further).
  bool root_complete = false;
  // Multi-stage: where the relaxed root's rounds stopped, until they are complete.
  std::unique_ptr<RelaxedRootState> root_state;
  // Multi-stage: the relaxed root with its paths' copies at distinct outputs (copies_bound of
  // multi_stage_relaxed_root()), counted only once the search is over.
  double copies_root = 0.0;
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

}  // namespace pipetune::planning
