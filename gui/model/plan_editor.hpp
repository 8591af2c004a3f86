#pragma once

// The plan being tuned and its prediction. Holds the profile, the hardware (as loaded, plus the
// user's edits), the plan, one Simulator for the profile and hardware, and the latest result.
// Every edit re-simulates at once. The Simulator lives until the profile or the hardware change:
// it caches the task graph of the plan's shape, so moving a boundary or typing a balance
// re-runs the cached graph with new durations instead of building one.

#include <QObject>
#include <QString>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "gui/model/hardware_edits.hpp"
#include "sim/hardware.hpp"
#include "sim/interval.hpp"
#include "sim/plan.hpp"
#include "sim/profile.hpp"
#include "sim/simulator.hpp"

namespace pipetune::gui {

class PlanEditor : public QObject {
  Q_OBJECT

 public:
  explicit PlanEditor(QObject* parent = nullptr);
  ~PlanEditor() override;

  bool has_profile() const { return profile_ != nullptr; }
  /// A new profile: the hardware becomes `hardware`, or copies of the profile's device (one per
  /// stage, ideal links); the plan a time-balanced one on those devices.
  void open_profile(Profile profile, std::optional<Hardware> hardware = std::nullopt);
  /// New hardware for the current profile; the plan is kept when it still fits the hardware,
  /// else re-balanced over its devices.
  void open_hardware(Hardware hardware);

  /// Each returns an empty string on success, else why the edit was refused (the plan and the
  /// prediction stay as they were).
  QString apply_plan(const Plan& plan);
  QString set_balance(const std::vector<int>& balance);
  void move_boundary(int boundary, int gap);
  QString set_chunks(int chunks);
  void set_checkpoint(CheckpointMode mode);
  /// A multi-stage schedule runs stages_per_device × devices stages: 2 per device when coming
  /// from a single-stage schedule, else as before (zbv: always 2); the layers are re-balanced
  /// when the stage count changes.
  QString set_schedule(ScheduleKind kind);
  /// Stages per device for a multi-stage schedule (1 is the only choice for the others); the
  /// layers are re-balanced over the new stages.
  QString set_stages_per_device(int stages_per_device);
  void set_optimizer_state_factor(double factor);
  /// The balance that minimises the busiest device's compute, for the current stages.
  QString even_out();
  /// stages_per_device stages per device, the layers time-balanced over them.
  QString set_device_count(int count);
  void set_memory_per_device(std::int64_t bytes);  ///< 0: unknown, no limit
  void set_link_bandwidth(double bytes_per_s);     ///< infinity: ideal

  const Profile& profile() const { return *profile_; }
  const Hardware& hardware() const { return *hardware_; }
  bool hardware_from_file() const { return hardware_from_file_; }
  const HardwareEdits& edits() const { return edits_; }
  const Plan& plan() const { return plan_; }
  const SimulationResult& result() const { return result_; }
  /// The prediction's 80 % interval (not known() without spreads or the hardware's model error).
  const IterationInterval& interval() const { return interval_; }
  const Simulator& simulator() const { return *simulator_; }
  /// Simulators made so far; a balance edit makes none.
  std::uint64_t simulators_built() const { return simulators_built_; }
  /// The memory every device has, or -1 when they differ.
  std::int64_t memory_per_device() const;
  /// Each layer's forward + backward time at the plan's micro-batch size.
  std::vector<double> layer_ms() const;
  /// Each stage's forward + backward task time at that size where the profile has launch times
  /// (a launch-bound stage takes longer than its layers' sum); empty without them.
  std::vector<double> stage_ms() const;
  /// Wall-clock time of the last re-simulation.
  double last_simulation_wall_ms() const { return last_wall_ms_; }

 signals:
  void profile_changed();
  void hardware_changed();
  void plan_changed();
  /// A new prediction is in result().
  void simulated();

 private:
  void rebuild_hardware();
  QString commit(Plan plan);
  QString restage(Plan plan, int devices);
  int programmes() const;  // devices the plan runs on (stages / stages_per_device)
  void simulate();
  std::vector<int> balanced(int stages, const Plan& shape) const;

  IterationInterval interval_;
  std::unique_ptr<Profile> profile_;
  Hardware base_hardware_;
  bool hardware_from_file_ = false;
  HardwareEdits edits_;
  // The Simulator keeps references to both: they live on the heap and change only together.
  std::unique_ptr<Hardware> hardware_;
  std::unique_ptr<Simulator> simulator_;
  std::uint64_t simulators_built_ = 0;
  Plan plan_;
  SimulationResult result_;
  double last_wall_ms_ = 0.0;
};

}  // namespace pipetune::gui
