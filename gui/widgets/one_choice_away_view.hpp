#pragma once

// "One choice away": after "Find best plan", the best plan with each of its choices changed
// (checkpoint mode, schedule, chunks), each re-planned, as `plan --explain` lists them; why the
// best plan wins, in the choices a user makes. Clicking a row loads that plan.

#include <QWidget>
#include <memory>
#include <vector>

#include "gui/model/one_choice_rows.hpp"
#include "gui/model/plan_editor.hpp"

class QLabel;
class QTableWidget;

namespace pipetune::gui {

class OneChoiceAwayView : public QWidget {
  Q_OBJECT

 public:
  explicit OneChoiceAwayView(PlanEditor& editor, QWidget* parent = nullptr);

  /// A search has started: the rows shown are of the previous best plan no more.
  void waiting();
  void show_alternatives(std::shared_ptr<const OneChoiceAway> away);
  void clear();
  QTableWidget* table() const { return table_; }
  const std::vector<OneChoiceRow>& rows() const { return rows_; }
  /// Loads the plan of the row at `row`, if it has one.
  void pick(int row);

 signals:
  void plan_picked(const QString& problem);

 private:
  PlanEditor& editor_;
  QLabel* status_;
  QTableWidget* table_;
  std::vector<OneChoiceRow> rows_;
};

}  // namespace pipetune::gui
