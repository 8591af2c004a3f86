#include "gui/model/overlay_summary.hpp"

#include <algorithm>
#include <cmath>

namespace pipetune::gui {

double relative_error(double predicted, double measured) {
  if (!(measured > 0)) return std::numeric_limits<double>::quiet_NaN();
  return (predicted - measured) / measured;
}

OverlaySummary summarize(const TimelineModel& model, const Plan* current_plan) {
  OverlaySummary s;
  s.has_measured = model.has_measured();
  s.predicted_ms = model.predicted_ms();
  if (const auto interval = model.predicted_interval()) {
    s.predicted_low_ms = interval->first;
    s.predicted_high_ms = interval->second;
  }
  s.measured_ms = model.measured_ms();
  if (s.has_measured && model.has_prediction())
    s.time_error = relative_error(s.predicted_ms, s.measured_ms);
  for (const TimelineRow& row : model.rows()) {
    DeviceComparison d;
    d.name = row.name;
    d.capacity_bytes = row.capacity_bytes;
    d.predicted_peak_bytes = row.predicted_peak_bytes;
    d.measured_peak_bytes = row.measured_peak_bytes;
    if (row.measured_peak_bytes >= 0 && model.has_prediction()) {
      d.error = relative_error(static_cast<double>(row.predicted_peak_bytes),
                               static_cast<double>(row.measured_peak_bytes));
    }
    s.devices.push_back(std::move(d));
  }
  if (!s.has_measured) return s;

  std::vector<double> errors;
  for (const TimelineTask& t : model.tasks(Series::Predicted)) {
    if (t.match < 0) continue;
    ++s.matched_tasks;
    if (!t.is_copy() && std::isfinite(t.error)) errors.push_back(std::fabs(t.error));
  }
  s.unmatched_predicted = model.unmatched(Series::Predicted);
  s.unmatched_measured = model.unmatched(Series::Measured);
  s.dropped_measured = model.dropped_measured();
  if (!errors.empty()) {
    const auto middle = errors.begin() + static_cast<std::ptrdiff_t>(errors.size() / 2);
    std::nth_element(errors.begin(), middle, errors.end());
    double median = *middle;
    if (errors.size() % 2 == 0) median = 0.5 * (median + *std::max_element(errors.begin(), middle));
    s.median_abs_task_error = median;
  }
  const Trace* measured = model.measured_trace();
  if (current_plan && measured->plan && !(*measured->plan == *current_plan)) {
    s.other_plan = describe_plan(*measured->plan);
  }
  return s;
}

}  // namespace pipetune::gui
