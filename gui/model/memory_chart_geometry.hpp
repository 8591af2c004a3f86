#pragma once

// The memory chart's geometry: one plot per device row, stacked, on the timeline's time axis.
// Each plot's vertical scale reaches a little above the largest of the device's capacity, its
// predicted peak and its measured peak, so the capacity line is always in view.

#include <cstdint>
#include <vector>

#include "gui/model/lane_layout.hpp"
#include "gui/model/time_axis.hpp"
#include "gui/model/timeline_model.hpp"

namespace pipetune::gui {

class MemoryChartGeometry {
 public:
  /// Plots share [top, top + height), separated by `gap` pixels, each at least `min_height`.
  void build(const TimelineModel& model, double top, double height, double gap = 6.0,
             double min_height = 36.0);

  int plot_count() const { return static_cast<int>(plots_.size()); }
  const Band& plot(int row) const { return plots_[row].band; }
  /// Bytes at the top of a row's plot.
  double top_bytes(int row) const { return plots_[row].top_bytes; }
  double to_y(int row, double bytes) const;
  double to_bytes(int row, double y) const;
  /// The row whose plot is under y, -1 between plots.
  int plot_at(double y) const;
  double content_height() const { return content_height_; }

  /// What a step curve (each value holds until the next sample) does within each of `columns`
  /// pixel columns from the axis's left edge: its lowest, highest and last value there. Columns
  /// before the first sample or after `end_ms` are not `drawn`. The chart draws one column at a
  /// time from this, so its cost follows its width, not the number of samples.
  struct Column {
    bool drawn = false;
    std::int64_t low = 0, high = 0, last = 0;
  };
  static std::vector<Column> columns(const std::vector<CounterSample>& samples,
                                     const TimeAxis& axis, int columns, double end_ms);

  static constexpr double kHeadroom = 1.12;

 private:
  struct Plot {
    Band band;
    double top_bytes = 1.0;
  };
  std::vector<Plot> plots_;
  double content_height_ = 0.0;
};

}  // namespace pipetune::gui
