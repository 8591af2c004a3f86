#pragma once

// Where the timeline's rows and lanes sit vertically. A row per device: its compute lane, then
// its copy lanes, thinner. Lanes grow or shrink (within limits) to use the height there is;
// below the minimum the content is taller than the view and the view scrolls.

#include <vector>

namespace pipetune::gui {

class TimelineModel;

struct Band {
  double top = 0.0;
  double height = 0.0;
  double bottom() const { return top + height; }
  bool contains(double y) const { return y >= top && y < top + height; }
};

struct LaneMetrics {
  double row_gap = 6.0;      ///< between two device rows
  double row_padding = 4.0;  ///< inside a row, above its first and below its last lane
  double lane_gap = 2.0;     ///< between lanes of one row
  double compute_height = 24.0;
  double copy_height = 11.0;
  double min_scale = 0.45;  ///< lanes never thinner than this share of their natural height
  double max_scale = 2.0;
};

class LaneLayout {
 public:
  /// Lays out the model's rows from y = `top`, fitting `available_height` when it can.
  void build(const TimelineModel& model, double top, double available_height,
             const LaneMetrics& metrics = {});

  const Band& lane(int index) const { return lanes_[index]; }
  const Band& row(int index) const { return rows_[index]; }
  int lane_count() const { return static_cast<int>(lanes_.size()); }
  int row_count() const { return static_cast<int>(rows_.size()); }
  /// The lane under y, -1 in the gaps between lanes and rows.
  int lane_at(double y) const;
  /// The row under y (its padding included), -1 between rows.
  int row_at(double y) const;
  double top() const { return top_; }
  double content_height() const { return content_height_; }
  double scale() const { return scale_; }

 private:
  std::vector<Band> lanes_, rows_;
  double top_ = 0.0;
  double content_height_ = 0.0;
  double scale_ = 1.0;
};

}  // namespace pipetune::gui
