#pragma once
// The planner's tuning constants, in one place. None changes what is proven, only how soon: each
// trades steps of the budget (a step is about 50 ns of work) or memory against bound strength.
// How each value was chosen, with the measurements: docs/planner.md, "Tuning constants".

#include <cstddef>
#include <cstdint>

namespace pipetune::planning {

// --- What a step of the budget is worth, per kind of work -------------------------------------
// Tableau cells a pivot updates per step (a cell costs about 1.5 ns).
inline constexpr std::uint64_t kPivotCellsPerStep = 32;
// The same for a multi-stage relaxed root's programme (0.35-0.9 ns a cell).
inline constexpr std::uint64_t kRootPivotCellsPerStep = 64;
// Min-sum partition cells (MultiStagePeakBound::may_fit()) per step (about 6 ns each).
inline constexpr std::uint64_t kPartitionCellsPerStep = 8;
// Pivot cells of may_fit()'s master programme per step (about 0.7 ns each).
inline constexpr std::uint64_t kMasterCellsPerStep = 64;
// Tasks of a task-graph sweep (GraphSweep) or memory walk per step.
inline constexpr std::size_t kSweepTasksPerStep = 8;
// Compute tasks of an IterationSweep per step (about 2.7 ns each).
inline constexpr std::size_t kIterationSweepTasksPerStep = 18;
// (Moment, stage) terms of MultiStagePeakBound's device bounds per step.
inline constexpr std::uint64_t kLevelCellsPerStep = 8;
// Evaluations of min_max_partition_bisected() per step (5-9 ns each).
inline constexpr std::uint64_t kPartitionEvaluationsPerStep = 8;

// --- Relaxed roots ------------------------------------------------------------------------------
// Cutting-plane rounds of the single-stage relaxed root: more rounds, a tighter root, more pivots.
inline constexpr int kRelaxedRootRounds = 40;
// How far each multi-stage round's model plan moves towards the solve's shares: smaller is
// steadier, larger reaches the shares' paths in fewer rounds.
inline constexpr double kModelPlanStep = 0.3;
// A multi-stage root's programme takes the primal form (a row per function) where its
// coordinates (stages x classes) are at least this many times the functions its rounds may add,
// else the dual form (a row per coordinate): the primal's pivots are cheaper as coordinates
// outnumber functions, the dual's absorb a new function in fewer pivots.
inline constexpr double kPrimalRootWidthPerFunction = 1.0;
// The single-stage root's coordinates (stages x classes) it aims for: more classes bound each
// layer by ratios nearer its own, at a programme that costs more per solve.
inline constexpr int kRatioCoordinates = 64;
// The fewest and most classes of layers a root may have, whatever its stage count.
inline constexpr int kFewestRatioClasses = 4, kMostRatioClasses = 32;
// Nodes of capped_root()'s branching over stages that do not fit: a tighter capped root
// against steps spent before the search starts.
inline constexpr int kCappedRootNodes = 64;

// --- The exact single-stage search --------------------------------------------------------------
// Stage ends around the best plan that search_around_best() tries, and the margin a plan must
// beat the best by there: a wider window finds more, at steps the proof may need.
inline constexpr int kAroundBestRadius = 2;
inline constexpr double kAroundBestMargin = 2e-4;
// Stage ends around the relaxed root's plan that SingleStageSearch::slice() tries first.
inline constexpr int kAroundRelaxedRadius = 1;
// The most steps a window (search_around()) may take: it finds a plan soon or not at all.
inline constexpr std::uint64_t kWindowSteps = 1 << 20;
// Bytes of prepared tables kept between a configuration's slices (saves rebuilding them).
inline constexpr std::size_t kTableCacheBytes = std::size_t{128} << 20;

// --- The prefix programmes (the search's bound on every completion of a prefix) -----------------
// Share of a configuration's steps the programmes may spend before they have paid at a stage.
inline constexpr double kPrefixTrialShare = 1.0 / 8;
// Calls a stage always makes to measure whether its programme pays, and then one in this many.
inline constexpr std::uint64_t kPrefixFirstCalls = 4, kPrefixSampleEvery = 32;
// Ends a stage must have before the programmes rule out runs of them at a time.
inline constexpr int kPrefixRunLeast = 8;
// Single-end calls at a stage (three in four ruling out their end) before runs are tried.
inline constexpr std::uint64_t kPrefixRunAfter = 16;
// What all configurations' prefix programmes may hold.
inline constexpr std::size_t kPrefixProgrammeBytes = std::size_t{64} << 20;
// Cutting-plane rounds of a prefix programme, and the rows a stage may add to the root's.
inline constexpr int kPrefixRounds = 4;
inline constexpr std::size_t kPrefixRowsMost = 64;
// Cutting-plane sweeps judged at a stage; below one in kPrefixCutsHit finding a longer path,
// only one programme in kPrefixCutsEvery sweeps.
inline constexpr std::uint64_t kPrefixCutsJudged = 32;
inline constexpr std::uint64_t kPrefixCutsHit = 4;
inline constexpr std::uint64_t kPrefixCutsEvery = 16;

// --- Local search ------------------------------------------------------------------------------
// polish(): how far a stage end moves, and the longest run of ends moved together.
inline constexpr int kPolishReach = 4, kPolishLongestRun = 4;
// Kicks of a multi-stage configuration's best plan that its local search descends from: more
// kicks, better local optima, fewer steps for the enumeration.
inline constexpr int kLocalSearchKicks = 16;

// --- Memory bounds -----------------------------------------------------------------------------
// Stages whose full memory bound is kept per configuration (about 40 bytes each).
inline constexpr std::size_t kFullBoundsKept = 1 << 20;
// MultiStagePeakBound::may_fit()'s master: row-generation rounds, and rows added per round.
inline constexpr int kMasterRounds = 32;
inline constexpr std::size_t kMasterRowsAtOnce = 8;

// --- The linear programmes' solver -------------------------------------------------------------
// Degenerate pivots under Dantzig's rule before Bland's rule takes over until one makes progress.
inline constexpr std::size_t kDegenerateRun = 32;

}  // namespace pipetune::planning
