#pragma once

// "Run": the number of steps, the button, a progress bar over the steps and the outcome.

#include <QWidget>

#include "gui/model/plan_editor.hpp"
#include "gui/widgets/run_controller.hpp"

class QLabel;
class QProgressBar;
class QPushButton;
class QSpinBox;

namespace pipetune::gui {

class RunPanel : public QWidget {
  Q_OBJECT

 public:
  RunPanel(PlanEditor& editor, RunController& runner, QWidget* parent = nullptr);

  void refresh();  ///< the profile changed: Run may have become (un)available
  void run();
  QPushButton* run_button() const { return run_; }
  QProgressBar* progress_bar() const { return progress_; }
  QLabel* status() const { return status_; }
  QSpinBox* steps() const { return steps_; }

 private:
  void update_button();

  PlanEditor& editor_;
  RunController& runner_;
  QSpinBox* steps_;
  QPushButton* run_;
  QProgressBar* progress_;
  QLabel* status_;
};

}  // namespace pipetune::gui
