#pragma once

// What the timeline shows: one row per device, lanes within a row (its compute stream, then one
// copy stream per peer it sends to), the predicted tasks and, when a measured trace is open, the
// measured ones of one training step, aligned at that step's start and matched task by task to
// the prediction. Rebuilt on every edit, so it reuses its buffers and does no string work.

#include <QString>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gui/model/listeners.hpp"
#include "sim/simulator.hpp"
#include "sim/trace.hpp"

namespace pipetune::gui {

enum class Series : std::uint8_t { Predicted = 0, Measured = 1 };

struct TaskRef {
  Series series = Series::Predicted;
  int index = -1;
  bool operator==(const TaskRef&) const = default;
};

struct TimelineTask {
  TaskKind kind = TaskKind::Forward;
  int stage = 0;
  int micro_batch = 0;
  int row = 0;            ///< device row
  int lane = 0;           ///< index into TimelineModel::lanes()
  int peer_row = -1;      ///< copies: the receiving device's row
  double start_ms = 0.0;  ///< from the start of the (aligned) iteration
  double end_ms = 0.0;
  std::int64_t bytes = 0;
  double cpu_ms = -1.0;  ///< measured: its thread's CPU time in it (TraceTask::cpu_ms), or -1
  int match = -1;        ///< the same task in the other series, -1 when it has none
  /// (predicted − measured) / measured duration, on both tasks of a matched pair; NaN otherwise.
  double error = std::numeric_limits<double>::quiet_NaN();

  double duration_ms() const { return end_ms - start_ms; }
  bool is_copy() const { return !is_compute(kind); }
  std::string label() const;  ///< IR form: "2F0", "2>3 act 0"
};

struct TimelineRow {
  std::string name;
  std::vector<int> stages;
  int first_lane = 0;
  int lane_count = 0;
  std::int64_t capacity_bytes = 0;  ///< 0: unknown
  std::int64_t predicted_peak_bytes = 0;
  /// The predicted peak in the worst arrival order the schedule allows; 0: not known.
  std::int64_t worst_order_peak_bytes = 0;
  std::int64_t measured_peak_bytes = -1;        ///< -1: nothing measured on this device
  std::vector<CounterSample> predicted_memory;  ///< ms from iteration start -> bytes
  std::vector<CounterSample> measured_memory;   ///< aligned like the measured tasks

  bool fits() const { return capacity_bytes == 0 || predicted_peak_bytes <= capacity_bytes; }
};

struct TimelineLane {
  int row = 0;
  bool copy = false;
  int peer_row = -1;          ///< copy lanes: where the copies go
  std::vector<int> tasks[2];  ///< per Series, sorted by start

  const std::vector<int>& of(Series s) const { return tasks[static_cast<int>(s)]; }
};

class TimelineModel {
 public:
  /// The prediction of the current plan (needs record_tasks; record_memory for the curves).
  void set_prediction(const SimulationResult& result);
  /// A predicted trace opened from a file (no profile needed).
  void set_prediction(const Trace& predicted);
  void clear_prediction();

  /// A measured trace to overlay; `step` picks the training step (-1: the last one, which is
  /// the warmest). The trace is kept.
  void set_measured(std::shared_ptr<const Trace> measured, int step = -1);
  void clear_measured();

  bool has_prediction() const { return has_prediction_; }
  bool has_measured() const { return measured_ != nullptr; }
  const Trace* measured_trace() const { return measured_.get(); }
  const std::vector<int>& measured_steps() const { return steps_; }
  int measured_step() const { return step_; }
  /// Where the shown step starts in the measured trace's own clock; subtracted to align it.
  double measured_offset_ms() const { return measured_offset_ms_; }

  double predicted_ms() const { return predicted_ms_; }
  /// The prediction's 80 % interval (sim/interval.hpp), drawn as a band at the iteration's end;
  /// cleared with the prediction and by a predicted trace (which has none).
  void set_predicted_interval(double low_ms, double high_ms);
  std::optional<std::pair<double, double>> predicted_interval() const { return interval_; }
  double measured_ms() const { return measured_ms_; }  ///< span of the shown step
  /// Both series fit in [0, extent_ms].
  double extent_ms() const;
  int micro_batches() const { return micro_batches_; }

  const std::vector<TimelineRow>& rows() const { return rows_; }
  const std::vector<TimelineLane>& lanes() const { return lanes_; }
  const std::vector<TimelineTask>& tasks(Series s) const { return tasks_[static_cast<int>(s)]; }
  const TimelineTask& task(TaskRef ref) const { return tasks(ref.series)[ref.index]; }

  int unmatched(Series s) const;
  /// Measured tasks left out: on devices the prediction does not have.
  int dropped_measured() const { return dropped_measured_; }

  /// The task under time `ms` in `lane`, else the nearest one within `tolerance_ms`. Predicted
  /// wins over measured where both are under the point (the tooltip shows the pair).
  std::optional<TaskRef> hit(int lane, double ms, double tolerance_ms) const;

  /// Bumped on every rebuild, so views know their caches are stale.
  std::uint64_t revision() const { return revision_; }

  /// `listener` runs after every rebuild, so views follow the model by themselves instead of
  /// being told by whoever changed it, for as long as the returned handle lives.
  [[nodiscard]] Listeners::Subscription subscribe(std::function<void()> listener) const {
    return listeners_.add(std::move(listener));
  }

 private:
  void rebuild_measured();
  void rebuild_lanes();
  void match();
  void changed();  // a new revision: tell the listeners

  bool has_prediction_ = false;
  std::optional<std::pair<double, double>> interval_;
  double predicted_ms_ = 0.0;
  double measured_ms_ = 0.0;
  int micro_batches_ = 0;
  std::vector<TimelineRow> rows_;
  std::vector<TimelineLane> lanes_;
  std::vector<TimelineTask> tasks_[2];

  std::shared_ptr<const Trace> measured_;
  std::vector<int> steps_;
  int step_ = 0;
  double measured_offset_ms_ = 0.0;
  int dropped_measured_ = 0;
  StepTasks measured_step_tasks_;  // the shown step's tasks, matched to the prediction by key
  std::vector<int> measured_pid_, measured_peer_pid_;  // the trace's device of each measured task

  std::vector<int> lane_of_copy_;  // scratch: row * rows + peer -> lane
  std::uint64_t revision_ = 0;
  Listeners listeners_;
};

/// The task kinds the timeline's legend names, in its order: forward, recompute, backward, then
/// input- and weight-gradient only when a series has them (zero-bubble schedules), then copies.
std::vector<TaskKind> legend_kinds(const TimelineModel& model);

/// Tooltip text for a task: what it is, where, when, and for a matched pair the other side and
/// the error.
QString describe_task(const TimelineModel& model, TaskRef ref);

}  // namespace pipetune::gui
