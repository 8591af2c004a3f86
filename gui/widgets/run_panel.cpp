#include "gui/widgets/run_panel.hpp"

#include <QHBoxLayout>
#include <QLabel>
#include <QProgressBar>
#include <QPushButton>
#include <QSpinBox>
#include <QVBoxLayout>

namespace pipetune::gui {

RunPanel::RunPanel(PlanEditor& editor, RunController& runner, QWidget* parent)
    : QWidget(parent),
      editor_(editor),
      runner_(runner),
      steps_(new QSpinBox(this)),
      run_(new QPushButton(tr("Run"), this)),
      progress_(new QProgressBar(this)),
      status_(new QLabel(this)) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  auto* row = new QHBoxLayout;
  row->addWidget(run_);
  row->addWidget(new QLabel(tr("steps"), this));
  steps_->setRange(1, 10000);
  steps_->setValue(5);
  steps_->setToolTip(tr("Training steps to run; the overlay shows the last one"));
  row->addWidget(steps_);
  row->addWidget(progress_, 1);
  layout->addLayout(row);
  progress_->setFormat(QString());  // until a run starts
  progress_->setRange(0, 1);
  progress_->setValue(0);
  status_->setWordWrap(true);
  status_->setStyleSheet(QStringLiteral("color: #4a525d;"));
  layout->addWidget(status_);

  connect(run_, &QPushButton::clicked, this, [this] {
    if (runner_.running()) {
      runner_.cancel();
    } else {
      run();
    }
  });
  connect(&runner_, &RunController::progressed, this, [this](int done, int total) {
    progress_->setRange(0, std::max(1, total));
    progress_->setValue(done);
    status_->setText(tr("Running: step %1 of %2…").arg(done).arg(total));
  });
  connect(&runner_, &RunController::succeeded, this, [this] {
    run_->setText(tr("Run"));
    progress_->setValue(progress_->maximum());
    status_->setText(tr("Run finished; its measured trace is in the overlay."));
  });
  connect(&runner_, &RunController::failed, this, [this](const QString& reason) {
    run_->setText(tr("Run"));
    status_->setText(
        QStringLiteral("<span style='color:#c62828'>%1</span>").arg(reason.toHtmlEscaped()));
    update_button();
  });
  connect(&editor_, &PlanEditor::profile_changed, this, &RunPanel::refresh);
  refresh();
}

void RunPanel::update_button() {
  const QString reason =
      runner_.unavailable_reason(editor_.has_profile() ? &editor_.profile() : nullptr);
  run_->setEnabled(reason.isEmpty() || runner_.running());
  run_->setToolTip(reason.isEmpty()
                       ? tr("pipetune run, then overlay the measured trace (%1)").arg(runner_.cli())
                       : reason);
}

void RunPanel::refresh() {
  update_button();
  if (runner_.running()) return;
  const QString reason =
      runner_.unavailable_reason(editor_.has_profile() ? &editor_.profile() : nullptr);
  status_->setText(
      reason.isEmpty()
          ? tr("Runs the current plan on the real model and overlays what it measured.")
          : reason);
}

void RunPanel::run() {
  if (!editor_.has_profile()) return;
  progress_->setRange(0, steps_->value());
  progress_->setValue(0);
  progress_->setFormat(tr("%v / %m steps"));
  status_->setText(tr("Starting pipetune run…"));
  if (runner_.start(editor_.profile(), editor_.plan(), steps_->value()))
    run_->setText(tr("Cancel"));
}

}  // namespace pipetune::gui
