#pragma once

// Why a plan won, in the terms a user chooses: the best plan with one of the winner's choices
// changed (another checkpoint mode, another schedule, half or twice the chunks), each re-planned
// with only that choice different. `plan --explain` prints them; any front end can.

#include <optional>
#include <string>
#include <vector>

#include "sim/hardware.hpp"
#include "sim/planner/planner.hpp"
#include "sim/profile.hpp"

namespace pipetune {

struct Alternative {
  std::string change;  ///< "checkpoint always", "schedule gpipe", "chunks 8 (6 micro-batches)"
  std::optional<PlanCandidate> best;  ///< none when no plan with that change fits
  /// Why there is no plan when the change itself cannot run (torch refuses that schedule with
  /// that many micro-batches); empty when plans were searched and none fits.
  std::string refused;
};

/// `options` are the ones `best` was planned with; each alternative keeps them but for the one
/// choice, searches with an eighth of their budget (at least a million steps) and ranks one plan.
std::vector<Alternative> one_choice_away(const Profile& profile, const Hardware& hardware,
                                         const PlannerOptions& options, const PlanCandidate& best);

}  // namespace pipetune
