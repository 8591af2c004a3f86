#include "gui/model/lane_layout.hpp"

#include <gtest/gtest.h>

#include "gui/model/timeline_model.hpp"
#include "tests/gui/gui_test_support.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune::gui {
namespace {

// Three devices, the middle one holding two stages; copy lanes where stages change device.
TimelineModel three_devices() {
  const Profile profile = pipetune::testing::uniform_profile(8, 1.0, 2.0, 8);
  Hardware hardware = replicate_device(profile.device, 3);
  Plan plan;
  plan.balance = {2, 2, 2, 2};
  plan.chunks = 4;
  plan.devices = {"cpu:0", "cpu:1", "cpu:1", "cpu:2"};
  TimelineModel model;
  model.set_prediction(testing::simulate_directly(profile, hardware, plan));
  return model;
}

void expect_well_formed(const TimelineModel& model, const LaneLayout& layout,
                        const LaneMetrics& m) {
  ASSERT_EQ(layout.row_count(), static_cast<int>(model.rows().size()));
  ASSERT_EQ(layout.lane_count(), static_cast<int>(model.lanes().size()));
  for (int r = 0; r < layout.row_count(); ++r) {
    const Band& row = layout.row(r);
    if (r > 0) {
      EXPECT_NEAR(row.top - layout.row(r - 1).bottom(), m.row_gap, 1e-9);
    }
    const TimelineRow& model_row = model.rows()[r];
    for (int l = model_row.first_lane; l < model_row.first_lane + model_row.lane_count; ++l) {
      const Band& lane = layout.lane(l);
      EXPECT_GE(lane.top, row.top + m.row_padding - 1e-9);
      EXPECT_LE(lane.bottom(), row.bottom() - m.row_padding + 1e-9);
      if (l > model_row.first_lane) {
        EXPECT_NEAR(lane.top - layout.lane(l - 1).bottom(), m.lane_gap, 1e-9);
      }
      EXPECT_EQ(layout.lane_at(lane.top), l);
      EXPECT_EQ(layout.lane_at(lane.top + lane.height / 2), l);
      EXPECT_EQ(layout.lane_at(lane.bottom() - 0.01), l);
      EXPECT_EQ(layout.lane_at(lane.bottom() + m.lane_gap / 2), -1);  // the gap below
      EXPECT_EQ(layout.row_at(lane.top + lane.height / 2), r);
      // A compute lane is the first of its row and taller than the copy lanes after it.
      EXPECT_EQ(model.lanes()[l].copy, l != model_row.first_lane);
      if (model.lanes()[l].copy) {
        EXPECT_LT(lane.height, layout.lane(model_row.first_lane).height);
      }
    }
  }
  EXPECT_EQ(layout.lane_at(layout.top() - 1), -1);
  EXPECT_NEAR(layout.content_height(), layout.row(layout.row_count() - 1).bottom() - layout.top(),
              1e-9);
}

TEST(LaneLayout, OneRowPerDeviceLanesInsideInOrder) {
  const TimelineModel model = three_devices();
  // cpu:0 sends to cpu:1, cpu:1 to both others, cpu:2 to cpu:1: a copy lane per destination.
  ASSERT_EQ(model.rows().size(), 3u);
  EXPECT_EQ(model.rows()[0].lane_count, 2);
  EXPECT_EQ(model.rows()[1].lane_count, 3);
  EXPECT_EQ(model.rows()[2].lane_count, 2);
  EXPECT_EQ(model.rows()[1].stages, (std::vector<int>{1, 2}));
  const LaneMetrics metrics;
  for (double available : {100.0, 400.0, 5000.0}) {
    LaneLayout layout;
    layout.build(model, 26, available, metrics);
    expect_well_formed(model, layout, metrics);
  }
}

TEST(LaneLayout, LanesStretchToTheHeightWithinLimits) {
  const TimelineModel model = three_devices();
  const LaneMetrics m;
  // Fixed space: 2 row gaps, 3 rows' padding, lane gaps (1 + 2 + 1).
  const double fixed = 2 * m.row_gap + 3 * 2 * m.row_padding + 4 * m.lane_gap;
  const double natural = 3 * m.compute_height + 4 * m.copy_height;
  LaneLayout layout;

  layout.build(model, 0, fixed + 1.3 * natural, m);
  EXPECT_NEAR(layout.scale(), 1.3, 1e-9);
  EXPECT_NEAR(layout.content_height(), fixed + 1.3 * natural, 7 * 0.5 + 1e-9);  // whole pixels

  layout.build(model, 0, 10000, m);
  EXPECT_DOUBLE_EQ(layout.scale(), m.max_scale);
  layout.build(model, 0, 50, m);
  EXPECT_DOUBLE_EQ(layout.scale(), m.min_scale);
  EXPECT_GT(layout.content_height(), 50);  // taller than the view: it scrolls
}

}  // namespace
}  // namespace pipetune::gui
