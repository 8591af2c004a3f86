#include "gui/model/time_axis.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace pipetune::gui {
namespace {

TimeAxis axis_over(double left, double right, double extent, TimeRange view) {
  TimeAxis axis;
  axis.set_pixels(left, right);
  axis.set_extent(extent);
  axis.set_view(view);
  return axis;
}

TEST(TimeAxis, MapsTheViewOntoThePixelsAndBack) {
  for (const TimeRange view : {TimeRange{0, 100}, TimeRange{12.5, 13.0}, TimeRange{-1, 50}}) {
    const TimeAxis axis = axis_over(170, 1570, 100, view);
    EXPECT_DOUBLE_EQ(axis.to_x(view.start_ms), 170);
    EXPECT_NEAR(axis.to_x(view.end_ms), 1570, 1e-9);
    EXPECT_DOUBLE_EQ(axis.pixels_per_ms(), 1400 / view.span());
    for (double t = view.start_ms; t <= view.end_ms; t += view.span() / 37) {
      EXPECT_NEAR(axis.to_ms(axis.to_x(t)), t, 1e-9 * view.span());
    }
    for (double x = 170; x <= 1570; x += 33.3) {
      EXPECT_NEAR(axis.to_x(axis.to_ms(x)), x, 1e-9);
    }
  }
}

TEST(TimeAxis, ZoomKeepsTheTimeUnderTheCursor) {
  TimeAxis axis = axis_over(100, 1100, 80, {0, 80});
  const double anchor = 350;
  const double before = axis.to_ms(anchor);
  axis.zoom(4.0, anchor);
  EXPECT_NEAR(axis.to_ms(anchor), before, 1e-9);
  EXPECT_NEAR(axis.view().span(), 20.0, 1e-9);
  axis.zoom(0.25, anchor);
  EXPECT_NEAR(axis.view().start_ms, 0.0, 1e-9);
  EXPECT_NEAR(axis.view().end_ms, 80.0, 1e-9);
}

TEST(TimeAxis, PanMovesByPixels) {
  TimeAxis axis = axis_over(0, 1000, 100, {20, 30});  // 100 px per ms
  axis.pan_pixels(250);
  EXPECT_NEAR(axis.view().start_ms, 22.5, 1e-9);
  EXPECT_NEAR(axis.view().end_ms, 32.5, 1e-9);
  axis.pan_pixels(-500);
  EXPECT_NEAR(axis.view().start_ms, 17.5, 1e-9);
}

TEST(TimeAxis, StaysNearTheData) {
  TimeAxis axis = axis_over(0, 1000, 100, {40, 60});
  axis.pan_pixels(1e7);  // far right
  EXPECT_LE(axis.view().end_ms, 100 * 1.02 + 1e-9);
  EXPECT_NEAR(axis.view().span(), 20, 1e-9);
  axis.pan_pixels(-1e7);
  EXPECT_GE(axis.view().start_ms, -100 * 0.02 - 1e-9);
  axis.zoom(1e-6, 500);  // far out
  EXPECT_LE(axis.view().span(), 100 * 1.04 + 1e-9);
  axis.zoom(1e12, 500);  // far in
  EXPECT_NEAR(axis.view().span(), TimeAxis::kMinSpanMs, 1e-12);
}

TEST(TimeAxis, ZoomToPixelsShowsExactlyThatRange) {
  TimeAxis axis = axis_over(100, 1100, 50, {0, 50});  // 20 px per ms
  const double a = axis.to_ms(300), b = axis.to_ms(700);
  EXPECT_TRUE(axis.zoom_to_pixels(700, 300));
  EXPECT_NEAR(axis.view().start_ms, a, 1e-9);
  EXPECT_NEAR(axis.view().end_ms, b, 1e-9);
  EXPECT_FALSE(axis.zoom_to_pixels(400, 401));  // a click is not a selection
}

TEST(TimeAxis, AFittedViewFollowsTheExtentAndAZoomedOneStays) {
  TimeAxis axis;
  axis.set_pixels(0, 500);
  axis.set_extent(10);
  axis.fit();
  axis.set_extent(25);
  EXPECT_EQ(axis.view(), (TimeRange{0, 25}));
  axis.zoom(2, 250);
  const TimeRange zoomed = axis.view();
  axis.set_extent(30);
  EXPECT_EQ(axis.view(), zoomed);
  EXPECT_FALSE(axis.fitted());
}

// Ticks: a 1-2-5 step, the smallest at least the spacing asked for, every multiple of it in the
// view and nothing else. Checked against a brute-force scan of candidate steps.
TEST(TimeAxis, TicksAreTheSmallestNiceStepAtLeastTheSpacing) {
  for (const TimeRange view :
       {TimeRange{0, 77.3}, TimeRange{3.21, 3.29}, TimeRange{0, 4200}, TimeRange{-1.5, 0.004}}) {
    const TimeAxis axis = axis_over(176, 1588, std::max(view.end_ms, 1.0), view);
    const double spacing = 90;
    double expected = INFINITY;
    for (int power = -9; power <= 9; ++power) {
      for (double m : {1.0, 2.0, 5.0}) {
        const double step = m * std::pow(10.0, power);
        if (step * axis.pixels_per_ms() >= spacing * (1 - 1e-9))
          expected = std::min(expected, step);
      }
    }
    const double step = axis.tick_step(spacing);
    EXPECT_NEAR(step, expected, expected * 1e-9);
    const auto ticks = axis.ticks(spacing);
    ASSERT_FALSE(ticks.empty());
    const double view_start = axis.view().start_ms, view_end = axis.view().end_ms;
    EXPECT_LT(ticks.front().ms - step, view_start + step * 1e-6);
    EXPECT_GT(ticks.back().ms + step, view_end - step * 1e-6);
    for (std::size_t k = 0; k < ticks.size(); ++k) {
      EXPECT_GE(ticks[k].ms, view_start - step * 1e-6);
      EXPECT_LE(ticks[k].ms, view_end + step * 1e-6);
      EXPECT_NEAR(ticks[k].x, axis.to_x(ticks[k].ms), 1e-6);
      const double multiple = ticks[k].ms / step;
      EXPECT_NEAR(multiple, std::round(multiple), 1e-6);
      if (k > 0) {
        EXPECT_NEAR(ticks[k].ms - ticks[k - 1].ms, step, step * 1e-6);
      }
    }
  }
}

TEST(ZoomHistory, UndoesInReverseOrderAndForgetsTheOldest) {
  ZoomHistory history;
  EXPECT_FALSE(history.pop());
  history.push({0, 10});
  history.push({2, 4});
  history.push({2, 4});  // the same view twice is one step
  EXPECT_EQ(history.size(), 2u);
  EXPECT_EQ(*history.pop(), (TimeRange{2, 4}));
  EXPECT_EQ(*history.pop(), (TimeRange{0, 10}));
  EXPECT_TRUE(history.empty());
  for (std::size_t k = 0; k < ZoomHistory::kLimit + 5; ++k)
    history.push({0, 1.0 + static_cast<double>(k)});
  EXPECT_EQ(history.size(), ZoomHistory::kLimit);
  EXPECT_EQ(history.pop()->end_ms, 1.0 + static_cast<double>(ZoomHistory::kLimit + 4));
}

}  // namespace
}  // namespace pipetune::gui
