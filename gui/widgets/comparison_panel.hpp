#pragma once

// Prediction against measurement: iteration time and per-device peak memory, predicted,
// measured (when a measured trace is open) and the error; how the measured trace is overlaid
// (which step, outlines or ghosts, error colours).

#include <QWidget>

#include "gui/model/overlay_summary.hpp"
#include "gui/model/timeline_painter.hpp"

class QCheckBox;
class QComboBox;
class QLabel;
class QPushButton;
class QSpinBox;
class QTableWidget;

namespace pipetune::gui {

class ComparisonPanel : public QWidget {
  Q_OBJECT

 public:
  explicit ComparisonPanel(QWidget* parent = nullptr);

  /// `headline`: the plan and its prediction in a line; `trace_name`: the measured file.
  void show_summary(const OverlaySummary& summary, const QString& headline, double throughput,
                    double bubble, const TimelineModel& model, const QString& trace_name);
  QTableWidget* table() const { return table_; }

 signals:
  void step_chosen(int step);
  void overlay_style_chosen(OverlayStyle style);
  void colour_by_error_toggled(bool on);
  void close_trace_requested();

 private:
  void fill_summary_table(const OverlaySummary& s, double throughput, double bubble,
                          const TimelineModel& model);
  void show_overlay_info(const OverlaySummary& s, const TimelineModel& model,
                         const QString& trace_name);
  QLabel* headline_;
  QTableWidget* table_;
  QLabel* overlay_info_;
  QWidget* overlay_controls_;
  QSpinBox* step_;
  QComboBox* style_;
  QCheckBox* colour_by_error_;
  QPushButton* close_;
};

}  // namespace pipetune::gui
