#include "gui/widgets/plan_panel.hpp"

#include <QComboBox>
#include <QDoubleSpinBox>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QSignalBlocker>
#include <QSlider>
#include <QSpinBox>
#include <algorithm>
#include <cmath>

#include "gui/model/text_format.hpp"

namespace pipetune::gui {

PlanPanel::PlanPanel(PlanEditor& editor, QWidget* parent)
    : QWidget(parent),
      editor_(editor),
      balance_(new QLineEdit(this)),
      chunks_slider_(new QSlider(Qt::Horizontal, this)),
      chunks_spin_(new QSpinBox(this)),
      micro_batches_(new QLabel(this)),
      checkpoint_(new QComboBox(this)),
      schedule_(new QComboBox(this)),
      stages_per_device_(new QSpinBox(this)),
      optimizer_(new QDoubleSpinBox(this)),
      devices_(new QSpinBox(this)),
      memory_(new QLineEdit(this)),
      bandwidth_(new QLineEdit(this)),
      problem_(new QLabel(this)) {
  QPushButton* rebalance = lay_out_form();
  connect_edits(rebalance);
  sync();
}

// The form: balance and its "Even out" button, chunks, checkpoint, schedule, stages per
// device, optimizer state, devices, memory and bandwidth, then the problem line.
QPushButton* PlanPanel::lay_out_form() {
  auto* form = new QFormLayout(this);
  form->setContentsMargins(0, 0, 0, 0);
  form->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);

  balance_->setToolTip(
      tr("Layers per stage, e.g. 3,3,2 (or drag the boundaries in the layer strip)"));
  auto* rebalance = new QPushButton(tr("Even out"), this);
  rebalance->setToolTip(tr("The balance that minimises the busiest device's compute"));
  auto* balance_row = new QHBoxLayout;
  balance_row->addWidget(balance_, 1);
  balance_row->addWidget(rebalance);
  form->addRow(tr("Balance"), balance_row);

  chunks_slider_->setToolTip(tr("Micro-batches per mini-batch"));
  auto* chunks_row = new QHBoxLayout;
  chunks_row->addWidget(chunks_slider_, 1);
  chunks_row->addWidget(chunks_spin_);
  form->addRow(tr("Chunks"), chunks_row);
  micro_batches_->setStyleSheet(QStringLiteral("color: #6a727d;"));
  form->addRow(QString(), micro_batches_);

  for (CheckpointMode mode : kAllCheckpointModes) {
    checkpoint_->addItem(QString::fromUtf8(to_string(mode).data()), static_cast<int>(mode));
  }
  checkpoint_->setToolTip(tr("torchgpipe's checkpoint modes: which micro-batches are recomputed"));
  form->addRow(tr("Checkpoint"), checkpoint_);
  for (ScheduleKind kind : kAllScheduleKinds) {
    schedule_->addItem(QString::fromUtf8(to_string(kind).data()), static_cast<int>(kind));
  }
  form->addRow(tr("Schedule"), schedule_);
  stages_per_device_->setToolTip(
      tr("Stages each device runs (interleaved-1f1b, interleaved-zb, looped-bfs; zbv and dualpipev "
         "run 2); "
         "changing it evens out the balance"));
  form->addRow(tr("Stages / device"), stages_per_device_);
  optimizer_->setRange(0, 8);
  optimizer_->setSingleStep(1);
  optimizer_->setDecimals(1);
  optimizer_->setToolTip(tr("Optimizer state per parameter byte: 0 SGD, 1 momentum, 2 Adam"));
  form->addRow(tr("Optimizer state"), optimizer_);

  devices_->setToolTip(
      tr("Devices the stages run on (stages / device each); changing it evens out the balance"));
  form->addRow(tr("Devices"), devices_);
  memory_->setToolTip(
      tr("Memory of every device, e.g. 16 GiB, 512 MiB, 8e9; \"unlimited\" for no limit"));
  form->addRow(tr("Memory / device"), memory_);
  bandwidth_->setToolTip(tr("Bandwidth of every link, e.g. 25 GB/s, 1e8, or \"ideal\""));
  form->addRow(tr("Link bandwidth"), bandwidth_);
  problem_->setWordWrap(true);
  problem_->setStyleSheet(QStringLiteral("color: #d62728;"));
  problem_->hide();
  form->addRow(problem_);
  return rebalance;
}

// Each edit goes to the editor, which refuses it (the problem line says why) or changes the
// plan; the panel shows the editor's state after every change.
void PlanPanel::connect_edits(QPushButton* rebalance) {
  connect(balance_, &QLineEdit::editingFinished, this, [this] {
    const auto balance = parse_balance(balance_->text());
    show_problem(balance.empty() ? tr("balance: expected layer counts such as 3,3,2")
                                 : editor_.set_balance(balance));
  });
  connect(rebalance, &QPushButton::clicked, this, [this] { show_problem(editor_.even_out()); });
  connect(chunks_slider_, &QSlider::valueChanged, this,
          [this](int value) { refuse_or_sync(editor_.set_chunks(value)); });
  connect(chunks_spin_, &QSpinBox::valueChanged, this,
          [this](int value) { refuse_or_sync(editor_.set_chunks(value)); });
  connect(checkpoint_, &QComboBox::currentIndexChanged, this, [this] {
    editor_.set_checkpoint(static_cast<CheckpointMode>(checkpoint_->currentData().toInt()));
  });
  connect(schedule_, &QComboBox::currentIndexChanged, this, [this] {
    refuse_or_sync(
        editor_.set_schedule(static_cast<ScheduleKind>(schedule_->currentData().toInt())));
  });
  connect(stages_per_device_, &QSpinBox::valueChanged, this,
          [this](int value) { refuse_or_sync(editor_.set_stages_per_device(value)); });
  connect(optimizer_, &QDoubleSpinBox::valueChanged, this,
          [this](double value) { editor_.set_optimizer_state_factor(value); });
  connect(devices_, &QSpinBox::valueChanged, this,
          [this](int value) { refuse_or_sync(editor_.set_device_count(value)); });
  connect(memory_, &QLineEdit::editingFinished, this, [this] {
    const std::int64_t bytes = parse_size(memory_->text());
    if (bytes < 0) {
      show_problem(tr("memory: expected a size up to 64 TiB such as 16 GiB, 512 MiB or unlimited"));
      return;
    }
    show_problem({});
    editor_.set_memory_per_device(bytes);
  });
  connect(bandwidth_, &QLineEdit::editingFinished, this, [this] {
    const double bandwidth = parse_bandwidth(bandwidth_->text());
    if (std::isnan(bandwidth)) {
      show_problem(tr("bandwidth: expected bytes per second such as 25 GB/s, 1e8 or ideal"));
      return;
    }
    show_problem({});
    editor_.set_link_bandwidth(bandwidth);
  });

  connect(&editor_, &PlanEditor::plan_changed, this, &PlanPanel::sync);
  connect(&editor_, &PlanEditor::hardware_changed, this, &PlanPanel::sync);
  connect(&editor_, &PlanEditor::profile_changed, this, &PlanPanel::sync);
}

void PlanPanel::show_problem(const QString& problem) {
  problem_->setText(problem);
  problem_->setVisible(!problem.isEmpty());
  if (problem.isEmpty()) sync();
}

void PlanPanel::refuse_or_sync(const QString& problem) {
  show_problem(problem);
  if (!problem.isEmpty()) sync();  // back to the plan the editor kept
}

void PlanPanel::sync() {
  const bool ready = editor_.has_profile();
  setEnabled(ready);
  if (!ready) return;
  const QSignalBlocker b1(balance_), b2(chunks_slider_), b3(chunks_spin_), b4(checkpoint_),
      b5(schedule_), b6(optimizer_), b7(devices_), b8(memory_), b9(bandwidth_),
      b10(stages_per_device_);
  const Plan& plan = editor_.plan();
  const Profile& profile = editor_.profile();
  balance_->setText(format_balance(plan.balance).mid(1).chopped(1));
  const int batch = static_cast<int>(profile.batch_size);
  chunks_slider_->setRange(1, batch);
  chunks_spin_->setRange(1, batch);
  chunks_slider_->setValue(plan.chunks);
  chunks_spin_->setValue(plan.chunks);
  const auto sizes = split_batch(profile.batch_size, plan.chunks);
  QString split =
      tr("%n micro-batch(es) of %1", nullptr, static_cast<int>(sizes.size())).arg(sizes.front());
  if (sizes.back() != sizes.front()) split += tr(" (last %1)").arg(sizes.back());
  micro_batches_->setText(split + tr(", batch %1").arg(batch));
  checkpoint_->setCurrentIndex(checkpoint_->findData(static_cast<int>(plan.checkpoint)));
  schedule_->setCurrentIndex(schedule_->findData(static_cast<int>(plan.schedule)));
  // Only the looped schedules choose; the V schedules always run two stages per device.
  const int layers = static_cast<int>(profile.layer_count());
  const int programmes = std::max(1, plan.stages() / plan.stages_per_device);
  stages_per_device_->setEnabled(!fixed_stages_per_device(plan.schedule).has_value());
  stages_per_device_->setRange(1, std::max(plan.stages_per_device, layers / programmes));
  stages_per_device_->setValue(plan.stages_per_device);
  optimizer_->setValue(plan.optimizer_state_factor);
  devices_->setRange(1, layers / plan.stages_per_device);
  devices_->setValue(static_cast<int>(editor_.hardware().devices.size()));
  const std::int64_t memory = editor_.memory_per_device();
  memory_->setText(memory < 0    ? tr("(differs per device)")
                   : memory == 0 ? tr("unlimited")
                                 : format_size(memory));
  bandwidth_->setText(format_bandwidth(editor_.hardware().link.bandwidth_bytes_per_s));
}

}  // namespace pipetune::gui
