#include "gui/model/timeline_model.hpp"

#include <algorithm>
#include <cmath>

#include "gui/model/text_format.hpp"

namespace pipetune::gui {

namespace {

bool earlier(const std::vector<TimelineTask>& tasks, int a, int b) {
  return tasks[a].start_ms < tasks[b].start_ms;
}

// The predicted side of a row, from a simulated device or a predicted trace's (same fields).
template <typename Device>
void set_predicted_row(TimelineRow& row, const Device& d) {
  row.name = d.name;
  row.stages = d.stages;
  row.capacity_bytes = d.memory_capacity_bytes;
  row.predicted_peak_bytes = d.peak_memory_bytes;
  row.worst_order_peak_bytes = d.worst_order_peak_bytes;
  row.predicted_memory = d.memory;
}

}  // namespace

std::string TimelineTask::label() const {
  return task_label(kind, stage, micro_batch);
}

double TimelineModel::extent_ms() const {
  double extent = std::max(predicted_ms_, measured_ms_);
  if (interval_) extent = std::max(extent, interval_->second);
  for (const auto& series : tasks_) {
    for (const auto& t : series) extent = std::max(extent, t.end_ms);
  }
  return extent;
}

int TimelineModel::unmatched(Series s) const {
  int count = 0;
  for (const auto& t : tasks(s)) count += t.match < 0 && t.row >= 0 ? 1 : 0;
  return count;
}

void TimelineModel::set_predicted_interval(double low_ms, double high_ms) {
  interval_ = std::pair{low_ms, high_ms};
  changed();
}

void TimelineModel::set_prediction(const SimulationResult& result) {
  has_prediction_ = true;
  interval_.reset();
  predicted_ms_ = result.iteration_ms;
  micro_batches_ = static_cast<int>(result.micro_batch_sizes.size());
  rows_.resize(result.devices.size());
  int max_index = 0;
  for (const auto& d : result.devices) max_index = std::max(max_index, d.index);
  std::vector<int> row_of(static_cast<std::size_t>(max_index) + 1, -1);
  for (std::size_t r = 0; r < result.devices.size(); ++r) {
    set_predicted_row(rows_[r], result.devices[r]);
    row_of[result.devices[r].index] = static_cast<int>(r);
  }
  auto& predicted = tasks_[0];
  predicted.resize(result.tasks.size());
  for (std::size_t k = 0; k < result.tasks.size(); ++k) {
    const SimTask& s = result.tasks[k];
    TimelineTask& t = predicted[k];
    t.kind = s.kind;
    t.stage = s.stage;
    t.micro_batch = s.micro_batch;
    t.row = row_of[s.device];
    t.peer_row = s.peer >= 0 ? row_of[s.peer] : -1;
    t.start_ms = s.start_ms;
    t.end_ms = s.end_ms;
    t.bytes = s.bytes;
  }
  rebuild_measured();
  rebuild_lanes();
  match();
  changed();
}

void TimelineModel::set_prediction(const Trace& trace) {
  has_prediction_ = true;
  rows_.resize(trace.devices.size());
  for (std::size_t r = 0; r < trace.devices.size(); ++r)
    set_predicted_row(rows_[r], trace.devices[r]);
  auto& predicted = tasks_[0];
  predicted.clear();
  predicted_ms_ = trace.iteration_ms;
  interval_.reset();
  micro_batches_ = static_cast<int>(trace.micro_batch_sizes.size());
  for (const TraceTask& s : trace.tasks) {
    TimelineTask t;
    t.kind = s.kind;
    t.stage = s.stage;
    t.micro_batch = s.micro_batch;
    t.row = s.device;
    t.peer_row = s.peer;
    t.start_ms = s.start_ms;
    t.end_ms = s.end_ms;
    t.bytes = s.bytes;
    predicted.push_back(t);
    predicted_ms_ = std::max(predicted_ms_, t.end_ms);
    micro_batches_ = std::max(micro_batches_, t.micro_batch + 1);
  }
  rebuild_measured();
  rebuild_lanes();
  match();
  changed();
}

void TimelineModel::clear_prediction() {
  has_prediction_ = false;
  interval_.reset();
  predicted_ms_ = 0.0;
  tasks_[0].clear();
  rows_.clear();
  rebuild_measured();
  rebuild_lanes();
  match();
  changed();
}

void TimelineModel::set_measured(std::shared_ptr<const Trace> measured, int step) {
  measured_ = std::move(measured);
  steps_.clear();
  tasks_[1].clear();
  measured_ms_ = 0.0;
  measured_offset_ms_ = 0.0;
  if (measured_) {
    steps_ = trace_steps(*measured_);
    step_ = steps_.empty() ? 0 : steps_.back();
    if (step >= 0 && std::binary_search(steps_.begin(), steps_.end(), step)) step_ = step;
    measured_step_tasks_ = StepTasks(measured_->tasks, step_, "the measured trace");
    // Align the step at its first task: the prediction starts at 0.
    measured_offset_ms_ = measured_step_tasks_.span().start_ms;
    measured_ms_ = measured_step_tasks_.span().duration_ms();
    for (int k : measured_step_tasks_.indices()) {
      const TraceTask& s = measured_->tasks[k];
      TimelineTask t;
      t.kind = s.kind;
      t.stage = s.stage;
      t.micro_batch = s.micro_batch;
      t.row = s.device;  // a pid until rebuild_measured maps it to a row
      t.peer_row = s.peer;
      t.start_ms = s.start_ms - measured_offset_ms_;
      t.end_ms = s.end_ms - measured_offset_ms_;
      t.bytes = s.bytes;
      t.cpu_ms = s.cpu_ms;
      tasks_[1].push_back(t);
    }
  } else {
    measured_step_tasks_ = {};
  }
  measured_pid_.resize(tasks_[1].size());
  measured_peer_pid_.resize(tasks_[1].size());
  for (std::size_t k = 0; k < tasks_[1].size(); ++k) {
    measured_pid_[k] = tasks_[1][k].row;
    measured_peer_pid_[k] = tasks_[1][k].peer_row;
  }
  rebuild_measured();
  rebuild_lanes();
  match();
  changed();
}

void TimelineModel::changed() {
  ++revision_;
  listeners_.notify();
}

void TimelineModel::clear_measured() {
  set_measured(nullptr);
}

void TimelineModel::rebuild_measured() {
  dropped_measured_ = 0;
  for (auto& row : rows_) {
    row.measured_peak_bytes = -1;
    row.measured_memory.clear();
  }
  if (!measured_) {
    if (!has_prediction_) rows_.clear();
    return;
  }
  const auto& devices = measured_->devices;
  if (!has_prediction_) {
    // Nothing predicted: the measured trace's devices are the rows.
    rows_.resize(devices.size());
    for (std::size_t r = 0; r < devices.size(); ++r) {
      rows_[r].name = devices[r].name;
      rows_[r].stages = devices[r].stages;
      rows_[r].capacity_bytes = devices[r].memory_capacity_bytes;
      rows_[r].predicted_peak_bytes = 0;
      rows_[r].worst_order_peak_bytes = 0;
      rows_[r].predicted_memory.clear();
    }
  }
  // Devices are matched by name; when no name matches and the counts agree (a run on other
  // hardware names), by position.
  std::vector<int> row_of(devices.size(), -1);
  bool any_name = false;
  for (std::size_t p = 0; p < devices.size(); ++p) {
    for (std::size_t r = 0; r < rows_.size(); ++r) {
      if (rows_[r].name == devices[p].name) {
        row_of[p] = static_cast<int>(r);
        any_name = true;
        break;
      }
    }
  }
  if (!any_name && devices.size() == rows_.size()) {
    for (std::size_t p = 0; p < devices.size(); ++p) row_of[p] = static_cast<int>(p);
  }

  for (std::size_t p = 0; p < devices.size(); ++p) {
    if (row_of[p] < 0) continue;
    TimelineRow& row = rows_[row_of[p]];
    const TraceDevice& d = devices[p];
    // The level when the step starts, then the step's samples, shifted like the tasks.
    std::int64_t level = 0, peak = 0;
    bool started = false;
    for (const CounterSample& s : d.memory) {
      peak = std::max(peak, s.value);
      const double t = s.time - measured_offset_ms_;
      if (t < 0) {
        level = s.value;
        continue;
      }
      if (t > measured_ms_ + 1e-9) continue;
      if (!started && t > 0) row.measured_memory.push_back({0.0, level});
      started = true;
      row.measured_memory.push_back({t, s.value});
    }
    if (!started && !d.memory.empty()) row.measured_memory.push_back({0.0, level});
    // The summary's peak is what the executor measured over the run; the samples are a
    // fallback for traces that only have counters.
    row.measured_peak_bytes = d.peak_memory_bytes > 0 ? d.peak_memory_bytes : peak;
  }
  auto& measured = tasks_[1];
  for (std::size_t k = 0; k < measured.size(); ++k) {
    const int pid = measured_pid_[k];
    const int peer = measured_peer_pid_[k];
    measured[k].row = pid >= 0 && pid < static_cast<int>(row_of.size()) ? row_of[pid] : -1;
    measured[k].peer_row = peer >= 0 && peer < static_cast<int>(row_of.size()) ? row_of[peer] : -1;
    if (measured[k].row < 0 || (measured[k].is_copy() && measured[k].peer_row < 0)) {
      measured[k].row = -1;
      ++dropped_measured_;
    }
  }
}

void TimelineModel::rebuild_lanes() {
  const int rows = static_cast<int>(rows_.size());
  lane_of_copy_.assign(static_cast<std::size_t>(rows) * rows, -1);
  for (const auto& series : tasks_) {
    for (const auto& t : series) {
      if (t.row >= 0 && t.is_copy() && t.peer_row >= 0)
        lane_of_copy_[t.row * rows + t.peer_row] = 0;
    }
  }
  int lane_count = 0;
  for (int r = 0; r < rows; ++r) {
    rows_[r].first_lane = lane_count++;
    for (int p = 0; p < rows; ++p) {
      if (lane_of_copy_[r * rows + p] == 0) lane_of_copy_[r * rows + p] = lane_count++;
    }
    rows_[r].lane_count = lane_count - rows_[r].first_lane;
  }
  lanes_.resize(lane_count);
  for (int r = 0; r < rows; ++r) {
    TimelineLane& compute = lanes_[rows_[r].first_lane];
    compute.row = r, compute.copy = false, compute.peer_row = -1;
    for (int p = 0; p < rows; ++p) {
      const int l = lane_of_copy_[r * rows + p];
      if (l >= 0) lanes_[l].row = r, lanes_[l].copy = true, lanes_[l].peer_row = p;
    }
  }
  for (auto& lane : lanes_) lane.tasks[0].clear(), lane.tasks[1].clear();
  for (int s = 0; s < 2; ++s) {
    auto& series = tasks_[s];
    for (std::size_t k = 0; k < series.size(); ++k) {
      TimelineTask& t = series[k];
      if (t.row < 0) {
        t.lane = -1;
        continue;
      }
      t.lane = t.is_copy() ? lane_of_copy_[t.row * rows + t.peer_row] : rows_[t.row].first_lane;
      lanes_[t.lane].tasks[s].push_back(static_cast<int>(k));
    }
    for (auto& lane : lanes_) {
      auto& list = lane.tasks[s];
      auto by_start = [&series](int a, int b) { return earlier(series, a, b); };
      if (!std::is_sorted(list.begin(), list.end(), by_start)) {
        std::stable_sort(list.begin(), list.end(), by_start);
      }
    }
  }
}

void TimelineModel::match() {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  for (auto& series : tasks_) {
    for (auto& t : series) t.match = -1, t.error = kNaN;
  }
  auto& predicted = tasks_[0];
  auto& measured = tasks_[1];
  if (measured.empty()) return;
  for (std::size_t k = 0; k < predicted.size(); ++k) {
    TimelineTask& p = predicted[k];
    // Measured tasks are the step's, in the step's order: a position is an index here.
    const int position = measured_step_tasks_.find(TaskKey::of(p));
    if (position < 0) continue;
    TimelineTask& m = measured[position];
    if (m.row < 0) continue;
    p.match = position;
    m.match = static_cast<int>(k);
    const double measured_ms = m.duration_ms();
    const double error = measured_ms > 0 ? (p.duration_ms() - measured_ms) / measured_ms : kNaN;
    p.error = m.error = error;
  }
}

std::optional<TaskRef> TimelineModel::hit(int lane, double ms, double tolerance_ms) const {
  if (lane < 0 || lane >= static_cast<int>(lanes_.size())) return std::nullopt;
  std::optional<TaskRef> nearest;
  double nearest_distance = tolerance_ms;
  for (Series s : {Series::Predicted, Series::Measured}) {
    const auto& list = lanes_[lane].of(s);
    const auto& series = tasks(s);
    // The last task starting at or before `ms`: tasks on one stream do not overlap.
    auto it = std::upper_bound(list.begin(), list.end(), ms,
                               [&series](double t, int k) { return t < series[k].start_ms; });
    if (it != list.begin()) {
      const TimelineTask& before = series[*(it - 1)];
      if (ms <= before.end_ms) return TaskRef{s, *(it - 1)};
      if (ms - before.end_ms < nearest_distance) {
        nearest_distance = ms - before.end_ms;
        nearest = TaskRef{s, *(it - 1)};
      }
    }
    if (it != list.end() && series[*it].start_ms - ms < nearest_distance) {
      nearest_distance = series[*it].start_ms - ms;
      nearest = TaskRef{s, *it};
    }
  }
  return nearest;
}

QString describe_task(const TimelineModel& model, TaskRef ref) {
  const TimelineTask& t = model.task(ref);
  const auto& rows = model.rows();
  auto row_name = [&rows](int r) {
    return r >= 0 && r < static_cast<int>(rows.size()) ? QString::fromStdString(rows[r].name)
                                                       : QStringLiteral("?");
  };
  QString text = QStringLiteral("<b>%1</b> · %2 (%3)")
                     .arg(QString::fromStdString(t.label()),
                          QString::fromUtf8(to_string(t.kind).data(),
                                            static_cast<int>(to_string(t.kind).size())),
                          ref.series == Series::Predicted ? QStringLiteral("predicted")
                                                          : QStringLiteral("measured"));
  if (t.is_copy()) {
    text += QStringLiteral("<br>stage %1 · micro-batch %2 · %3 → %4 · %5")
                .arg(t.stage)
                .arg(t.micro_batch)
                .arg(row_name(t.row), row_name(t.peer_row), format_size(t.bytes));
  } else {
    text += QStringLiteral("<br>stage %1 · micro-batch %2 · %3")
                .arg(t.stage)
                .arg(t.micro_batch)
                .arg(row_name(t.row));
  }
  text += QStringLiteral("<br>start %1 · duration %2")
              .arg(format_duration(t.start_ms), format_duration(t.duration_ms()));
  if (t.cpu_ms >= 0 && t.duration_ms() > 0) {
    // The rest of the task its thread waited for a core.
    text += QStringLiteral("<br>on a core %1 of it (%2 %)")
                .arg(format_duration(t.cpu_ms))
                .arg(100.0 * t.cpu_ms / t.duration_ms(), 0, 'f', 0);
  }
  if (t.match >= 0) {
    const Series other = ref.series == Series::Predicted ? Series::Measured : Series::Predicted;
    const TimelineTask& o = model.task({other, t.match});
    text += QStringLiteral("<br>%1: start %2 · duration %3")
                .arg(other == Series::Measured ? QStringLiteral("measured")
                                               : QStringLiteral("predicted"),
                     format_duration(o.start_ms), format_duration(o.duration_ms()));
    text += QStringLiteral("<br>error (predicted − measured) / measured: %1")
                .arg(format_error(t.error));
  } else if (model.has_measured() && model.has_prediction()) {
    text += QStringLiteral("<br><i>no matching %1 task</i>")
                .arg(ref.series == Series::Predicted ? QStringLiteral("measured")
                                                     : QStringLiteral("predicted"));
  }
  return text;
}

std::vector<TaskKind> legend_kinds(const TimelineModel& model) {
  bool has[2] = {false, false};  // InputGrad, WeightGrad
  for (Series series : {Series::Predicted, Series::Measured}) {
    for (const TimelineTask& t : model.tasks(series)) {
      if (t.kind == TaskKind::InputGrad) has[0] = true;
      if (t.kind == TaskKind::WeightGrad) has[1] = true;
    }
  }
  std::vector<TaskKind> kinds = {TaskKind::Forward, TaskKind::Recompute, TaskKind::Backward};
  if (has[0]) kinds.push_back(TaskKind::InputGrad);
  if (has[1]) kinds.push_back(TaskKind::WeightGrad);
  kinds.push_back(TaskKind::SendActivation);
  return kinds;
}

}  // namespace pipetune::gui
