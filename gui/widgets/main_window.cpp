#include "gui/widgets/main_window.hpp"

#include <QAction>
#include <QActionGroup>
#include <QApplication>
#include <QCloseEvent>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFileDialog>
#include <QFileInfo>
#include <QGroupBox>
#include <QLabel>
#include <QMenuBar>
#include <QMessageBox>
#include <QMimeData>
#include <QScrollArea>
#include <QSplitter>
#include <QStatusBar>
#include <QToolBar>
#include <QVBoxLayout>

#include "gui/model/input_files.hpp"
#include "gui/model/overlay_summary.hpp"
#include "gui/model/text_format.hpp"
#include "gui/widgets/comparison_panel.hpp"
#include "gui/widgets/cost_strip_view.hpp"
#include "gui/widgets/memory_chart_view.hpp"
#include "gui/widgets/one_choice_away_view.hpp"
#include "gui/widgets/plan_panel.hpp"
#include "gui/widgets/planner_panel.hpp"
#include "gui/widgets/run_controller.hpp"
#include "gui/widgets/run_panel.hpp"
#include "gui/widgets/timeline_view.hpp"
#include "sim/error.hpp"

namespace pipetune::gui {

namespace {

QGroupBox* group(const QString& title, QWidget* content) {
  auto* box = new QGroupBox(title);
  auto* layout = new QVBoxLayout(box);
  layout->setContentsMargins(8, 6, 8, 8);
  layout->addWidget(content);
  return box;
}

// Opening a file either works or gives one line saying why.
template <typename Load>
QString attempt(Load&& load) {
  try {
    load();
    return {};
  } catch (const std::exception& e) {
    return QString::fromStdString(e.what());
  }
}

}  // namespace

MainWindow::MainWindow(QWidget* parent)
    : QMainWindow(parent),
      runner_(std::make_unique<RunController>()),
      cost_strip_(new CostStripView(editor_)),
      timeline_view_(new TimelineView(timeline_model_)),
      memory_view_(new MemoryChartView(timeline_model_, *timeline_view_)),
      plan_panel_(new PlanPanel(editor_)),
      comparison_(new ComparisonPanel),
      planner_panel_(new PlannerPanel(editor_)),
      one_choice_away_(new OneChoiceAwayView(editor_)),
      run_panel_(new RunPanel(editor_, *runner_)),
      status_plan_(new QLabel),
      status_fit_(new QLabel),
      status_speed_(new QLabel) {
  setWindowTitle(QStringLiteral("pipetune"));
  setAcceptDrops(true);

  // Left: the controls, scrolling when the window is short.
  auto* side = new QWidget;
  auto* side_layout = new QVBoxLayout(side);
  side_layout->setContentsMargins(6, 6, 6, 6);
  side_layout->addWidget(group(tr("Plan"), plan_panel_));
  side_layout->addWidget(group(tr("Prediction vs measurement"), comparison_));
  side_layout->addWidget(group(tr("Best plans"), planner_panel_));
  side_layout->addWidget(group(tr("One choice away"), one_choice_away_));
  side_layout->addWidget(group(tr("Run on the real model"), run_panel_));
  side_layout->addStretch(1);
  auto* scroll = new QScrollArea;
  scroll->setWidget(side);
  scroll->setWidgetResizable(true);
  scroll->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  scroll->setMinimumWidth(400);
  scroll->setFrameShape(QFrame::NoFrame);

  // Right: layer strip, timeline, memory; the timeline takes the spare height.
  auto* charts = new QSplitter(Qt::Vertical);
  charts->addWidget(cost_strip_);
  charts->addWidget(timeline_view_);
  charts->addWidget(memory_view_);
  charts->setStretchFactor(0, 0);
  charts->setStretchFactor(1, 3);
  charts->setStretchFactor(2, 1);
  charts->setSizes({120, 500, 280});
  charts->setChildrenCollapsible(false);

  auto* main = new QSplitter(Qt::Horizontal);
  main->addWidget(scroll);
  main->addWidget(charts);
  main->setStretchFactor(0, 0);
  main->setStretchFactor(1, 1);
  main->setSizes({420, 1180});
  setCentralWidget(main);

  statusBar()->addWidget(status_plan_, 1);
  statusBar()->addPermanentWidget(status_fit_);
  statusBar()->addPermanentWidget(status_speed_);

  build_menus();

  connect(&editor_, &PlanEditor::simulated, this, &MainWindow::on_simulated);
  connect(&editor_, &PlanEditor::profile_changed, this, [this] {
    update_title();
    run_panel_->refresh();
  });
  connect(comparison_, &ComparisonPanel::step_chosen, this, [this](int step) {
    timeline_model_.set_measured(measured_, step);
    refresh_comparison();
  });
  connect(comparison_, &ComparisonPanel::overlay_style_chosen, timeline_view_,
          &TimelineView::set_overlay_style);
  connect(comparison_, &ComparisonPanel::colour_by_error_toggled, timeline_view_,
          &TimelineView::set_colour_by_error);
  connect(comparison_, &ComparisonPanel::close_trace_requested, this, &MainWindow::close_trace);
  connect(planner_panel_, &PlannerPanel::plan_picked, this, &MainWindow::report);
  connect(planner_panel_, &PlannerPanel::search_started, one_choice_away_,
          &OneChoiceAwayView::waiting);
  connect(&planner_panel_->worker(), &PlannerWorker::explained, one_choice_away_,
          &OneChoiceAwayView::show_alternatives);
  connect(one_choice_away_, &OneChoiceAwayView::plan_picked, this, &MainWindow::report);
  connect(runner_.get(), &RunController::succeeded, this,
          [this](const QString& path) { report(open_trace(path)); });
  refresh_comparison();
  update_title();
}

MainWindow::~MainWindow() = default;

template <typename Slot>
QAction* MainWindow::add_action(QMenu* menu, const QString& text, const QKeySequence& keys,
                                Slot slot) {
  QAction* action = menu->addAction(text);
  if (!keys.isEmpty()) action->setShortcut(keys);
  connect(action, &QAction::triggered, this, slot);
  return action;
}

// File: open a profile, hardware or trace; load or save a plan; export; quit. Returns the
// actions the toolbar shows too.
QList<QAction*> MainWindow::build_file_menu() {
  QMenu* file = menuBar()->addMenu(tr("&File"));
  QAction* open_profile_action = add_action(file, tr("Open &profile…"), QKeySequence::Open, [this] {
    const QString path = ask_open(tr("Open profile"), tr("Profiles (*.json)"));
    if (!path.isEmpty()) report(open_profile(path));
  });
  QAction* open_hardware_action = add_action(file, tr("Open &hardware…"), {}, [this] {
    const QString path = ask_open(tr("Open hardware"), tr("Hardware (*.json)"));
    if (!path.isEmpty()) report(open_hardware(path));
  });
  QAction* open_trace_action =
      add_action(file, tr("Open &trace…"), QKeySequence(tr("Ctrl+T")), [this] {
        const QString path = ask_open(tr("Open trace"), tr("Traces (*.json)"));
        if (!path.isEmpty()) report(open_trace(path));
      });
  file->addSeparator();
  QAction* load_plan_action =
      add_action(file, tr("&Load plan…"), QKeySequence(tr("Ctrl+L")), [this] {
        const QString path = ask_open(tr("Load plan"), tr("Plans (*.json)"));
        if (!path.isEmpty()) report(load_plan(path));
      });
  QAction* save_plan_action = add_action(file, tr("&Save plan…"), QKeySequence::Save, [this] {
    const QString path =
        ask_save(tr("Save plan"), QStringLiteral("plan.json"), tr("Plans (*.json)"));
    if (!path.isEmpty()) report(save_plan(path));
  });
  file->addSeparator();
  QAction* export_png =
      add_action(file, tr("Export timeline as &PNG…"), QKeySequence(tr("Ctrl+E")), [this] {
        const QString path = ask_save(tr("Export timeline"), QStringLiteral("timeline.png"),
                                      tr("PNG images (*.png)"));
        if (!path.isEmpty()) report(export_timeline_png(path));
      });
  QAction* export_trace = add_action(file, tr("Export predicted trace for Perfetto…"), {}, [this] {
    const QString path =
        ask_save(tr("Export trace"), QStringLiteral("predicted.trace.json"), tr("Traces (*.json)"));
    if (!path.isEmpty()) report(export_predicted_trace(path));
  });
  file->addSeparator();
  add_action(file, tr("&Quit"), QKeySequence::Quit, [this] { close(); });

  return {open_profile_action, open_hardware_action, open_trace_action, load_plan_action,
          save_plan_action,    export_png,           export_trace};
}

// View: zoom, fit, undo a zoom, clear the highlight.
void MainWindow::build_view_menu() {
  QMenu* view = menuBar()->addMenu(tr("&View"));
  add_action(view, tr("Zoom &in"), QKeySequence(tr("W")), [this] { timeline_view_->zoom_in(); });
  add_action(view, tr("Zoom &out"), QKeySequence(tr("S")), [this] { timeline_view_->zoom_out(); });
  add_action(view, tr("&Fit the iteration"), QKeySequence(tr("0")),
             [this] { timeline_view_->fit(); });
  undo_zoom_ = add_action(view, tr("&Undo zoom"), QKeySequence(tr("Backspace")),
                          [this] { timeline_view_->undo_zoom(); });
  undo_zoom_->setEnabled(false);
  connect(timeline_view_, &TimelineView::zoom_history_changed, this,
          [this] { undo_zoom_->setEnabled(timeline_view_->can_undo_zoom()); });
  // Single-letter shortcuts belong to the timeline alone, so they do not steal typing elsewhere.
  for (QAction* action : view->actions()) action->setShortcutContext(Qt::WidgetShortcut);
  view->addSeparator();
  add_action(view, tr("Clear the micro-batch highlight"), {},
             [this] { timeline_view_->highlight_micro_batch(-1); });
}

void MainWindow::build_menus() {
  // The menu bar first, then the toolbar, as the window has always made them.
  const QList<QAction*> file_actions = build_file_menu();
  QToolBar* tools = addToolBar(tr("Main"));
  tools->setMovable(false);
  tools->setToolButtonStyle(Qt::ToolButtonTextOnly);
  build_view_menu();

  QMenu* plan = menuBar()->addMenu(tr("&Plan"));
  QAction* find = add_action(plan, tr("&Find best plan"), QKeySequence(tr("Ctrl+B")),
                             [this] { planner_panel_->find_best_plan(); });
  QAction* run =
      add_action(plan, tr("&Run"), QKeySequence(tr("Ctrl+R")), [this] { run_panel_->run(); });

  QMenu* help = menuBar()->addMenu(tr("&Help"));
  add_action(help, tr("&Keys"), {}, [this] {
    QMessageBox::information(
        this, tr("Timeline keys"),
        tr("Wheel: zoom at the cursor · Shift+wheel: pan · Alt+wheel: scroll devices\n"
           "Drag: pan · Shift+drag or right-drag: zoom to the selection\n"
           "W/S or +/−: zoom · A/D or ←/→: pan · ↑/↓: scroll\n"
           "0 or Home: fit · Backspace or Ctrl+Z: undo zoom\n"
           "Click a task: highlight its micro-batch · Esc: clear"));
  });

  for (QAction* action : file_actions) tools->addAction(action);
  tools->addSeparator();
  tools->addAction(find);
  tools->addAction(run);
}

QString MainWindow::ask_open(const QString& title, const QString& filter) {
  return QFileDialog::getOpenFileName(this, title, QFileInfo(profile_path_).absolutePath(), filter);
}

QString MainWindow::ask_save(const QString& title, const QString& name, const QString& filter) {
  return QFileDialog::getSaveFileName(this, title, name, filter);
}

void MainWindow::report(const QString& problem) {
  if (problem.isEmpty()) return;
  statusBar()->showMessage(problem, 10000);
  if (!isVisible()) return;  // a screenshot run prints its problems itself
  // Window-modal, not a nested event loop: the window keeps drawing and nothing waits on a
  // click, the same on a desktop as on the offscreen platform.
  auto* box = new QMessageBox(QMessageBox::Warning, tr("pipetune"), problem, QMessageBox::Ok, this);
  box->setAttribute(Qt::WA_DeleteOnClose);
  box->open();
}

QStringList MainWindow::open_files(const QStringList& paths) {
  QStringList problems;
  QString profile, hardware;
  QStringList plans, traces;
  for (const QString& path : paths) {
    QString error;
    switch (classify_file(path, &error)) {
      case FileKind::Profile:
        profile = path;
        break;
      case FileKind::Hardware:
        hardware = path;
        break;
      case FileKind::Plan:
        plans << path;
        break;
      case FileKind::Trace:
        traces << path;
        break;
      case FileKind::Unknown:
        problems << error;
        break;
    }
  }
  // A profile first (its hardware with it), then plans, then traces: a predicted trace's plan
  // and a measured trace both need the profile's prediction to be there.
  if (!profile.isEmpty()) {
    if (const QString p = open_profile(profile, hardware); !p.isEmpty()) problems << p;
  } else if (!hardware.isEmpty()) {
    if (const QString p = open_hardware(hardware); !p.isEmpty()) problems << p;
  }
  for (const QString& plan : plans) {
    if (const QString p = load_plan(plan); !p.isEmpty()) problems << p;
  }
  for (const QString& trace : traces) {
    if (const QString p = open_trace(trace); !p.isEmpty()) problems << p;
  }
  return problems;
}

QString MainWindow::open_profile(const QString& path, const QString& hardware_path) {
  Profile profile;
  std::optional<Hardware> hardware;
  const QString problem = attempt([&] {
    profile = load_profile(path.toStdString());
    if (!hardware_path.isEmpty()) hardware = load_hardware(hardware_path.toStdString());
  });
  if (!problem.isEmpty()) return problem;
  profile_path_ = path;
  editor_.open_profile(std::move(profile), std::move(hardware));
  timeline_view_->fit();
  return {};
}

QString MainWindow::open_hardware(const QString& path) {
  if (!editor_.has_profile()) return tr("%1: open a profile before its hardware").arg(path);
  Hardware hardware;
  const QString problem = attempt([&] { hardware = load_hardware(path.toStdString()); });
  if (!problem.isEmpty()) return problem;
  editor_.open_hardware(std::move(hardware));
  return {};
}

QString MainWindow::open_trace(const QString& path) {
  auto trace = std::make_shared<Trace>();
  const QString problem = attempt([&] { *trace = load_trace(path.toStdString()); });
  if (!problem.isEmpty()) return problem;
  if (trace->kind == "predicted") {
    // A predicted trace carries its plan: load it into the editor when a profile is open, else
    // just show the trace.
    if (editor_.has_profile()) {
      if (!trace->plan)
        return tr("%1: a predicted trace without a plan; open its profile's plan instead")
            .arg(path);
      const QString refused = editor_.apply_plan(*trace->plan);
      return refused.isEmpty() ? QString() : path + QStringLiteral(": ") + refused;
    }
    timeline_model_.set_prediction(*trace);
    timeline_view_->fit();
    refresh_comparison();
    return {};
  }
  measured_ = std::move(trace);
  trace_path_ = path;
  timeline_model_.set_measured(measured_);
  refresh_comparison();
  update_title();
  return {};
}

void MainWindow::close_trace() {
  measured_.reset();
  trace_path_.clear();
  timeline_model_.clear_measured();
  refresh_comparison();
  update_title();
}

QString MainWindow::load_plan(const QString& path) {
  if (!editor_.has_profile()) return tr("%1: open a profile before a plan").arg(path);
  Plan plan;
  const QString problem = attempt([&] { plan = pipetune::load_plan(path.toStdString()); });
  if (!problem.isEmpty()) return problem;
  const QString refused = editor_.apply_plan(plan);
  return refused.isEmpty() ? QString() : path + QStringLiteral(": ") + refused;
}

QString MainWindow::save_plan(const QString& path) {
  if (!editor_.has_profile()) return tr("no plan to save: open a profile first");
  return attempt([&] { pipetune::save_plan(editor_.plan(), path.toStdString()); });
}

QString MainWindow::export_timeline_png(const QString& path) {
  const QPixmap image = timeline_view_->grab();
  return image.save(path, "PNG") ? QString() : tr("%1: could not write the image").arg(path);
}

QString MainWindow::export_predicted_trace(const QString& path) {
  if (!editor_.has_profile()) return tr("no prediction to export: open a profile first");
  return attempt([&] {
    save_trace(trace_from_simulation(editor_.result(), editor_.profile().model),
               path.toStdString());
  });
}

QString MainWindow::save_screenshot(const QString& path, const QSize& size) {
  resize(size);
  show();
  // Layout requests travel up the widget tree one posted event per level: let them all land.
  for (int round = 0; round < 8; ++round) QApplication::processEvents();
  const QPixmap image = grab();
  return image.save(path, "PNG") ? QString() : tr("%1: could not write the image").arg(path);
}

void MainWindow::on_simulated() {
  timeline_model_.set_prediction(editor_.result());
  if (editor_.interval().known())
    timeline_model_.set_predicted_interval(editor_.interval().low_ms, editor_.interval().high_ms);
  cost_strip_->refresh();
  refresh_comparison();
  const SimulationResult& r = editor_.result();
  status_plan_->setText(
      tr("%1 — iteration %2, %3 samples/s, bubble %4 %")
          .arg(QString::fromStdString(describe_plan(r.plan)), format_duration(r.iteration_ms))
          .arg(r.throughput_samples_per_s, 0, 'f', 1)
          .arg(r.bubble_fraction * 100, 0, 'f', 1));
  if (r.fits()) {
    status_fit_->setText(tr("fits in memory"));
    status_fit_->setStyleSheet(QStringLiteral("color: #2e7d32;"));
  } else {
    int over = 0;
    for (const auto& d : r.devices) over += d.fits() ? 0 : 1;
    status_fit_->setText(tr("does not fit on %n device(s)", nullptr, over));
    status_fit_->setStyleSheet(QStringLiteral("color: #d62728; font-weight: bold;"));
  }
  status_speed_->setText(
      tr("re-simulated in %1").arg(format_duration(editor_.last_simulation_wall_ms())));
}

void MainWindow::refresh_comparison() {
  const OverlaySummary summary =
      summarize(timeline_model_, editor_.has_profile() ? &editor_.plan() : nullptr);
  QString headline;
  double throughput = 0.0, bubble = 0.0;
  if (editor_.has_profile()) {
    const SimulationResult& r = editor_.result();
    headline = tr("<b>%1</b> on %n device(s)", nullptr, static_cast<int>(r.devices.size()))
                   .arg(QString::fromStdString(describe_plan(r.plan)).toHtmlEscaped());
    if (!r.fits()) headline += tr(" — <span style='color:#d62728'><b>does not fit</b></span>");
    throughput = r.throughput_samples_per_s;
    bubble = r.bubble_fraction;
  } else if (timeline_model_.has_prediction()) {
    headline = tr("A predicted trace, without its profile");
  } else {
    headline = tr("Open a profile to predict a plan.");
  }
  comparison_->show_summary(summary, headline, throughput, bubble, timeline_model_,
                            QFileInfo(trace_path_).fileName());
}

void MainWindow::update_title() {
  QString title = QStringLiteral("pipetune");
  if (editor_.has_profile()) {
    title += QStringLiteral(" — %1 (%2)")
                 .arg(QString::fromStdString(editor_.profile().model),
                      QFileInfo(profile_path_).fileName());
  }
  if (!trace_path_.isEmpty()) title += tr(" over %1").arg(QFileInfo(trace_path_).fileName());
  setWindowTitle(title);
}

void MainWindow::dragEnterEvent(QDragEnterEvent* event) {
  if (event->mimeData()->hasUrls()) event->acceptProposedAction();
}

void MainWindow::dropEvent(QDropEvent* event) {
  QStringList paths;
  for (const QUrl& url : event->mimeData()->urls()) {
    if (url.isLocalFile()) paths << url.toLocalFile();
  }
  const QStringList problems = open_files(paths);
  if (!problems.isEmpty()) report(problems.join(QLatin1Char('\n')));
}

void MainWindow::closeEvent(QCloseEvent* event) {
  planner_panel_->worker().cancel();
  runner_->cancel();
  QMainWindow::closeEvent(event);
}

}  // namespace pipetune::gui
