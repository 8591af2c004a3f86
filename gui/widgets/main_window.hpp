#pragma once

// The main window: the plan controls, the comparison, the planner and Run on the left; the layer
// strip, the timeline and the memory chart on the right, sharing one time axis. It owns the
// PlanEditor (the plan and its prediction) and the TimelineModel, and wires every edit to a
// re-simulation and a redraw.

#include <QMainWindow>
#include <QStringList>
#include <memory>

#include "gui/model/plan_editor.hpp"
#include "gui/model/timeline_model.hpp"
#include "sim/trace.hpp"

class QAction;
class QKeySequence;
class QLabel;
class QMenu;

namespace pipetune::gui {

class ComparisonPanel;
class CostStripView;
class MemoryChartView;
class PlanPanel;
class OneChoiceAwayView;
class PlannerPanel;
class RunController;
class RunPanel;
class TimelineView;

class MainWindow : public QMainWindow {
  Q_OBJECT

 public:
  explicit MainWindow(QWidget* parent = nullptr);
  ~MainWindow() override;

  /// Opens profile, hardware, plan and trace files in any order (told apart by their format
  /// tags); returns one message per file that could not be opened.
  QStringList open_files(const QStringList& paths);
  QString open_profile(const QString& path, const QString& hardware_path = {});
  QString open_hardware(const QString& path);
  QString open_trace(const QString& path);
  QString load_plan(const QString& path);
  QString save_plan(const QString& path);
  QString export_timeline_png(const QString& path);
  QString export_predicted_trace(const QString& path);
  /// Lays the window out at `size` and saves an image of it.
  QString save_screenshot(const QString& path, const QSize& size = {1600, 1000});
  void close_trace();

  PlanEditor& editor() { return editor_; }
  const TimelineModel& timeline_model() const { return timeline_model_; }
  TimelineView* timeline_view() const { return timeline_view_; }
  MemoryChartView* memory_chart_view() const { return memory_view_; }
  CostStripView* cost_strip_view() const { return cost_strip_; }
  PlanPanel* plan_panel() const { return plan_panel_; }
  ComparisonPanel* comparison_panel() const { return comparison_; }
  PlannerPanel* planner_panel() const { return planner_panel_; }
  OneChoiceAwayView* one_choice_away_view() const { return one_choice_away_; }
  RunPanel* run_panel() const { return run_panel_; }
  RunController& runner() { return *runner_; }

 protected:
  void dragEnterEvent(QDragEnterEvent* event) override;
  void dropEvent(QDropEvent* event) override;
  void closeEvent(QCloseEvent* event) override;

 private:
  void build_menus();
  QList<QAction*> build_file_menu();
  void build_view_menu();
  template <typename Slot>
  QAction* add_action(QMenu* menu, const QString& text, const QKeySequence& keys, Slot slot);
  void on_simulated();
  void refresh_comparison();
  void update_title();
  void report(const QString& problem);
  QString ask_open(const QString& title, const QString& filter);
  QString ask_save(const QString& title, const QString& name, const QString& filter);

  PlanEditor editor_;
  TimelineModel timeline_model_;
  std::shared_ptr<const Trace> measured_;
  QString profile_path_, trace_path_;
  std::unique_ptr<RunController> runner_;

  CostStripView* cost_strip_;
  TimelineView* timeline_view_;
  MemoryChartView* memory_view_;
  PlanPanel* plan_panel_;
  ComparisonPanel* comparison_;
  PlannerPanel* planner_panel_;
  OneChoiceAwayView* one_choice_away_;
  RunPanel* run_panel_;
  QLabel* status_plan_;
  QLabel* status_fit_;
  QLabel* status_speed_;
  QAction* undo_zoom_ = nullptr;
};

}  // namespace pipetune::gui
