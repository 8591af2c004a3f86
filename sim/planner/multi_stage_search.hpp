#pragma once
// The multi-stage search (docs/planner.md, "Several stages per device"): the configurations of
// the looped, interleaved and V schedules, bounded by relaxed roots over their task graphs
// (multi_stage_root.cpp) and searched by local search from rounded roots, then by enumeration
// where the budget allows (multi_stage_search.cpp).

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "sim/planner/graph_sweep.hpp"
#include "sim/planner/minimax_bound.hpp"
#include "sim/planner/multi_stage_peak_bound.hpp"
#include "sim/planner/root_programme.hpp"
#include "sim/planner/search_context.hpp"
#include "sim/planner/tuning.hpp"

namespace pipetune::planning {

// Each layer's share of a configuration's work: its forward and backward at every micro-batch
// (the multi-stage relaxed root's shares are of this), and the prefix sums of those.
struct LayerWork {
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
struct RelaxedRootState {
  RootProgramme programme;
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
  // Each stage end on the hull of what a run of layers holds, cut once no path is above the
  // bound any more (set by the root's first call).
  std::optional<ContiguityHull> hull;
  // best_plan and shares when the first of the hull's cuts were added (empty before).
  std::vector<std::vector<double>> unhulled;
  RelaxedRootState(int stages, const std::vector<double>& class_work, std::size_t functions)
      : programme(static_cast<std::size_t>(stages), class_work, functions) {}
};

class MultiStageSearch : private SearchPart {
 public:
  explicit MultiStageSearch(SearchContext& context);

  // A configuration's bound before any search; `at_the_end`, the final one: with micro-batch
  // 0's copies and one layer's device (layer_device_bound()) too.
  double bound(const Config& c, bool at_the_end = false) const;
  // The cheap pass over entry e: its relaxed root, as far as an allowance of the budget goes,
  // and its first plans, unless a bound closes it. `ranking_threshold`: what e must beat.
  void open_root(Entry& e, double ranking_threshold);
  // One slice of e's search, `steps` long at most: the local search, then the enumeration.
  void slice(Entry& e, double ranking_threshold, std::uint64_t steps);

  // Test seams (planner.hpp): a plan's relaxed-root rows, its configuration's bound.
  StageWorkRows time_rows_of(const Plan& plan);
  double configuration_bound_of(const Plan& plan) const;

 private:
  double ranking_threshold_ = kInf;  // what the configuration in its slice must beat to rank

  // The least that micro-batch 0's copies add to any balance of c (bound()'s at_the_end).
  double least_copies(const Config& c) const;
  double multi_stage_relaxed_root(const Config& c, const LayerWork& work, std::uint64_t step_limit,
                                  double enough, std::unique_ptr<RelaxedRootState>& state,
                                  bool* complete, std::vector<std::vector<int>>* balances,
                                  StageWorkRows* rows, double* copies_bound = nullptr);
  class MultiStageRoot;
  void keep_root_plans(const MultiStageRoot& root, const LayerWork& layer_work,
                       std::vector<std::vector<int>>& balances);
  void root_rows(const MultiStageRoot& root, StageWorkRows& rows) const;
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
  // A root's classes of layers and the hull of their runs depend on the split's work and the
  // stage count alone, which the configurations of every checkpoint mode and schedule share:
  // built once for them (their sort and walks were a twentieth of a random instance's time).
  struct RootClasses {
    RatioClasses classes;
    ContiguityHull hull;
  };
  const RootClasses& root_classes(const Config& c, const LayerWork& work, int stages);
  std::map<std::pair<std::vector<std::int64_t>, int>, std::unique_ptr<const RootClasses>>
      root_classes_;
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
    context_.stats.steps += (peak.partition_cells() - partition) / kPartitionCellsPerStep +
                            (peak.pivot_cells() - pivot) / kMasterCellsPerStep;
    return out;
  }
};

}  // namespace pipetune::planning
