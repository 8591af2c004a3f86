#pragma once
// The single-stage search (docs/planner.md): one stage per device, each configuration's balances
// searched exactly by branch and bound over prepared tables of bounds, a relaxed root and prefix
// programmes. Its members are defined by concept across
//   single_stage_search.cpp  a configuration prepared, opened, searched in slices;
//   stage_bounds.cpp         time bounds on balances and their stage tables;
//   memory_bound.cpp         memory bounds on stages and the ends caps allow;
//   relaxed_root.cpp         roots over continuous shares of the work;
//   prefix_bound.cpp         the relaxed root's programme held at a prefix of stages;
//   branch_and_bound.cpp     the exact search, its round trip tables, the search around a plan;
//   polish.cpp               local search (polish, repair).

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sim/memory_model.hpp"
#include "sim/partition.hpp"
#include "sim/planner/minimax_bound.hpp"
#include "sim/planner/search_context.hpp"
#include "sim/planner/stage_timing.hpp"
#include "sim/planner/tuning.hpp"

namespace pipetune::planning {

// What the single-stage relaxed root prices the iteration's paths with
// (SingleStageSearch::path_row()): each kind of task's least and mean ratio to a layer's work per
// class, its total over the model, and a stage's tasks on a path priced together (joint_least(),
// each count vector walked over the layers once). Kept with the root's programme, so that the
// search's prefix programmes add the paths of their own shares.
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
// A single-stage configuration's tables (build_suffix_tables()), kept between its slices.
struct SingleStageTables {
  std::vector<std::vector<double>> suffix, chained, waits, suffix_floor, chained_floor, waits_floor,
      fitting, steady, steady_floor;
  std::vector<std::vector<int>> fit_end;
};

// The relaxed root's programme, kept for capped_root(): its functions (every wait row and
// cutting plane) and the layers' classes.
struct RelaxedRows {
  std::vector<double> constant;
  std::vector<std::vector<double>> slope;
  std::vector<double> totals;  // per class
  std::vector<int> class_of;   // per layer
};

// The relaxed root's programme with the stages placed so far held at their work
// (PrefixProgrammes): a bound on every completion of a prefix.
struct PrefixProgrammes {
  std::shared_ptr<const MinMaxShareProgramme> root;
  std::shared_ptr<RootPaths> paths;         // the root's pricing of paths, for the prefixes' rows
  std::size_t bytes = 0;                    // about what it holds
  std::vector<std::vector<double>> before;  // [class][t]: the class's work in layers [0, t)
};

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

class SingleStageSearch : private SearchPart {
 public:
  explicit SingleStageSearch(SearchContext& context);

  // A configuration's bound before any search (cheap_bound()): the order the budget visits it in.
  double cheap_bound_of(const Config& c);
  // The cheap pass over entry e: its root bound and first plans, unless a bound closes it.
  // `ranking_threshold`: what e must beat to enter the ranking.
  void open_root(Entry& e, double ranking_threshold);
  // One slice of the branch and bound over e's balances, resumed where the last one stopped,
  // `steps` long at most; closes e when the search ends.
  void slice(Entry& e, double ranking_threshold, std::uint64_t steps);
  // Polishes e's best plan (its next slice would have) within `step_limit`.
  void polish_best(Entry& e, double ranking_threshold, std::uint64_t step_limit);
  // Nothing fits: the plan whose largest peak is least, over every single-stage configuration
  // of `configs`, within the budget; whether the search finished.
  bool search_leanest(const std::vector<Config>& configs);
  const std::optional<PlanCandidate>& leanest() const { return lean_candidate_; }

  // Test seams (planner.hpp): each configuration's prefix bounds, the best plan near one.
  std::vector<std::vector<double>> prefix_bounds_of(const std::vector<Plan>& plans, int widen,
                                                    double limit);
  PlanCandidate best_around_of(const Plan& centre, int radius);

 private:
  bool out_of_budget_ = false;  // the last walk stopped at its step limit

  enum class Objective { Time, Memory };

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
  // A copy across the boundary after stage j, which ends at layer b: the activation, and the
  // gradient back (no bytes where the boundary lies in a frozen stem).
  double copy(const SizeCosts& c, int j, int b) const {
    return context_.link[j]->transfer_ms(static_cast<double>(c.output_bytes[b - 1]));
  }
  double gradient_copy(const SizeCosts& c, int j, int b) const {
    return context_.link[j]->transfer_ms(static_cast<double>(c.stage_input_gradient_bytes(b)));
  }
  double pass_filler(int j, int a, int b) const;
  double tail(int j, int a, int b) const;
  double chained_cost(int j, int a, int b, double recompute = 0.0) const;
  double balance_free_bound() const;
  // A prepared single-stage configuration's bound before any search: the balance-free bound and
  // the least largest stage of each kind of stage cost (greedy_bound()).
  double cheap_bound() const;
  template <typename Cost>
  double greedy_bound(Cost cost) const;
  void build_suffix_tables();
  std::vector<int> busy_balanced() const;
  std::vector<std::vector<int>> fit_ends(double share) const;
  int fitting_end(int j, int a, int end, int limit, double cap) const;
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
  std::vector<PrefixDepth>* prefix_depths_ = nullptr;  // the open configuration's
  bool prefix_pays(int j);
  // Whether the search may use them (the main search of a slice), and the configuration's
  // steps before this slice less the step count at its start.
  bool prefix_allowed_ = false;
  std::int64_t prefix_steps_before_ = 0;
  std::uint64_t prefix_versions_ = 0, prefix_root_version_ = 0;
  std::size_t prefix_bytes_ = 0;  // what the open configurations' PrefixProgrammes hold
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

  void swap_tables(SingleStageTables& t);
  std::size_t table_bytes() const;
  std::size_t table_cache_bytes_ = 0;
  double keep_prefix_programme(Entry& e, std::vector<int>& relaxed, RelaxedRows* rows = nullptr);
  std::vector<PrefixDepth>* open_alone(Entry& e);
  void store_tables(Entry& e);
  // Prepares e's configuration (tables unless `tables` is false, sweep); false where its
  // root rules it out.
  bool open(Entry& e, double ranking_threshold, bool tables = true);
  void keep(Entry& e);
  // A sweep of stages 0..last of a plan (IterationSweep), charged.
  void charge_sweep(int last) {
    context_.stats.steps += 1 + sweep_->prefix_task_count(last) / kIterationSweepTasksPerStep;
  }
};

}  // namespace pipetune::planning
