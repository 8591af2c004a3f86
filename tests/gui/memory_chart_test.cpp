#include <gtest/gtest.h>

#include <QImage>
#include <QPainter>
#include <random>

#include "gui/model/memory_chart_geometry.hpp"
#include "gui/model/memory_chart_painter.hpp"
#include "gui/model/palette.hpp"
#include "gui/model/timeline_painter.hpp"
#include "tests/gui/gui_test_support.hpp"

namespace pipetune::gui {
namespace {

Trace one_device(std::vector<CounterSample> memory, std::int64_t capacity, std::int64_t peak) {
  Trace t;
  t.iteration_ms = 10.0;
  t.devices = {{"gpu0", {0}, 0.0, peak, capacity, std::move(memory)}};
  TraceTask task;
  task.start_ms = 0, task.end_ms = 10.0;
  t.tasks = {task};
  return t;
}

TEST(MemoryChart, ScaleReachesAboveCapacityAndPeaks) {
  TimelineModel model;
  model.set_prediction(one_device({{0, 100}}, 4000, 3000));
  MemoryChartGeometry g;
  g.build(model, 10, 100);
  ASSERT_EQ(g.plot_count(), 1);
  EXPECT_DOUBLE_EQ(g.top_bytes(0), 4000 * MemoryChartGeometry::kHeadroom);
  EXPECT_DOUBLE_EQ(g.to_y(0, 0), g.plot(0).bottom());
  EXPECT_DOUBLE_EQ(g.to_y(0, g.top_bytes(0)), g.plot(0).top);
  for (double b : {0.0, 1234.5, 4000.0}) {
    EXPECT_NEAR(g.to_bytes(0, g.to_y(0, b)), b, 1e-9);
  }

  model.set_prediction(one_device({{0, 100}}, 4000, 9000));  // over capacity: the peak sets it
  g.build(model, 10, 100);
  EXPECT_DOUBLE_EQ(g.top_bytes(0), 9000 * MemoryChartGeometry::kHeadroom);
  EXPECT_FALSE(model.rows()[0].fits());
}

TEST(MemoryChart, ScaleReachesTheWorstArrivalOrdersPeak) {
  Trace t = one_device({{0, 100}}, 4000, 3000);
  t.devices[0].worst_order_peak_bytes = 5000;  // above the capacity: the chart must show it
  TimelineModel model;
  model.set_prediction(t);
  EXPECT_EQ(model.rows()[0].worst_order_peak_bytes, 5000);
  MemoryChartGeometry g;
  g.build(model, 10, 100);
  EXPECT_DOUBLE_EQ(g.top_bytes(0), 5000 * MemoryChartGeometry::kHeadroom);
  EXPECT_TRUE(model.rows()[0].fits());  // fitting is judged on the predicted peak
}

// A brute-force reading of a step curve over [a, b): the value holding at a, then every sample
// strictly inside.
MemoryChartGeometry::Column brute_force(const std::vector<CounterSample>& samples, double a,
                                        double b) {
  MemoryChartGeometry::Column c;
  auto take = [&c](std::int64_t v) {
    if (!c.drawn) c.drawn = true, c.low = c.high = v;
    c.low = std::min(c.low, v), c.high = std::max(c.high, v), c.last = v;
  };
  const CounterSample* holding = nullptr;
  for (const auto& s : samples) {
    if (s.time <= a) holding = &s;
  }
  if (holding) take(holding->value);
  for (const auto& s : samples) {
    if (s.time > a && s.time < b) take(s.value);
  }
  return c;
}

void expect_columns_match_brute_force(const std::vector<CounterSample>& samples,
                                      const TimeAxis& axis, int columns, double end_ms) {
  const auto got = MemoryChartGeometry::columns(samples, axis, columns, end_ms);
  ASSERT_EQ(got.size(), static_cast<std::size_t>(columns));
  int drawn = 0;
  for (int c = 0; c < columns; ++c) {
    const double a = axis.to_ms(axis.left() + c), b = axis.to_ms(axis.left() + c + 1);
    MemoryChartGeometry::Column want =
        a > end_ms ? MemoryChartGeometry::Column{} : brute_force(samples, a, b);
    EXPECT_EQ(got[c].drawn, want.drawn) << c;
    if (!want.drawn) continue;
    ++drawn;
    EXPECT_EQ(got[c].low, want.low) << c;
    EXPECT_EQ(got[c].high, want.high) << c;
    EXPECT_EQ(got[c].last, want.last) << c;
  }
  EXPECT_GT(drawn, 0);
}

TEST(MemoryChart, ColumnsFollowTheStepCurve) {
  // A step up inside column 200, a step down exactly where column 500 starts.
  const std::vector<CounterSample> samples = {{0, 100}, {2.005, 300}, {5, 200}};
  TimeAxis axis;
  axis.set_pixels(50, 1050);  // 100 px per ms: column c covers [c / 100, (c + 1) / 100) ms
  axis.set_extent(10);
  axis.fit();
  const auto columns = MemoryChartGeometry::columns(samples, axis, 1000, 8.0);
  EXPECT_EQ(columns[0].high, 100);
  EXPECT_EQ(columns[199].high, 100);
  EXPECT_EQ(columns[200].low, 100);
  EXPECT_EQ(columns[200].high, 300);
  EXPECT_EQ(columns[200].last, 300);
  EXPECT_EQ(columns[499].low, 300);
  EXPECT_EQ(columns[499].high, 300);
  EXPECT_EQ(columns[500].low, 200);
  EXPECT_EQ(columns[500].high, 200);
  EXPECT_EQ(columns[799].last, 200);
  EXPECT_TRUE(columns[800].drawn);  // starts at 8 ms: still the curve
  EXPECT_FALSE(columns[801].drawn);
  expect_columns_match_brute_force(samples, axis, 1000, 8.0);
}

// Many samples per pixel, a zoomed view, a curve starting late: always what the curve does.
TEST(MemoryChart, DenseAndZoomedColumnsMatchABruteForceReading) {
  std::mt19937 random(7);
  std::uniform_int_distribution<int> value(0, 1'000'000);
  std::vector<CounterSample> samples;
  for (int k = 0; k < 5000; ++k) samples.push_back({1.0 + k * 8.0 / 5000, value(random)});
  TimeAxis axis;
  axis.set_pixels(0, 100);
  axis.set_extent(10);
  axis.fit();
  expect_columns_match_brute_force(samples, axis, 100, 10.0);
  axis.set_view({4.0, 4.5});
  expect_columns_match_brute_force(samples, axis, 100, 10.0);
  axis.set_view({0.0, 1.2});  // the curve starts at 1 ms
  const auto columns = MemoryChartGeometry::columns(samples, axis, 100, 10.0);
  EXPECT_FALSE(columns[10].drawn);
  expect_columns_match_brute_force(samples, axis, 100, 10.0);
}

int count_pixels(const QImage& image, const QColor& colour) {
  int n = 0;
  for (int y = 0; y < image.height(); ++y) {
    for (int x = 0; x < image.width(); ++x) n += image.pixelColor(x, y) == colour ? 1 : 0;
  }
  return n;
}

TEST(MemoryChart, APlanThatDoesNotFitIsDrawnInRed) {
  testing::app();
  const Profile profile = load_profile(testing::data_path("tiny.profile.json"));
  Hardware hardware = load_hardware(testing::data_path("hardware-2.json"));
  const Plan plan = load_plan(testing::data_path("plan-2x4.json"));
  MemoryChartPainter painter;
  for (bool squeeze : {false, true}) {
    SimulationResult result = testing::simulate_directly(profile, hardware, plan);
    if (squeeze) {
      // Give gpu1 a byte less than its predicted peak.
      hardware.devices[1].memory_bytes = result.devices[1].peak_memory_bytes - 1;
      result = testing::simulate_directly(profile, hardware, plan);
    }
    TimelineModel model;
    model.set_prediction(result);
    EXPECT_EQ(model.rows()[1].fits(), !squeeze);
    MemoryChartGeometry g;
    g.build(model, 4, 192);
    TimeAxis axis;
    axis.set_pixels(TimelineFrame::kGutterWidth, 788);
    axis.set_extent(model.extent_ms());
    axis.fit();
    QImage image(800, 200, QImage::Format_RGB32);
    QPainter p(&image);
    painter.paint(p, QRectF(0, 0, 800, 200), model, axis, g);
    p.end();
    image.save(testing::output_dir() + (squeeze ? "/memory-does-not-fit.png" : "/memory-fits.png"));
    const int red_background = count_pixels(image, palette::kDoesNotFitBackground);
    if (squeeze) {
      // Only gpu1's plot is tinted; gpu0's keeps its own background.
      EXPECT_GT(red_background, 1000);
      const Band& gpu0 = g.plot(0);
      EXPECT_NE(image.pixelColor(790, static_cast<int>(gpu0.top + 3)),
                palette::kDoesNotFitBackground);
    } else {
      EXPECT_EQ(red_background, 0);
    }
  }
}

}  // namespace
}  // namespace pipetune::gui
