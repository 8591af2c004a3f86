#include <gtest/gtest.h>

#include <numeric>

#include "gui/model/cost_strip_geometry.hpp"

namespace pipetune::gui {
namespace {

TEST(CostStrip, ColumnsBarsAndBoundariesSitWhereTheLayersAre) {
  CostStripGeometry g;
  // Eight layers over 800 px from x = 200: 100 px each.
  g.build({1, 2, 4, 2, 1, 1, 3, 2}, {3, 3, 2}, QRectF(200, 20, 800, 80));
  EXPECT_DOUBLE_EQ(g.column(0).left(), 200);
  EXPECT_DOUBLE_EQ(g.column(7).right(), 1000);
  EXPECT_DOUBLE_EQ(g.boundary_x(0), 500);  // after layer 2
  EXPECT_DOUBLE_EQ(g.boundary_x(1), 800);  // after layer 5
  // The costliest layer's bar fills the column's height, the others in proportion.
  EXPECT_DOUBLE_EQ(g.bar(2).height(), 80);
  EXPECT_DOUBLE_EQ(g.bar(0).height(), 20);
  EXPECT_DOUBLE_EQ(g.bar(0).bottom(), 100);
  EXPECT_DOUBLE_EQ(g.stage_ms(0), 7);
  EXPECT_DOUBLE_EQ(g.stage_ms(2), 5);
  EXPECT_EQ(g.layer_at(250), 0);
  EXPECT_EQ(g.layer_at(999), 7);
  EXPECT_EQ(g.layer_at(1000), -1);
  // A launch-bound stage takes longer than its layers add up to: its own figure, when given.
  g.build({1, 2, 4, 2, 1, 1, 3, 2}, {3, 3, 2}, QRectF(200, 20, 800, 80), {9, 4, 5});
  EXPECT_DOUBLE_EQ(g.stage_ms(0), 9);
  EXPECT_DOUBLE_EQ(g.bar(2).height(), 80);  // the layers' bars are unchanged
}

TEST(CostStrip, GrabsTheNearestBoundaryWithinReach) {
  CostStripGeometry g;
  g.build(std::vector<double>(8, 1.0), {3, 3, 2}, QRectF(200, 20, 800, 80));
  EXPECT_EQ(g.boundary_at(500, 6), 0);
  EXPECT_EQ(g.boundary_at(505, 6), 0);
  EXPECT_EQ(g.boundary_at(507, 6), -1);
  EXPECT_EQ(g.boundary_at(796, 6), 1);
  EXPECT_EQ(g.boundary_at(300, 6), -1);
  // Gaps: the nearest layer edge, never the strip's own ends.
  EXPECT_EQ(g.gap_at(449), 2);
  EXPECT_EQ(g.gap_at(451), 3);
  EXPECT_EQ(g.gap_at(0), 1);
  EXPECT_EQ(g.gap_at(5000), 7);
}

// Every boundary dragged to every gap, against what the move must do: only the two stages beside
// the boundary change, the layer count is kept, and the new boundary is the gap clamped so that
// both stages keep a layer.
TEST(CostStrip, MovingABoundaryOnlyTradesLayersBetweenItsTwoStages) {
  const std::vector<int> balance = {3, 1, 4, 2};
  const int layers = std::accumulate(balance.begin(), balance.end(), 0);
  for (int b = 0; b + 1 < static_cast<int>(balance.size()); ++b) {
    const int first = std::accumulate(balance.begin(), balance.begin() + b, 0);
    const int end = first + balance[b] + balance[b + 1];
    for (int gap = -2; gap <= layers + 2; ++gap) {
      const auto moved = CostStripGeometry::move_boundary(balance, b, gap);
      ASSERT_EQ(moved.size(), balance.size());
      EXPECT_EQ(std::accumulate(moved.begin(), moved.end(), 0), layers);
      for (std::size_t s = 0; s < balance.size(); ++s) {
        if (static_cast<int>(s) != b && static_cast<int>(s) != b + 1) {
          EXPECT_EQ(moved[s], balance[s]);
        }
        EXPECT_GE(moved[s], 1);
      }
      const int expected_gap = std::min(std::max(gap, first + 1), end - 1);
      EXPECT_EQ(first + moved[b], expected_gap);
    }
  }
  EXPECT_EQ(CostStripGeometry::move_boundary(balance, 3, 5), balance);  // no boundary 3
}

}  // namespace
}  // namespace pipetune::gui
