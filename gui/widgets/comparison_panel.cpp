#include "gui/widgets/comparison_panel.hpp"

#include <QCheckBox>
#include <QComboBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QPushButton>
#include <QSignalBlocker>
#include <QSpinBox>
#include <QTableWidget>
#include <QVBoxLayout>
#include <cmath>

#include "gui/model/text_format.hpp"

namespace pipetune::gui {

namespace {

QTableWidgetItem* cell(const QString& text,
                       Qt::Alignment alignment = Qt::AlignRight | Qt::AlignVCenter) {
  auto* item = new QTableWidgetItem(text);
  item->setTextAlignment(alignment);
  item->setFlags(Qt::ItemIsEnabled | Qt::ItemIsSelectable);
  return item;
}

// Errors within 10 % read green, within 25 % amber, beyond that red.
QTableWidgetItem* error_cell(double error) {
  QTableWidgetItem* item = cell(format_error(error));
  if (std::isfinite(error)) {
    const double magnitude = std::fabs(error);
    item->setForeground(magnitude <= 0.10   ? QColor(0x2e, 0x7d, 0x32)
                        : magnitude <= 0.25 ? QColor(0xb2, 0x6a, 0x00)
                                            : QColor(0xc6, 0x28, 0x28));
  }
  return item;
}

}  // namespace

ComparisonPanel::ComparisonPanel(QWidget* parent)
    : QWidget(parent),
      headline_(new QLabel(this)),
      table_(new QTableWidget(this)),
      overlay_info_(new QLabel(this)),
      overlay_controls_(new QWidget(this)),
      step_(new QSpinBox(this)),
      style_(new QComboBox(this)),
      colour_by_error_(new QCheckBox(tr("Colour measured tasks by error"), this)),
      close_(new QPushButton(tr("Close trace"), this)) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  headline_->setWordWrap(true);
  headline_->setTextFormat(Qt::RichText);
  layout->addWidget(headline_);

  table_->setColumnCount(4);
  table_->setHorizontalHeaderLabels({QString(), tr("predicted"), tr("measured"), tr("error")});
  table_->verticalHeader()->hide();
  table_->verticalHeader()->setSectionResizeMode(QHeaderView::Fixed);
  table_->verticalHeader()->setDefaultSectionSize(table_->fontMetrics().height() + 6);
  table_->setVerticalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  table_->horizontalHeader()->setSectionResizeMode(0, QHeaderView::Stretch);
  for (int c = 1; c < 4; ++c)
    table_->horizontalHeader()->setSectionResizeMode(c, QHeaderView::ResizeToContents);
  table_->setSelectionMode(QAbstractItemView::NoSelection);
  table_->setFocusPolicy(Qt::NoFocus);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->setShowGrid(false);
  table_->setAlternatingRowColors(true);
  table_->setToolTip(tr("Errors are (predicted − measured) / measured"));
  layout->addWidget(table_);

  overlay_info_->setWordWrap(true);
  overlay_info_->setStyleSheet(QStringLiteral("color: #4a525d;"));
  layout->addWidget(overlay_info_);

  auto* controls = new QVBoxLayout(overlay_controls_);
  controls->setContentsMargins(0, 0, 0, 0);
  auto* row = new QHBoxLayout;
  row->addWidget(new QLabel(tr("Step"), overlay_controls_));
  row->addWidget(step_);
  row->addSpacing(8);
  row->addWidget(new QLabel(tr("Prediction as"), overlay_controls_));
  style_->addItem(tr("outlines"), static_cast<int>(OverlayStyle::Outline));
  style_->addItem(tr("ghosts"), static_cast<int>(OverlayStyle::Ghost));
  row->addWidget(style_, 1);
  controls->addLayout(row);
  auto* row2 = new QHBoxLayout;
  row2->addWidget(colour_by_error_, 1);
  row2->addWidget(close_);
  controls->addLayout(row2);
  layout->addWidget(overlay_controls_);
  overlay_controls_->hide();

  step_->setToolTip(tr("Which training step of the measured trace to overlay"));
  connect(step_, &QSpinBox::valueChanged, this, &ComparisonPanel::step_chosen);
  connect(style_, &QComboBox::currentIndexChanged, this, [this] {
    emit overlay_style_chosen(static_cast<OverlayStyle>(style_->currentData().toInt()));
  });
  connect(colour_by_error_, &QCheckBox::toggled, this, &ComparisonPanel::colour_by_error_toggled);
  connect(close_, &QPushButton::clicked, this, &ComparisonPanel::close_trace_requested);
}

// The table: iteration time (with its 80 % interval), throughput, bubble, each device's peak.
void ComparisonPanel::fill_summary_table(const OverlaySummary& s, double throughput, double bubble,
                                         const TimelineModel& model) {
  const bool measured = s.has_measured;
  const int rows = 3 + static_cast<int>(s.devices.size());
  table_->setRowCount(rows);
  table_->setItem(0, 0, cell(tr("iteration"), Qt::AlignLeft | Qt::AlignVCenter));
  table_->setItem(
      0, 1, cell(model.has_prediction() ? format_duration(s.predicted_ms) : QStringLiteral("—")));
  if (!std::isnan(s.predicted_low_ms)) {
    table_->item(0, 1)->setToolTip(tr("80 % of a run's steps should take %1 to %2")
                                       .arg(format_duration(s.predicted_low_ms))
                                       .arg(format_duration(s.predicted_high_ms)));
    table_->item(0, 1)->setText(QStringLiteral("%1 (%2–%3)")
                                    .arg(format_duration(s.predicted_ms))
                                    .arg(format_duration(s.predicted_low_ms))
                                    .arg(format_duration(s.predicted_high_ms)));
  }
  table_->setItem(0, 2, cell(measured ? format_duration(s.measured_ms) : QStringLiteral("—")));
  table_->setItem(0, 3, error_cell(s.time_error));
  table_->setItem(1, 0, cell(tr("throughput"), Qt::AlignLeft | Qt::AlignVCenter));
  table_->setItem(1, 1, cell(tr("%1 /s").arg(throughput, 0, 'f', 1)));
  table_->setItem(1, 2, cell(QString()));
  table_->setItem(1, 3, cell(QString()));
  table_->setItem(2, 0, cell(tr("bubble"), Qt::AlignLeft | Qt::AlignVCenter));
  table_->setItem(2, 1, cell(QStringLiteral("%1 %").arg(bubble * 100.0, 0, 'f', 1)));
  table_->setItem(2, 2, cell(QString()));
  table_->setItem(2, 3, cell(QString()));
  for (std::size_t d = 0; d < s.devices.size(); ++d) {
    const DeviceComparison& device = s.devices[d];
    const int r = 3 + static_cast<int>(d);
    auto* name = cell(tr("peak %1").arg(QString::fromStdString(device.name)),
                      Qt::AlignLeft | Qt::AlignVCenter);
    auto* predicted = cell(format_size(device.predicted_peak_bytes));
    const bool over =
        device.capacity_bytes > 0 && device.predicted_peak_bytes > device.capacity_bytes;
    if (over) {
      predicted->setForeground(QColor(0xd6, 0x27, 0x28));
      predicted->setToolTip(
          tr("more than the device's %1").arg(format_size(device.capacity_bytes)));
      name->setForeground(QColor(0xd6, 0x27, 0x28));
    }
    table_->setItem(r, 0, name);
    table_->setItem(r, 1, predicted);
    table_->setItem(r, 2,
                    cell(device.measured_peak_bytes >= 0 ? format_size(device.measured_peak_bytes)
                                                         : QStringLiteral("—")));
    table_->setItem(r, 3, error_cell(device.error));
  }
  // Tall enough for every row: the table never scrolls inside the scrolling side panel.
  const int row_height = table_->verticalHeader()->defaultSectionSize();
  table_->setFixedHeight(table_->horizontalHeader()->sizeHint().height() + rows * row_height +
                         2 * table_->frameWidth() + 2);
}

// What the overlay shows and how it was matched, and the step chooser.
void ComparisonPanel::show_overlay_info(const OverlaySummary& s, const TimelineModel& model,
                                        const QString& trace_name) {
  QString info = tr("<b>%1</b>, step %2 (the trace has %3), aligned at its first task: measured "
                    "tasks are the solid bars, predicted ones the outlines. %4 tasks matched; "
                    "median |task error| %5.")
                     .arg(trace_name.toHtmlEscaped())
                     .arg(model.measured_step())
                     .arg(model.measured_steps().size())
                     .arg(s.matched_tasks)
                     .arg(format_error(s.median_abs_task_error).remove(QLatin1Char('+')));
  if (s.unmatched_predicted + s.unmatched_measured > 0) {
    info += tr(" Unmatched: %1 predicted, %2 measured.")
                .arg(s.unmatched_predicted)
                .arg(s.unmatched_measured);
  }
  if (s.dropped_measured > 0) {
    info += tr(" %1 measured tasks ran on devices this prediction does not have.")
                .arg(s.dropped_measured);
  }
  if (s.other_plan) {
    info += tr("<br><span style='color:#b26a00'>The trace ran %1, not the current plan.</span>")
                .arg(QString::fromStdString(*s.other_plan).toHtmlEscaped());
  }
  overlay_info_->setTextFormat(Qt::RichText);
  overlay_info_->setText(info);
  const QSignalBlocker block(step_);
  const auto& steps = model.measured_steps();
  step_->setRange(steps.empty() ? 0 : steps.front(), steps.empty() ? 0 : steps.back());
  step_->setValue(model.measured_step());
  step_->setEnabled(steps.size() > 1);
}

void ComparisonPanel::show_summary(const OverlaySummary& s, const QString& headline,
                                   double throughput, double bubble, const TimelineModel& model,
                                   const QString& trace_name) {
  headline_->setText(headline);
  fill_summary_table(s, throughput, bubble, model);
  const bool measured = s.has_measured;
  overlay_controls_->setVisible(measured);
  if (!measured) {
    overlay_info_->setText(
        tr("Open a measured trace (File ▸ Open trace…) or press Run to compare "
           "this prediction with a measurement."));
    return;
  }
  show_overlay_info(s, model, trace_name);
}

}  // namespace pipetune::gui
