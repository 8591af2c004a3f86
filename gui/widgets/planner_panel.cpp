#include "gui/widgets/planner_panel.hpp"

#include <QHBoxLayout>
#include <QLabel>
#include <QProgressBar>
#include <QPushButton>
#include <QTableWidget>
#include <QVBoxLayout>

#include "gui/model/text_format.hpp"
#include "gui/widgets/plan_table.hpp"

namespace pipetune::gui {

PlannerPanel::PlannerPanel(PlanEditor& editor, QWidget* parent)
    : QWidget(parent),
      editor_(editor),
      worker_(this),
      find_(new QPushButton(tr("Find best plan"), this)),
      progress_(new QProgressBar(this)),
      status_(new QLabel(this)),
      table_(make_plan_table({tr("balance"), tr("chunks"), tr("checkpoint"), tr("sched."),
                              tr("iteration"), tr("80 % interval")},
                             this)) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  auto* row = new QHBoxLayout;
  find_->setToolTip(
      tr("Search every balance, chunk count, checkpoint mode and schedule for the "
         "fastest plan that fits the devices (exact, judged by the simulator)"));
  row->addWidget(find_);
  row->addWidget(progress_, 1);
  layout->addLayout(row);
  progress_->setTextVisible(true);
  progress_->setFormat(QString());  // until a search starts
  progress_->setRange(0, 1);
  progress_->setValue(0);
  status_->setWordWrap(true);
  status_->setStyleSheet(QStringLiteral("color: #4a525d;"));
  status_->setText(tr("Ranks the best plan of each configuration; click one to load it."));
  layout->addWidget(status_);

  layout->addWidget(table_);

  connect(find_, &QPushButton::clicked, this, [this] {
    if (searching_) {
      worker_.cancel();
    } else {
      find_best_plan();
    }
  });
  connect(&worker_, &PlannerWorker::progressed, this, [this](int done, int total) {
    progress_->setRange(0, std::max(1, total));
    progress_->setValue(done);
  });
  connect(&worker_, &PlannerWorker::finished, this, &PlannerPanel::show_result);
  connect(&worker_, &PlannerWorker::intervals_ready, this, &PlannerPanel::show_intervals);
  connect(&worker_, &PlannerWorker::failed, this, [this](const QString& reason) {
    set_busy(false);
    status_->setText(tr("<span style='color:#c62828'>%1</span>").arg(reason.toHtmlEscaped()));
    emit search_finished();
  });
  connect(&worker_, &PlannerWorker::cancelled, this, [this] {
    set_busy(false);
    status_->setText(tr("Search cancelled."));
    emit search_finished();
  });
  connect(table_, &QTableWidget::cellClicked, this, [this](int r, int) { pick(r); });
  connect(&editor_, &PlanEditor::profile_changed, this, [this] {
    table_->setRowCount(0);
    result_.reset();
  });
  find_->setEnabled(editor_.has_profile());
  connect(&editor_, &PlanEditor::profile_changed, this, [this] { find_->setEnabled(true); });
}

void PlannerPanel::set_busy(bool busy) {
  searching_ = busy;
  find_->setText(busy ? tr("Cancel") : tr("Find best plan"));
  if (!busy) progress_->setValue(progress_->maximum());
}

void PlannerPanel::find_best_plan() {
  if (!editor_.has_profile() || searching_) return;
  // The last search's alternatives may still be re-planned: drop them.
  worker_.cancel();
  worker_.wait();
  PlannerOptions options;
  // Every schedule, as `pipetune plan` searches by default.
  options.schedules.assign(std::begin(kAllScheduleKinds), std::end(kAllScheduleKinds));
  options.optimizer_state_factor = editor_.plan().optimizer_state_factor;
  options.top = 10;
  progress_->setRange(0, 1);
  progress_->setValue(0);
  progress_->setFormat(tr("%v / %m configurations"));
  status_->setText(tr("Searching plans for %n device(s)…", nullptr,
                      static_cast<int>(editor_.hardware().devices.size())));
  set_busy(true);
  worker_.start(editor_.profile(), editor_.hardware(), options);
  emit search_started();
}

void PlannerPanel::show_intervals(std::shared_ptr<const std::vector<IterationInterval>> intervals) {
  if (!result_ || intervals->size() != result_->ranked.size()) return;
  for (std::size_t k = 0; k < intervals->size(); ++k) {
    const IterationInterval& i = (*intervals)[k];
    auto* item = new QTableWidgetItem(
        i.known() ? tr("%1 – %2").arg(format_duration(i.low_ms), format_duration(i.high_ms))
                  : tr("–"));
    item->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
    item->setToolTip(i.known() ? tr("80 % of steps should take this long (p10 to p90)")
                               : tr("no spreads in the profile and no model error in the "
                                    "hardware: profile again, or validate"));
    table_->setItem(static_cast<int>(k), 5, item);
  }
}

void PlannerPanel::show_result(std::shared_ptr<const PlanSearchResult> result) {
  set_busy(false);
  result_ = std::move(result);
  table_->setRowCount(static_cast<int>(result_->ranked.size()));
  for (std::size_t k = 0; k < result_->ranked.size(); ++k) {
    const PlanCandidate& c = result_->ranked[k];
    const int r = static_cast<int>(k);
    auto set = [&](int column, const QString& text) {
      auto* item = new QTableWidgetItem(text);
      item->setTextAlignment(column == 0 ? Qt::AlignLeft | Qt::AlignVCenter
                                         : Qt::AlignRight | Qt::AlignVCenter);
      item->setToolTip(tr("max peak memory %1, bubble %2 %")
                           .arg(format_size(c.max_peak_memory_bytes()))
                           .arg(c.bubble_fraction * 100, 0, 'f', 1));
      table_->setItem(r, column, item);
    };
    set(0, format_balance(c.plan.balance));
    set(1, QString::number(c.plan.chunks));
    set(2, QString::fromUtf8(to_string(c.plan.checkpoint).data()));
    set(3, format_schedule(c.plan));
    set(4, format_duration(c.iteration_ms));
    set(5, tr("…"));  // until intervals_ready
  }
  const PlannerStats& stats = result_->stats;
  if (result_->ranked.empty()) {
    QString text =
        result_->none_fits_proven
            ? tr("<span style='color:#c62828'>No plan fits these devices.</span>")
            : tr("<span style='color:#c62828'>No fitting plan found before the search budget "
                 "ran out: raise it, a plan may fit.</span>");
    if (result_->leanest) {
      text +=
          tr(" The leanest, %1, needs %2 per device.")
              .arg(QString::fromStdString(describe_plan(result_->leanest->plan)).toHtmlEscaped(),
                   format_size(result_->leanest->max_peak_memory_bytes()));
    }
    status_->setText(text);
  } else if (stats.proven) {
    status_->setText(tr("Best plan proven optimal under the simulator over %3 (%1 "
                        "configurations, %2 simulations). Click a row to load it.")
                         .arg(stats.configurations)
                         .arg(stats.simulations)
                         .arg(QString::fromStdString(result_->search_space).toHtmlEscaped()));
  } else {
    status_->setText(
        tr("Search budget spent: the best plan is within %1 of optimal. Click a row to load it.")
            .arg(format_error(stats.gap()).remove(QLatin1Char('+'))));
  }
  emit search_finished();
}

void PlannerPanel::pick(int row) {
  if (!result_ || row < 0 || row >= static_cast<int>(result_->ranked.size())) return;
  emit plan_picked(editor_.apply_plan(result_->ranked[row].plan));
}

}  // namespace pipetune::gui
