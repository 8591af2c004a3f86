#include "gui/model/one_choice_rows.hpp"

#include <cmath>
#include <limits>

#include "gui/model/text_format.hpp"

namespace pipetune::gui {

std::vector<OneChoiceRow> one_choice_rows(const OneChoiceAway& away) {
  const QString none = QStringLiteral("—");
  const double best_ms = away.best.iteration_ms;
  const double best_peak = static_cast<double>(away.best.max_peak_memory_bytes());
  std::vector<OneChoiceRow> rows;
  for (const Alternative& a : away.alternatives) {
    OneChoiceRow row;
    row.change = QString::fromStdString(a.change);
    if (!a.best) {
      row.iteration = row.time_change = row.peak = row.memory_change = none;
      row.balance =
          a.refused.empty() ? QStringLiteral("does not fit") : QString::fromStdString(a.refused);
      rows.push_back(std::move(row));
      continue;
    }
    const PlanCandidate& c = *a.best;
    const double peak = static_cast<double>(c.max_peak_memory_bytes());
    row.iteration = format_duration(c.iteration_ms);
    row.time_change = format_error(best_ms > 0 ? c.iteration_ms / best_ms - 1.0
                                               : std::numeric_limits<double>::quiet_NaN());
    row.peak = format_size(c.max_peak_memory_bytes());
    row.memory_change = best_peak > 0 ? format_error(peak / best_peak - 1.0) : none;
    row.balance = format_balance(c.plan.balance);
    row.plan = c.plan;
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace pipetune::gui
