#pragma once

// The planner: the plan with the shortest simulated iteration whose simulated peak memory fits
// every device, searched exactly.
//
// A configuration is a (micro-batch split, checkpoint mode, schedule) triple; within one, the
// balance is searched by branch and bound over stage boundaries. Every leaf is a complete plan
// timed by IterationSweep, which equals the simulator's time exactly (the simulator itself runs
// for a leaf that would be the new best, for its memory), so the answer is optimal under the
// simulator's model, not under a proxy. (On shares of one GPU, whose backwards' launches take
// turns, the sweep is a lower bound, and a leaf is the best by its simulated time alone.) The
// bounds that prune are lower bounds on the simulated time of every plan below a node
// (docs/planner.md): per placed stage, its busy time plus the waits its programme cannot fill
// (1F1B: micro-batch 0's round trip through the later stages and the last one's; GPipe: the last
// ones'), the passes before and after it; a sweep of the placed stages with the later ones as round
// trips; and, for the layers not yet placed, exact min-max tables over suffixes. A per-stage memory
// lower bound rules out stages that cannot fit. Every configuration first gets its root bound and a
// first plan (a cheap pass, whatever the budget); the budget then goes in rounds of growing slices
// to the configurations whose bound is still below the best plan, lowest bound first, so that none
// starves the others. The multi-stage schedules (listed in PlannerOptions::schedules) are not
// branched and bounded: a sound balance-free bound, and balances timed by simulating (all of them
// when they fit the budget, else a local search), docs/planner.md.

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "sim/hardware.hpp"
#include "sim/plan.hpp"
#include "sim/profile.hpp"

namespace pipetune {

struct StageWorkRows;  // sim/planner/multi_stage_peak_bound.hpp

struct PlannerOptions {
  std::vector<int> chunks;  ///< chunk counts to try; empty: every count from 1 to the batch size
  std::vector<CheckpointMode> checkpoints{std::begin(kAllCheckpointModes),
                                          std::end(kAllCheckpointModes)};
  /// Every schedule by default: the one search space of the library, `plan`, `validate`, the
  /// demo and the GUI.
  std::vector<ScheduleKind> schedules{std::begin(kAllScheduleKinds), std::end(kAllScheduleKinds)};
  /// Stages per device tried for interleaved-1f1b, interleaved-zb and looped-bfs (zbv: 2);
  /// a count is tried only where the model has a layer for each of the v x devices stages.
  std::vector<int> stages_per_device{2};
  double optimizer_state_factor = 0.0;
  int stages = 0;       ///< 0: one stage per device; k: the first k devices
  std::size_t top = 5;  ///< configurations to rank
  /// Work allowed before the search stops proving: one step per partial balance examined, one
  /// per eighteen compute tasks of a single-stage plan swept and per eight tasks of a multi-stage
  /// plan's graph swept, one per task simulated and half one per layer a simulation walks
  /// (per micro-batch size). When it runs out, the best plans found so far are returned with a
  /// proven lower bound (PlannerStats). About 20 million steps a second on one core (more where the
  /// steps are multi-stage roots and simulations). Shared
  /// between the configurations (see above); the cheap pass over them counts its work here but
  /// runs in full even past the budget (but for multi-stage first plans, docs/planner.md).
  /// Where the schedules hold both one-stage and multi-stage ones, the one-stage configurations
  /// are searched first with the whole budget, as they would be alone, and then every
  /// configuration with it again (so up to twice the steps): an answer never slower than the
  /// GPipe and 1F1B search's at the same budget.
  std::uint64_t search_budget = 10'000'000;
  /// A plan fits only if its peak in the worst arrival order the schedule allows fits too
  /// (worst_order_peaks(), docs/memory-model.md), not only its predicted peak: no step's timing
  /// can make it run out. Costs one max-flow per device for each plan that would be a
  /// configuration's new best under a memory cap.
  bool worst_order_memory = false;
  /// Only plans whose stages after the first do not change their input in place
  /// (torch_changed_stage_input(), sim/planner/runtime_support.hpp): torch's runtime hands a
  /// stage its input as a leaf that needs a gradient and refuses that.
  bool stage_inputs_unchanged = false;
  /// Only plans whose middle stages, under a schedule that splits the backward, do not end with
  /// a view (torch_view_stage_output()): torch's I detaches a stage's output in place.
  bool stage_outputs_detachable = false;
  /// Whether checkpoint always is searched under the schedules that split the backward
  /// (interleaved-zb, zbv, dualpipev). Not for torch's runtime (torch_cannot_run()).
  bool checkpointed_split_backward = true;
  std::function<void(std::size_t done, std::size_t total)> progress;
};

struct PlanCandidate {
  Plan plan;
  int micro_batches = 0;
  double iteration_ms = 0.0;
  double throughput_samples_per_s = 0.0;
  double bubble_fraction = 0.0;
  std::vector<double> busy_ms;                      ///< per stage (its own device)
  std::vector<std::int64_t> peak_memory_bytes;      ///< per stage
  std::vector<std::int64_t> memory_capacity_bytes;  ///< per stage, 0: unknown
  /// Per stage, the peak in the worst arrival order; filled with worst_order_memory.
  std::vector<std::int64_t> worst_order_peak_bytes;
  std::int64_t max_peak_memory_bytes() const;
};

/// What the search spent on one configuration.
struct ConfigurationStats {
  int chunks = 0;  ///< the smallest chunk count giving its split
  int micro_batches = 0;
  CheckpointMode checkpoint = CheckpointMode::Never;
  ScheduleKind schedule = ScheduleKind::GPipe;
  int stages_per_device = 1;
  /// Its root bound was computed and its first plan simulated (a multi-stage configuration's
  /// first plan waits for its first slice once the cheap pass has spent half the budget).
  bool evaluated = false;
  bool closed = false;     ///< searched to the end, or ruled out by a bound
  std::size_t slices = 0;  ///< slices of the search it was given
  /// Partial balances examined (multi-stage: balances simulated), and steps spent.
  std::uint64_t nodes = 0, steps = 0;
  double lower_bound_ms = 0.0;  ///< its root bound
  double best_ms = 0.0;         ///< its best fitting plan, 0: none found
};

struct PlannerStats {
  std::size_t configurations = 0;  ///< distinct (split, checkpoint, schedule, v) configurations
  std::size_t configurations_skipped = 0;   ///< ruled out by a bound, never searched
  std::size_t configurations_searched = 0;  ///< given a root bound and a first plan
  std::uint64_t nodes = 0;                  ///< partial balances examined
  std::uint64_t simulations = 0;            ///< full simulations (a new best plan's memory)
  std::uint64_t sweeps = 0;                 ///< balances timed by a sweep (simulated if a best)
  std::uint64_t prefix_sweeps = 0;          ///< partial balances bounded by a sweep of their stages
  std::uint64_t prefix_programmes = 0;      ///< partial balances bounded by the relaxed programme
  std::uint64_t steps = 0;  ///< nodes, swept and simulated tasks (see search_budget), against it
  bool proven = true;       ///< the best plan is optimal under the simulator (the search finished)
  /// No fitting plan is faster than this: the best plan's time when proven, else the least
  /// bound over what the search left unexplored.
  double lower_bound_ms = 0.0;
  double gap() const;  ///< (best - lower bound) / best, 0 when proven
  double best_ms = 0.0;
  /// In the order of their balance-free bounds.
  std::vector<ConfigurationStats> per_configuration;
};

struct PlanSearchResult {
  /// The best plan of each configuration, fastest first, at most `top` of them. Empty when no
  /// plan fits, or when the budget ended before one that fits was found (then
  /// none_fits_proven is false).
  std::vector<PlanCandidate> ranked;
  PlannerStats stats;
  /// ranked is empty because no plan of any configuration fits: every one was ruled out.
  bool none_fits_proven = false;
  /// Only when nothing fits: the plan whose largest per-device peak is smallest, i.e. the
  /// memory per device at which a plan would fit, and which plan.
  std::optional<PlanCandidate> leanest;
  bool leanest_proven = true;
  /// search_space_text() of the search: what "optimal" and the bounds hold over.
  std::string search_space;
  /// Where one-stage and multi-stage schedules were both searched: what the one-stage search,
  /// run first and alone with the whole budget (docs/planner.md, "One-stage schedules first"),
  /// ended with. The fastest plan over every schedule is never slower than `best`.
  struct OneStageAnswer {
    std::optional<PlanCandidate> best;  ///< its fastest fitting plan, if it found one
    double lower_bound_ms = 0.0;  ///< no fitting one-stage plan is faster (infinite: none fits)
    bool proven = false;          ///< `best` is optimal over them; without `best`, none fits
  };
  std::optional<OneStageAnswer> one_stage;
};

/// The default options narrowed to GPipe and 1F1B (one stage per device).
PlannerOptions single_stage_planner_options();

/// The space a search covers, in words, for every claim of optimality to name: "every balance,
/// chunk count (1 to 256), checkpoint mode and schedule (2 stages per device in the interleaved
/// and looped ones)", or the lists where options narrow them. `batch` bounds the default chunks.
std::string search_space_text(const PlannerOptions& options, std::int64_t batch);

/// Throws InputError when the search is impossible (fewer layers than stages, a chunk count
/// outside 1..batch size).
PlanSearchResult find_best_plans(const Profile& profile, const Hardware& hardware,
                                 const PlannerOptions& options);

/// The lower bound the planner prunes multi-stage balances with (docs/planner.md): no plan with
/// `plan`'s balance simulates faster. `plan` is a multi-stage plan that check_plan accepts, its
/// stage s on device stage_rank(s).
double multi_stage_balance_bound(const Profile& profile, const Hardware& hardware,
                                 const Plan& plan);

/// The balance-free bound of `plan`'s multi-stage configuration (its chunks, checkpoint mode,
/// schedule and stages per device; not its balance), the root of a configuration whose relaxed
/// root has not run: no balance simulates faster (docs/planner.md).
double multi_stage_configuration_bound(const Profile& profile, const Hardware& hardware,
                                       const Plan& plan);

/// The bounds the planner prunes single-stage plans' prefixes with by the relaxed root's
/// programme (docs/planner.md, "The relaxed root's programme along the search"), asked for
/// `plans` in turn as the search meets them (each stage's programme carried from one to the
/// next): element [i][j] bounds every plan of the configuration whose first j stages are
/// plans[i]'s and whose stage j ends within `widen` layers of where plans[i]'s does, for j from
/// 0 to stages - 2. A bound may stop once it reaches `limit`, as the search's do at its
/// threshold. `plans` are single-stage plans of one configuration (chunks, checkpoint mode and
/// schedule) that check_plan accepts; the hardware's devices are the plans'.
std::vector<std::vector<double>> single_stage_prefix_bounds(
    const Profile& profile, const Hardware& hardware, const std::vector<Plan>& plans, int widen = 0,
    double limit = std::numeric_limits<double>::infinity());

/// The planner's search around a single-stage plan (docs/planner.md, "Polishing and repair"):
/// the plans of `centre`'s configuration whose stage ends each lie within `radius` layers of
/// `centre`'s, searched with its bounds, each stage's ends from `centre`'s outwards, with
/// `centre` as the plan to beat where it fits. Returns the fastest fitting plan it found,
/// `centre` included (iteration_ms 0: none); no fitting plan in the window is faster than
/// (1 - 2e-4) times it, the margin that keeps such a search short where many plans lie within
/// a hair of each other. The hardware's devices are the plan's.
PlanCandidate single_stage_best_around(const Profile& profile, const Hardware& hardware,
                                       const Plan& centre, int radius);

/// The rows of the relaxed root of `plan`'s multi-stage configuration (its chunks, checkpoint
/// mode, schedule and stages per device; not its balance), its rounds run to the end: functions
/// of a balance, linear in each stage's work per class of layers, none above the simulated time
/// of any balance (docs/planner.md). Under memory caps the planner asks
/// MultiStagePeakBound::may_fit() with them whether a balance may both fit and beat its best
/// plan. The hardware's devices are the plan's.
StageWorkRows multi_stage_time_rows(const Profile& profile, const Hardware& hardware,
                                    const Plan& plan);

}  // namespace pipetune
