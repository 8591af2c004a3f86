#pragma once

// "Find best plan": runs the planner for the current devices in the background, shows its
// progress, then the ranked plans; picking one loads it into the editor.

#include <QWidget>
#include <memory>

#include "gui/model/plan_editor.hpp"
#include "gui/widgets/planner_worker.hpp"

class QLabel;
class QProgressBar;
class QPushButton;
class QTableWidget;

namespace pipetune::gui {

class PlannerPanel : public QWidget {
  Q_OBJECT

 public:
  explicit PlannerPanel(PlanEditor& editor, QWidget* parent = nullptr);

  void find_best_plan();
  PlannerWorker& worker() { return worker_; }
  QTableWidget* table() const { return table_; }
  const PlanSearchResult* last_result() const { return result_.get(); }
  /// Loads the ranked plan at `row`.
  void pick(int row);

 signals:
  void search_started();
  void search_finished();
  void plan_picked(const QString& problem);

 private:
  void show_result(std::shared_ptr<const PlanSearchResult> result);
  void show_intervals(std::shared_ptr<const std::vector<IterationInterval>> intervals);
  void set_busy(bool busy);

  PlanEditor& editor_;
  PlannerWorker worker_;
  QPushButton* find_;
  QProgressBar* progress_;
  QLabel* status_;
  QTableWidget* table_;
  std::shared_ptr<const PlanSearchResult> result_;
  bool searching_ = false;  // the worker may still run after: it re-plans the alternatives
};

}  // namespace pipetune::gui
