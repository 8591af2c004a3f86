#pragma once

// "One choice away" as the GUI lists it (sim/planner/one_choice_away.hpp, what `plan --explain`
// prints): per alternative the change, its iteration time and largest peak, both also relative to
// the best plan's, and its balance; picking a row loads its plan.

#include <QString>
#include <optional>
#include <vector>

#include "sim/plan.hpp"
#include "sim/planner/one_choice_away.hpp"
#include "sim/planner/planner.hpp"

namespace pipetune::gui {

/// The best plan of a search and the best plan with each of its choices changed.
struct OneChoiceAway {
  PlanCandidate best;
  std::vector<Alternative> alternatives;
};

struct OneChoiceRow {
  QString change;         ///< "checkpoint always", "schedule gpipe", "chunks 8 (6 micro-batches)"
  QString iteration;      ///< "12.3 ms"; "—" when nothing fits
  QString time_change;    ///< against the best plan: "+4.1 %"
  QString peak;           ///< largest peak over the devices
  QString memory_change;  ///< against the best plan's largest peak; "—" when that is 0
  QString balance;        ///< "[3,3,2]", or "does not fit"
  std::optional<Plan> plan;  ///< what picking the row loads; none when nothing fits
};

std::vector<OneChoiceRow> one_choice_rows(const OneChoiceAway& away);

}  // namespace pipetune::gui
