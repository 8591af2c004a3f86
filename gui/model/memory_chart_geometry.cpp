#include "gui/model/memory_chart_geometry.hpp"

#include <algorithm>
#include <cmath>

namespace pipetune::gui {

void MemoryChartGeometry::build(const TimelineModel& model, double top, double height, double gap,
                                double min_height) {
  const auto& rows = model.rows();
  plots_.assign(rows.size(), {});
  const double n = static_cast<double>(rows.size());
  const double each = n > 0 ? std::max(min_height, std::floor((height - gap * (n - 1)) / n)) : 0.0;
  double y = top;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const TimelineRow& row = rows[r];
    double largest =
        static_cast<double>(std::max({row.capacity_bytes, row.predicted_peak_bytes,
                                      row.worst_order_peak_bytes, row.measured_peak_bytes}));
    for (const auto& s : row.measured_memory)
      largest = std::max(largest, static_cast<double>(s.value));
    plots_[r] = {{y, each}, largest > 0 ? largest * kHeadroom : 1.0};
    y += each + gap;
  }
  content_height_ = rows.empty() ? 0.0 : y - gap - top;
}

double MemoryChartGeometry::to_y(int row, double bytes) const {
  const Plot& p = plots_[row];
  return p.band.bottom() - bytes / p.top_bytes * p.band.height;
}

double MemoryChartGeometry::to_bytes(int row, double y) const {
  const Plot& p = plots_[row];
  return (p.band.bottom() - y) / p.band.height * p.top_bytes;
}

int MemoryChartGeometry::plot_at(double y) const {
  for (std::size_t r = 0; r < plots_.size(); ++r) {
    if (plots_[r].band.contains(y)) return static_cast<int>(r);
  }
  return -1;
}

std::vector<MemoryChartGeometry::Column> MemoryChartGeometry::columns(
    const std::vector<CounterSample>& samples, const TimeAxis& axis, int columns, double end_ms) {
  std::vector<Column> out(static_cast<std::size_t>(std::max(columns, 0)));
  if (samples.empty() || columns <= 0) return out;
  // The last sample at or before the first column's start (-1: the curve has not begun).
  const double first_start = axis.to_ms(axis.left());
  auto it = std::upper_bound(samples.begin(), samples.end(), first_start,
                             [](double t, const CounterSample& s) { return t < s.time; });
  std::ptrdiff_t current = (it - samples.begin()) - 1;
  const std::ptrdiff_t count = static_cast<std::ptrdiff_t>(samples.size());
  for (int c = 0; c < columns; ++c) {
    const double start = axis.to_ms(axis.left() + c);
    const double end = axis.to_ms(axis.left() + c + 1);
    if (start > end_ms) break;
    Column& column = out[c];
    // Samples at the column's very start set the value it starts with.
    while (current + 1 < count && samples[current + 1].time <= start) ++current;
    if (current >= 0) {
      column.drawn = true;
      column.low = column.high = column.last = samples[current].value;
    }
    while (current + 1 < count && samples[current + 1].time < end) {
      const std::int64_t v = samples[++current].value;
      if (!column.drawn) {
        column.drawn = true;
        column.low = column.high = v;
      }
      column.low = std::min(column.low, v);
      column.high = std::max(column.high, v);
      column.last = v;
    }
  }
  return out;
}

}  // namespace pipetune::gui
