#pragma once

// The plan's controls: balance, chunks (slider and spin box), checkpoint mode, schedule and its
// stages per device, optimizer state, and the hardware edits (device count, memory per device, link
// bandwidth). Every change goes straight to the PlanEditor, which re-simulates.

#include <QWidget>

#include "gui/model/plan_editor.hpp"

class QComboBox;
class QDoubleSpinBox;
class QLabel;
class QLineEdit;
class QPushButton;
class QSlider;
class QSpinBox;

namespace pipetune::gui {

class PlanPanel : public QWidget {
  Q_OBJECT

 public:
  explicit PlanPanel(PlanEditor& editor, QWidget* parent = nullptr);

  /// Shows the editor's state (without feeding it back).
  void sync();

  QLineEdit* balance_edit() const { return balance_; }
  QSpinBox* chunks_spin() const { return chunks_spin_; }
  QSlider* chunks_slider() const { return chunks_slider_; }
  QComboBox* schedule_combo() const { return schedule_; }
  QSpinBox* stages_per_device_spin() const { return stages_per_device_; }
  QSpinBox* devices_spin() const { return devices_; }
  QLineEdit* memory_edit() const { return memory_; }
  QLineEdit* bandwidth_edit() const { return bandwidth_; }

 private:
  QPushButton* lay_out_form();
  void connect_edits(QPushButton* rebalance);
  void show_problem(const QString& problem);
  /// A refused combo or spin box edit: says why and shows the plan that was kept.
  void refuse_or_sync(const QString& problem);

  PlanEditor& editor_;
  QLineEdit* balance_;
  QSlider* chunks_slider_;
  QSpinBox* chunks_spin_;
  QLabel* micro_batches_;
  QComboBox* checkpoint_;
  QComboBox* schedule_;
  QSpinBox* stages_per_device_;
  QDoubleSpinBox* optimizer_;
  QSpinBox* devices_;
  QLineEdit* memory_;
  QLineEdit* bandwidth_;
  QLabel* problem_;
};

}  // namespace pipetune::gui
