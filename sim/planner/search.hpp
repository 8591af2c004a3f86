#pragma once
// The planner's search behind find_best_plans() (docs/planner.md), internal to sim/planner/: one
// PlanSearch per call. It holds what lives as long as the call (the configurations, each one's
// Entry between its slices of the budget, the ranking) and hands each configuration to the part
// that searches its kind:
//   single_stage_search.hpp  one stage per device: prepared tables, exact branch and bound;
//   multi_stage_search.hpp   several stages per device: relaxed roots over task graphs, local
//                            search and enumeration.
// What the parts share (devices, simulator, stats) is the SearchContext (search_context.hpp);
// the tuning constants are in tuning.hpp.

#include <cstdint>
#include <vector>

#include "sim/hardware.hpp"
#include "sim/planner/multi_stage_search.hpp"
#include "sim/planner/planner.hpp"
#include "sim/planner/search_context.hpp"
#include "sim/planner/single_stage_search.hpp"
#include "sim/profile.hpp"

namespace pipetune::planning {

class PlanSearch {
 public:
  PlanSearch(const Profile& profile, const Hardware& hardware, const PlannerOptions& options)
      : context_(profile, hardware, options), single_(context_), multi_(context_) {}

  PlanSearchResult run();

  // Test seams (planner.hpp).
  StageWorkRows time_rows_of(const Plan& plan) { return multi_.time_rows_of(plan); }
  double configuration_bound_of(const Plan& plan) const {
    return multi_.configuration_bound_of(plan);
  }
  std::vector<std::vector<double>> prefix_bounds_of(const std::vector<Plan>& plans, int widen,
                                                    double limit) {
    return single_.prefix_bounds_of(plans, widen, limit);
  }
  PlanCandidate best_around_of(const Plan& centre, int radius) {
    return single_.best_around_of(centre, radius);
  }

 private:
  std::vector<Config> configurations() const;
  // Which configurations a phase of run() visits.
  enum class Family { OneStage, MultiStage, Every };
  static bool in(Family family, const Entry& e) {
    return family == Family::Every || (family == Family::MultiStage) == e.config->multi_stage();
  }
  // run()'s phases, in order.
  std::vector<Entry> entries_by_cheap_bound(std::vector<Config>& configs);
  void cheap_pass(std::vector<Entry>& entries, Family family);
  void share_the_budget(std::vector<Entry>& entries, Family family);
  void polish_unpolished(std::vector<Entry>& entries);
  bool rank(std::vector<Entry>& entries, Ranking& ranking, double& unexplored);
  // The one-stage search's answer, once it has run alone (run()).
  static PlanSearchResult::OneStageAnswer one_stage_answer(const std::vector<Entry>& entries);
  bool find_leanest(const std::vector<Config>& configs, PlanSearchResult& result, bool proven,
                    double unexplored);
  // The threshold entry `self` must beat to enter the top N: the N-th best of the others.
  double ranking_threshold(const std::vector<Entry>& entries, const Entry* self) const;
  static void release_closed(Entry& e);

  std::size_t cheap_passes_ = 0;  // configurations the cheap pass has visited, for progress
  SearchContext context_;
  SingleStageSearch single_;
  MultiStageSearch multi_;
};

}  // namespace pipetune::planning
