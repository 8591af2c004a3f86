#pragma once

// Prediction against measurement, in numbers: iteration time and each device's peak memory,
// predicted and measured, with errors as signed fractions ((predicted − measured) / measured,
// as `pipetune validate` writes them), and how well the tasks matched.

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "gui/model/timeline_model.hpp"
#include "sim/plan.hpp"

namespace pipetune::gui {

/// (predicted − measured) / measured; NaN when nothing was measured.
double relative_error(double predicted, double measured);

struct DeviceComparison {
  std::string name;
  std::int64_t capacity_bytes = 0;
  std::int64_t predicted_peak_bytes = 0;
  std::int64_t measured_peak_bytes = -1;  ///< -1: not measured
  double error = std::numeric_limits<double>::quiet_NaN();
};

struct OverlaySummary {
  bool has_measured = false;
  double predicted_ms = 0.0;
  /// The prediction's 80 % interval; NaN where there is none (a profile without spreads).
  double predicted_low_ms = std::numeric_limits<double>::quiet_NaN();
  double predicted_high_ms = std::numeric_limits<double>::quiet_NaN();
  double measured_ms = 0.0;  ///< the shown step, first task start to last task end
  double time_error = std::numeric_limits<double>::quiet_NaN();
  std::vector<DeviceComparison> devices;
  int matched_tasks = 0;
  int unmatched_predicted = 0;
  int unmatched_measured = 0;
  int dropped_measured = 0;
  /// Median of |error| over matched compute tasks (copies are often too short to time well).
  double median_abs_task_error = std::numeric_limits<double>::quiet_NaN();
  /// The measured trace ran another plan than the current one (its plan, described).
  std::optional<std::string> other_plan;
};

OverlaySummary summarize(const TimelineModel& model, const Plan* current_plan);

}  // namespace pipetune::gui
