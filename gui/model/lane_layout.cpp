#include "gui/model/lane_layout.hpp"

#include <algorithm>
#include <cmath>

#include "gui/model/timeline_model.hpp"

namespace pipetune::gui {

void LaneLayout::build(const TimelineModel& model, double top, double available_height,
                       const LaneMetrics& m) {
  const auto& model_rows = model.rows();
  const auto& model_lanes = model.lanes();
  top_ = top;
  rows_.assign(model_rows.size(), {});
  lanes_.assign(model_lanes.size(), {});

  // Fixed space (gaps, padding) and lane space at natural size.
  double fixed = 0.0, natural = 0.0;
  for (std::size_t r = 0; r < model_rows.size(); ++r) {
    if (r > 0) fixed += m.row_gap;
    fixed += 2 * m.row_padding + std::max(0, model_rows[r].lane_count - 1) * m.lane_gap;
  }
  for (const auto& lane : model_lanes) natural += lane.copy ? m.copy_height : m.compute_height;
  scale_ = natural > 0 ? std::clamp((available_height - fixed) / natural, m.min_scale, m.max_scale)
                       : 1.0;

  double y = top;
  for (std::size_t r = 0; r < model_rows.size(); ++r) {
    if (r > 0) y += m.row_gap;
    const double row_top = y;
    y += m.row_padding;
    const int first = model_rows[r].first_lane;
    for (int l = first; l < first + model_rows[r].lane_count; ++l) {
      if (l > first) y += m.lane_gap;
      // Whole pixels, so that bars have crisp edges and equal lanes look equal.
      const double height = std::max(
          2.0, std::round((model_lanes[l].copy ? m.copy_height : m.compute_height) * scale_));
      lanes_[l] = {y, height};
      y += height;
    }
    y += m.row_padding;
    rows_[r] = {row_top, y - row_top};
  }
  content_height_ = y - top;
}

int LaneLayout::lane_at(double y) const {
  // Lanes are in increasing y: the last one starting at or above y.
  auto it = std::upper_bound(lanes_.begin(), lanes_.end(), y,
                             [](double value, const Band& b) { return value < b.top; });
  if (it == lanes_.begin()) return -1;
  --it;
  return it->contains(y) ? static_cast<int>(it - lanes_.begin()) : -1;
}

int LaneLayout::row_at(double y) const {
  auto it = std::upper_bound(rows_.begin(), rows_.end(), y,
                             [](double value, const Band& b) { return value < b.top; });
  if (it == rows_.begin()) return -1;
  --it;
  return it->contains(y) ? static_cast<int>(it - rows_.begin()) : -1;
}

}  // namespace pipetune::gui
