// The whole window under the offscreen platform: open the shipped example profile with its
// hardware, plan and a measured trace; edit the plan the way a user does (typing a balance,
// turning the chunks spin box, dragging a stage boundary); check that the timeline holds what a
// fresh Simulator predicts for the edited plan; render the window to PNGs in the test's output
// folder.

#include <gtest/gtest.h>

#include <QComboBox>
#include <QFile>
#include <QImage>
#include <QLabel>
#include <QLineEdit>
#include <QMouseEvent>
#include <QProcess>
#include <QProgressBar>
#include <QPushButton>
#include <QSpinBox>
#include <QTableWidget>
#include <QTemporaryDir>
#include <algorithm>

#include "gui/model/palette.hpp"
#include "gui/model/text_format.hpp"
#include "gui/widgets/comparison_panel.hpp"
#include "gui/widgets/cost_strip_view.hpp"
#include "gui/widgets/main_window.hpp"
#include "gui/widgets/one_choice_away_view.hpp"
#include "gui/widgets/plan_panel.hpp"
#include "gui/widgets/planner_panel.hpp"
#include "gui/widgets/run_controller.hpp"
#include "gui/widgets/run_panel.hpp"
#include "gui/widgets/timeline_view.hpp"
#include "sim/interval.hpp"
#include "tests/gui/gui_test_support.hpp"

namespace pipetune::gui {
namespace {

QString path(const std::string& name) {
  return QString::fromStdString(testing::data_path(name));
}

// The window's timeline holds exactly the tasks of a fresh simulation of `plan`.
void expect_timeline_is(const MainWindow& window, const Plan& plan) {
  const Profile profile = load_profile(testing::data_path("tiny.profile.json"));
  const Hardware hardware = load_hardware(testing::data_path("hardware-2.json"));
  const SimulationResult truth = testing::simulate_directly(profile, hardware, plan);
  const TimelineModel& model = window.timeline_model();
  EXPECT_DOUBLE_EQ(model.predicted_ms(), truth.iteration_ms);
  const auto& tasks = model.tasks(Series::Predicted);
  ASSERT_EQ(tasks.size(), truth.tasks.size());
  for (std::size_t k = 0; k < tasks.size(); ++k) {
    EXPECT_EQ(tasks[k].label(), truth.tasks[k].label());
    EXPECT_EQ(model.rows()[tasks[k].row].name, hardware.devices[truth.tasks[k].device].name);
    EXPECT_DOUBLE_EQ(tasks[k].start_ms, truth.tasks[k].start_ms);
    EXPECT_DOUBLE_EQ(tasks[k].end_ms, truth.tasks[k].end_ms);
  }
}

int count_pixels(const QImage& image, const QColor& colour) {
  int n = 0;
  for (int y = 0; y < image.height(); ++y) {
    for (int x = 0; x < image.width(); ++x) n += image.pixelColor(x, y) == colour ? 1 : 0;
  }
  return n;
}

class AppTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::app();
    const Profile profile = load_profile(testing::data_path("tiny.profile.json"));
    const Hardware hardware = load_hardware(testing::data_path("hardware-2.json"));
    plan_ = load_plan(testing::data_path("plan-2x4.json"));
    measured_path_ = testing::output_dir() + "/measured-tiny.trace.json";
    save_trace(testing::make_measured_trace(profile, hardware, plan_, 1.15, 0.9, 40.0),
               measured_path_.toStdString());
  }

  Plan plan_;
  QString measured_path_;
};

TEST_F(AppTest, EditsReSimulateIntoTheTimelineAndTheWindowRenders) {
  MainWindow window;
  const QStringList problems = window.open_files(
      {measured_path_, path("plan-2x4.json"), path("hardware-2.json"), path("tiny.profile.json")});
  ASSERT_TRUE(problems.isEmpty()) << problems.join('\n').toStdString();
  window.resize(1600, 1000);
  window.show();
  QApplication::processEvents();  // lays the window out
  expect_timeline_is(window, plan_);
  EXPECT_TRUE(window.timeline_model().has_measured());
  EXPECT_EQ(window.timeline_model().unmatched(Series::Predicted), 0);

  // Type a balance.
  QLineEdit* balance = window.plan_panel()->balance_edit();
  balance->setText(QStringLiteral("2, 4"));
  emit balance->editingFinished();
  Plan expected = plan_;
  expected.balance = {2, 4};
  EXPECT_EQ(window.editor().plan(), expected);
  expect_timeline_is(window, expected);

  // Turn the chunks spin box; the slider follows.
  window.plan_panel()->chunks_spin()->setValue(8);
  expected.chunks = 8;
  EXPECT_EQ(window.editor().plan(), expected);
  EXPECT_EQ(window.plan_panel()->chunks_slider()->value(), 8);
  expect_timeline_is(window, expected);
  // The measured trace ran 4 chunks: its tasks still overlay the ones they match.
  EXPECT_GT(window.timeline_model().tasks(Series::Predicted).size(),
            window.timeline_model().tasks(Series::Measured).size());
  EXPECT_EQ(window.timeline_model().unmatched(Series::Measured), 0);

  // Drag the boundary from after layer 2 to after layer 4, through the layer strip.
  CostStripView* strip = window.cost_strip_view();
  const CostStripGeometry& g = strip->geometry();
  const QPointF from(g.boundary_x(0), g.plot().center().y());
  const QPointF to(g.column(3).right() - 2, g.plot().center().y());
  auto send = [strip](QEvent::Type type, QPointF at, Qt::MouseButtons buttons) {
    QMouseEvent event(type, at, strip->mapToGlobal(at), Qt::LeftButton, buttons, Qt::NoModifier);
    QApplication::sendEvent(strip, &event);
  };
  send(QEvent::MouseButtonPress, from, Qt::LeftButton);
  send(QEvent::MouseMove, (from + to) / 2, Qt::LeftButton);
  send(QEvent::MouseMove, to, Qt::LeftButton);
  send(QEvent::MouseButtonRelease, to, Qt::NoButton);
  expected.balance = {4, 2};
  EXPECT_EQ(window.editor().plan(), expected);
  expect_timeline_is(window, expected);

  // Back to the measured plan, and render the window with its overlay.
  ASSERT_TRUE(window.editor().apply_plan(plan_).isEmpty());
  expect_timeline_is(window, plan_);
  const QString png = testing::output_dir() + "/main-window-overlay.png";
  ASSERT_TRUE(window.save_screenshot(png).isEmpty());
  const QImage image(png);
  ASSERT_FALSE(image.isNull());
  EXPECT_EQ(image.size(), QSize(1600, 1000));
  // Measured bars in every kind's colour are on screen, and nothing is over capacity.
  for (TaskKind kind : {TaskKind::Forward, TaskKind::Recompute, TaskKind::Backward}) {
    EXPECT_GT(count_pixels(image, palette::task(kind)), 200) << to_string(kind);
  }
  EXPECT_EQ(count_pixels(image, palette::kDoesNotFitBackground), 0);
  // The comparison table has the iteration and both devices' peaks, measured.
  QTableWidget* table = window.comparison_panel()->table();
  ASSERT_EQ(table->rowCount(), 5);
  EXPECT_EQ(table->item(3, 0)->text(), QStringLiteral("peak gpu0"));
  EXPECT_NE(table->item(0, 2)->text(), QStringLiteral("—"));

  // Squeeze the memory below the peak: shown in red before anything runs.
  window.plan_panel()->memory_edit()->setText(QStringLiteral("1 MiB"));
  emit window.plan_panel()->memory_edit()->editingFinished();
  EXPECT_FALSE(window.editor().result().fits());
  const QString red = testing::output_dir() + "/main-window-does-not-fit.png";
  ASSERT_TRUE(window.save_screenshot(red).isEmpty());
  EXPECT_GT(count_pixels(QImage(red), palette::kDoesNotFitBackground), 1000);
}

TEST_F(AppTest, APredictedTracesPlanBecomesTheCurrentPlan) {
  MainWindow window;
  ASSERT_TRUE(window.open_files({path("tiny.profile.json"), path("hardware-2.json")}).isEmpty());
  Plan other = plan_;
  other.balance = {1, 5};
  other.chunks = 2;
  other.schedule = ScheduleKind::OneFOneB;
  const Profile profile = load_profile(testing::data_path("tiny.profile.json"));
  const Hardware hardware = load_hardware(testing::data_path("hardware-2.json"));
  const QString predicted = testing::output_dir() + "/predicted-1x5.trace.json";
  save_trace(
      trace_from_simulation(testing::simulate_directly(profile, hardware, other), profile.model),
      predicted.toStdString());
  ASSERT_TRUE(window.open_trace(predicted).isEmpty());
  EXPECT_EQ(window.editor().plan(), other);
  EXPECT_FALSE(window.timeline_model().has_measured());
  expect_timeline_is(window, other);
}

TEST_F(AppTest, ThePlanPanelOffersEveryScheduleAndItsStagesPerDevice) {
  MainWindow window;
  ASSERT_TRUE(window.open_files({path("tiny.profile.json"), path("hardware-2.json")}).isEmpty());
  QComboBox* schedule = window.plan_panel()->schedule_combo();
  QSpinBox* per_device = window.plan_panel()->stages_per_device_spin();
  ASSERT_EQ(schedule->count(), static_cast<int>(std::size(kAllScheduleKinds)));
  for (ScheduleKind kind : kAllScheduleKinds) {
    EXPECT_GE(schedule->findData(static_cast<int>(kind)), 0) << to_string(kind);
  }
  EXPECT_FALSE(per_device->isEnabled());  // gpipe: one stage per device
  EXPECT_EQ(per_device->value(), 1);

  auto pick = [&](ScheduleKind kind) {
    schedule->setCurrentIndex(schedule->findData(static_cast<int>(kind)));
  };
  pick(ScheduleKind::Interleaved1F1B);
  EXPECT_EQ(window.editor().plan().schedule, ScheduleKind::Interleaved1F1B);
  EXPECT_TRUE(per_device->isEnabled());
  EXPECT_EQ(per_device->value(), 2);
  per_device->setValue(3);
  EXPECT_EQ(window.editor().plan().stages_per_device, 3);
  EXPECT_EQ(window.editor().plan().balance, (std::vector<int>(6, 1)));
  EXPECT_EQ(window.plan_panel()->balance_edit()->text(), QStringLiteral("1,1,1,1,1,1"));
  // Four per device on two devices would be more stages than layers: the spin box stops at 3.
  EXPECT_EQ(per_device->maximum(), 3);
  per_device->setValue(4);
  EXPECT_EQ(window.editor().plan().stages_per_device, 3);
  EXPECT_EQ(per_device->value(), 3);
  expect_timeline_is(window, window.editor().plan());

  pick(ScheduleKind::ZBV);
  EXPECT_EQ(window.editor().plan().stages_per_device, 2);
  EXPECT_EQ(per_device->value(), 2);
  EXPECT_FALSE(per_device->isEnabled());  // zbv's V is always two
  expect_timeline_is(window, window.editor().plan());

  // Three devices hold zbv's six stages; four cannot hold eight stages of six layers, so the
  // combo goes back to the schedule that was kept.
  window.plan_panel()->devices_spin()->setValue(3);
  EXPECT_EQ(window.plan_panel()->devices_spin()->maximum(), 3);
  EXPECT_EQ(window.editor().hardware().devices.size(), 3u);
  pick(ScheduleKind::GPipe);
  window.plan_panel()->devices_spin()->setValue(4);
  ASSERT_EQ(window.editor().hardware().devices.size(), 4u);
  pick(ScheduleKind::InterleavedZB);
  EXPECT_EQ(window.editor().plan().schedule, ScheduleKind::GPipe);
  EXPECT_EQ(schedule->currentData().toInt(), static_cast<int>(ScheduleKind::GPipe));
}

TEST_F(AppTest, SavesPlansAndExportsTheTimelineAndTheTrace) {
  MainWindow window;
  ASSERT_TRUE(window.open_files({path("tiny.profile.json"), path("hardware-2.json")}).isEmpty());
  window.resize(1400, 900);
  window.show();
  QApplication::processEvents();
  Plan plan = plan_;
  plan.balance = {2, 4};
  plan.checkpoint = CheckpointMode::Always;
  ASSERT_TRUE(window.editor().apply_plan(plan).isEmpty());

  const QString plan_path = testing::output_dir() + "/saved.plan.json";
  ASSERT_TRUE(window.save_plan(plan_path).isEmpty());
  EXPECT_EQ(load_plan(plan_path.toStdString()), plan);
  ASSERT_TRUE(window.load_plan(path("plan-2x4.json")).isEmpty());
  EXPECT_EQ(window.editor().plan(), plan_);
  ASSERT_TRUE(window.load_plan(plan_path).isEmpty());
  EXPECT_EQ(window.editor().plan(), plan);

  // The exported trace is the prediction of the plan, as `pipetune simulate --trace` writes it.
  const QString trace_path = testing::output_dir() + "/exported.trace.json";
  ASSERT_TRUE(window.export_predicted_trace(trace_path).isEmpty());
  const Trace exported = load_trace(trace_path.toStdString());
  const SimulationResult truth =
      testing::simulate_directly(load_profile(testing::data_path("tiny.profile.json")),
                                 load_hardware(testing::data_path("hardware-2.json")), plan);
  EXPECT_EQ(exported.kind, "predicted");
  ASSERT_TRUE(exported.plan);
  EXPECT_EQ(*exported.plan, plan);
  EXPECT_NEAR(exported.iteration_ms, truth.iteration_ms, 1e-6);
  EXPECT_EQ(exported.tasks.size(), truth.tasks.size());

  const QString png = testing::output_dir() + "/exported-timeline.png";
  ASSERT_TRUE(window.export_timeline_png(png).isEmpty());
  const QImage image(png);
  ASSERT_FALSE(image.isNull());
  EXPECT_EQ(image.size(),
            window.timeline_view()->size() * window.timeline_view()->devicePixelRatio());
  EXPECT_GT(count_pixels(image, palette::task(TaskKind::Recompute)), 100);  // checkpoint always
}

TEST_F(AppTest, BadFilesAreNamedNotFatal) {
  MainWindow window;
  const QString junk = testing::output_dir() + "/junk.json";
  QFile file(junk);
  ASSERT_TRUE(file.open(QIODevice::WriteOnly));
  file.write("{\"hello\": 1}");
  file.close();
  const QStringList problems =
      window.open_files({junk, path("bad/missing.json"), path("tiny.profile.json")});
  ASSERT_EQ(problems.size(), 2);
  EXPECT_TRUE(problems[0].contains(QStringLiteral("junk.json")));
  EXPECT_TRUE(window.editor().has_profile());
}

TEST_F(AppTest, FindBestPlanRunsInTheBackgroundAndPickingOneLoadsIt) {
  MainWindow window;
  ASSERT_TRUE(window.open_files({path("tiny.profile.json"), path("hardware-2.json")}).isEmpty());
  const double before = window.editor().result().iteration_ms;
  PlannerPanel* planner = window.planner_panel();
  bool finished = false;
  QObject::connect(planner, &PlannerPanel::search_finished, [&] { finished = true; });
  planner->find_best_plan();
  ASSERT_TRUE(testing::wait_until([&] { return finished; }));
  const PlanSearchResult* result = planner->last_result();
  ASSERT_NE(result, nullptr);
  ASSERT_FALSE(result->ranked.empty());
  EXPECT_EQ(planner->table()->rowCount(), static_cast<int>(result->ranked.size()));
  planner->pick(0);
  EXPECT_EQ(window.editor().plan(), result->ranked[0].plan);
  // The planner's optimum, re-simulated by the editor, is no slower than the plan it replaced.
  EXPECT_NEAR(window.editor().result().iteration_ms, result->ranked[0].iteration_ms, 1e-9);
  EXPECT_LE(window.editor().result().iteration_ms, before + 1e-9);
  planner->worker().wait();
  EXPECT_TRUE(
      window.save_screenshot(testing::output_dir() + "/main-window-best-plans.png").isEmpty());
}

// Each ranked plan's 80 % interval beside it: the one `pipetune plan` gives (sim/interval.hpp),
// and a dash for a profile without spreads.
TEST_F(AppTest, BestPlansShowTheirIntervals) {
  for (const bool spreads : {true, false}) {
    MainWindow window;
    const QString profile = spreads ? QString::fromStdString(std::string(PIPETUNE_SOURCE_DIR) +
                                                             "/traces/cpu-mlp.profile.json")
                                    : path("tiny.profile.json");
    ASSERT_TRUE(window.open_files({profile}).isEmpty());
    PlannerPanel* planner = window.planner_panel();
    planner->find_best_plan();
    auto cell = [&] {
      const QTableWidgetItem* item = planner->table()->item(0, 5);
      return item ? item->text() : QString();
    };
    ASSERT_TRUE(
        testing::wait_until([&] { return !cell().isEmpty() && cell() != QStringLiteral("…"); }));
    const PlanSearchResult* result = planner->last_result();
    ASSERT_NE(result, nullptr);
    const Hardware& hardware = window.editor().hardware();
    const IterationInterval want =
        intervals_of(window.editor().profile(), hardware, static_cast<int>(hardware.devices.size()),
                     {result->ranked[0].plan})[0];
    EXPECT_EQ(want.known(), spreads);
    EXPECT_EQ(cell(), spreads ? QStringLiteral("%1 – %2").arg(format_duration(want.low_ms),
                                                              format_duration(want.high_ms))
                              : QStringLiteral("–"));
    planner->worker().wait();
  }
}

TEST_F(AppTest, AfterASearchTheBestPlanOneChoiceAwayIsListedAndLoads) {
  MainWindow window;
  ASSERT_TRUE(window.open_files({path("tiny.profile.json"), path("hardware-2.json")}).isEmpty());
  OneChoiceAwayView* view = window.one_choice_away_view();
  EXPECT_EQ(view->table()->rowCount(), 0);
  window.planner_panel()->find_best_plan();
  ASSERT_TRUE(testing::wait_until([&] { return !view->rows().empty(); }));
  const PlanSearchResult* result = window.planner_panel()->last_result();
  ASSERT_NE(result, nullptr);
  // The same alternatives sim/planner/one_choice_away gives for the search's best plan.
  PlannerOptions options;
  options.schedules.assign(std::begin(kAllScheduleKinds), std::end(kAllScheduleKinds));
  options.optimizer_state_factor = window.editor().plan().optimizer_state_factor;
  options.top = 10;
  const auto expected = one_choice_away(window.editor().profile(), window.editor().hardware(),
                                        options, result->ranked.front());
  ASSERT_EQ(view->rows().size(), expected.size());
  EXPECT_EQ(view->table()->rowCount(), static_cast<int>(expected.size()));
  for (std::size_t k = 0; k < expected.size(); ++k) {
    EXPECT_EQ(view->table()->item(static_cast<int>(k), 0)->text().toStdString(),
              expected[k].change);
  }
  const auto fits =
      std::find_if(expected.begin(), expected.end(), [](const Alternative& a) { return a.best; });
  ASSERT_NE(fits, expected.end());
  view->pick(static_cast<int>(fits - expected.begin()));
  EXPECT_EQ(window.editor().plan(), fits->best->plan);
  EXPECT_NEAR(window.editor().result().iteration_ms, fits->best->iteration_ms, 1e-9);
  window.planner_panel()->worker().wait();
  EXPECT_TRUE(
      window.save_screenshot(testing::output_dir() + "/main-window-one-choice-away.png").isEmpty());
}

TEST_F(AppTest, RunLaunchesTheCommandAndOverlaysWhatItMeasured) {
  QTemporaryDir folder;
  const QString cli = folder.filePath(QStringLiteral("pipetune"));
  QFile script(cli);
  ASSERT_TRUE(script.open(QIODevice::WriteOnly));
  // Follows the contract: progress on stderr, the trace at --trace.
  script.write(
      QStringLiteral(
          "#!/bin/sh\nwhile [ $# -gt 0 ]; do case \"$1\" in --trace) t=$2; shift;; --steps) "
          "n=$2; shift;; esac; shift; done\ni=1; while [ $i -le $n ]; do echo \"progress $i "
          "$n\" >&2; i=$((i+1)); done\ncp '%1' \"$t\"\n")
          .arg(measured_path_)
          .toUtf8());
  script.close();
  script.setPermissions(script.permissions() | QFileDevice::ExeOwner);

  // A profile that says which model it measured.
  Profile profile = load_profile(testing::data_path("tiny.profile.json"));
  profile.meta_json = R"({"model_spec": "mlp:layers=6"})";
  const QString profile_path = testing::output_dir() + "/tiny-with-spec.profile.json";
  save_profile(profile, profile_path.toStdString());

  MainWindow window;
  window.runner().set_cli(cli);
  ASSERT_TRUE(window.open_files({path("tiny.profile.json"), path("hardware-2.json")}).isEmpty());
  EXPECT_FALSE(window.run_panel()->run_button()->isEnabled());  // no model_spec
  EXPECT_TRUE(window.run_panel()->run_button()->toolTip().contains(QStringLiteral("model_spec")));

  ASSERT_TRUE(
      window.open_files({profile_path, path("hardware-2.json"), path("plan-2x4.json")}).isEmpty());
  EXPECT_TRUE(window.run_panel()->run_button()->isEnabled());
  window.run_panel()->steps()->setValue(3);
  window.run_panel()->run();
  ASSERT_TRUE(testing::wait_until([&] { return window.timeline_model().has_measured(); }));
  EXPECT_EQ(window.run_panel()->progress_bar()->value(), 3);
  EXPECT_EQ(window.run_panel()->progress_bar()->maximum(), 3);
  EXPECT_EQ(window.timeline_model().unmatched(Series::Predicted), 0);
}

// The command line's screenshot mode (docs/gui.md): opens the files, renders, exits.
TEST_F(AppTest, ScreenshotModeWritesTheImageAndExits) {
  const QString png = testing::output_dir() + "/screenshot-mode.png";
  QFile::remove(png);
  QProcess gui;
  gui.start(
      QStringLiteral(PIPETUNE_GUI_BINARY),
      {QStringLiteral("--screenshot"), png, QStringLiteral("--size"), QStringLiteral("1280x800"),
       path("tiny.profile.json"), path("hardware-2.json"), path("plan-2x4.json"), measured_path_});
  ASSERT_TRUE(gui.waitForFinished(60000));
  EXPECT_EQ(gui.exitCode(), 0) << gui.readAllStandardError().toStdString();
  const QImage image(png);
  ASSERT_FALSE(image.isNull());
  EXPECT_EQ(image.size(), QSize(1280, 800));
  EXPECT_GT(count_pixels(image, palette::task(TaskKind::Backward)), 200);

  // A file it cannot read: still an image, and a non-zero status naming the file.
  gui.start(QStringLiteral(PIPETUNE_GUI_BINARY),
            {QStringLiteral("--screenshot"), png, path("tiny.profile.json"),
             QStringLiteral("/nonexistent.json")});
  ASSERT_TRUE(gui.waitForFinished(60000));
  EXPECT_EQ(gui.exitCode(), 2);
  EXPECT_TRUE(gui.readAllStandardError().contains("/nonexistent.json"));
}

}  // namespace
}  // namespace pipetune::gui
