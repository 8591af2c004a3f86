// The GUI's speed targets, on the model and painters the app runs (no widgets, drawing into a
// QImage on the offscreen platform):
//   drawing the timeline of K = 16 devices x M = 128 micro-batches: under 16.7 ms a frame
//   (60 frames per second), whole iteration in view, zoomed in, and with a measured overlay;
//   an edit (a stage boundary dragged by one layer): re-simulation, model rebuild and redraw of
//   the timeline, the memory chart and the layer strip under 16 ms.
// Run: build-gui/bench/gui/pipetune_gui_bench (docs/gui.md has the numbers).

#include <benchmark/benchmark.h>

#include <QGuiApplication>
#include <QImage>
#include <QPainter>
#include <memory>

#include "bench/synthetic_profile.hpp"
#include "gui/model/cost_strip_geometry.hpp"
#include "gui/model/cost_strip_painter.hpp"
#include "gui/model/lane_layout.hpp"
#include "gui/model/memory_chart_geometry.hpp"
#include "gui/model/memory_chart_painter.hpp"
#include "gui/model/plan_editor.hpp"
#include "gui/model/time_axis.hpp"
#include "gui/model/timeline_model.hpp"
#include "gui/model/timeline_painter.hpp"

namespace pipetune::gui::bench {
namespace {

// Fonts need a QGuiApplication; the offscreen platform needs no display.
void ensure_app() {
  static std::unique_ptr<QGuiApplication> app = [] {
    if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
    static int argc = 1;
    static char name[] = "pipetune_gui_bench";
    static char* argv[] = {name, nullptr};
    return std::make_unique<QGuiApplication>(argc, argv);
  }();
}

constexpr int kDevices = 16;
constexpr int kMicroBatches = 128;
constexpr int kWidth = 1920, kTimelineHeight = 1000, kMemoryHeight = 320, kStripHeight = 110;

Profile big_profile() {
  return pipetune::bench::synthetic_profile(4 * kDevices, kMicroBatches);
}

Hardware big_hardware(const Profile& profile) {
  Hardware hw = replicate_device(profile.device, kDevices);
  hw.link.bandwidth_bytes_per_s = 1e10;
  hw.link.latency_ms = 0.01;
  return hw;
}

Plan big_plan() {
  Plan plan;
  plan.balance.assign(kDevices, 4);
  plan.chunks = kMicroBatches;
  plan.checkpoint = CheckpointMode::ExceptLast;
  return plan;
}

// A measured trace of the same plan: the profile's backwards 10 % slower, shifted by 3 ms.
std::shared_ptr<Trace> measured_trace(Profile profile, const Hardware& hardware, const Plan& plan) {
  for (auto& layer : profile.layers) {
    for (auto& ms : layer.backward_ms) ms *= 1.1;
  }
  const Simulator simulator(profile, hardware);
  auto trace = std::make_shared<Trace>(trace_from_simulation(simulator.run(plan), profile.model));
  trace->kind = "measured";
  for (auto& t : trace->tasks) t.start_ms += 3.0, t.end_ms += 3.0;
  return trace;
}

// What a timeline frame needs: the model of a prediction, its axis and lanes, an image.
struct TimelineFrameState {
  TimelineModel model;
  TimeAxis axis;
  LaneLayout layout;
  TimelinePainter painter;
  QImage image{kWidth, kTimelineHeight, QImage::Format_RGB32};

  void lay_out() {
    axis.set_pixels(TimelineFrame::kGutterWidth, kWidth - TimelineFrame::kRightMargin);
    axis.set_extent(model.extent_ms());
    layout.build(model, TimelineFrame::kRulerHeight, kTimelineHeight - TimelineFrame::kRulerHeight);
  }
  void paint(const TimelineStyle& style = {}) {
    QPainter painter_on(&image);
    painter.paint(painter_on, QRectF(0, 0, kWidth, kTimelineHeight), model, axis, layout, style);
  }
};

// args: zoom (1: whole iteration, 8: an eighth of it), overlay (0/1)
void BM_PaintTimeline16x128(benchmark::State& state) {
  ensure_app();
  const Profile profile = big_profile();
  const Hardware hardware = big_hardware(profile);
  const Plan plan = big_plan();
  const Simulator simulator(profile, hardware);
  TimelineFrameState frame;
  frame.model.set_prediction(simulator.run(plan));
  if (state.range(1)) frame.model.set_measured(measured_trace(profile, hardware, plan));
  frame.lay_out();
  frame.axis.fit();
  if (state.range(0) > 1) frame.axis.zoom(static_cast<double>(state.range(0)), kWidth / 2.0);
  // Pan a little every frame, as a drag does, so nothing is cached between frames.
  double direction = 1.0;
  for (auto _ : state) {
    frame.axis.pan_pixels(direction * 3.0);
    direction = -direction;
    frame.paint();
    benchmark::DoNotOptimize(frame.image.constBits());
  }
  std::size_t tasks =
      frame.model.tasks(Series::Predicted).size() + frame.model.tasks(Series::Measured).size();
  state.counters["tasks"] = static_cast<double>(tasks);
  state.counters["frames_per_s"] =
      benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_PaintTimeline16x128)
    ->ArgNames({"zoom", "overlay"})
    ->Args({1, 0})
    ->Args({8, 0})
    ->Args({1, 1})
    ->Args({8, 1})
    ->Unit(benchmark::kMillisecond);

void BM_PaintMemoryChart16x128(benchmark::State& state) {
  ensure_app();
  const Profile profile = big_profile();
  const Hardware hardware = big_hardware(profile);
  const Plan plan = big_plan();
  const Simulator simulator(profile, hardware);
  TimelineFrameState frame;
  frame.model.set_prediction(simulator.run(plan));
  frame.lay_out();
  frame.axis.fit();
  MemoryChartGeometry geometry;
  geometry.build(frame.model, 4, kMemoryHeight - 8, 4, 12);
  MemoryChartPainter painter;
  QImage image(kWidth, kMemoryHeight, QImage::Format_RGB32);
  for (auto _ : state) {
    QPainter p(&image);
    painter.paint(p, QRectF(0, 0, kWidth, kMemoryHeight), frame.model, frame.axis, geometry);
    p.end();
    benchmark::DoNotOptimize(image.constBits());
  }
  state.counters["frames_per_s"] =
      benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_PaintMemoryChart16x128)->Unit(benchmark::kMillisecond);

// What one step of a boundary drag costs the app, split into its parts: the editor's
// re-simulation (arg 0), plus the timeline model's rebuild (arg 1), plus every redraw (arg 2).
void BM_EditThenRedraw16x128(benchmark::State& state) {
  ensure_app();
  const int parts = static_cast<int>(state.range(0));
  const Profile profile = big_profile();
  PlanEditor editor;
  editor.open_profile(profile, big_hardware(profile));
  editor.apply_plan(big_plan());
  TimelineFrameState frame;
  frame.model.set_prediction(editor.result());
  frame.lay_out();
  frame.axis.fit();
  MemoryChartGeometry memory_geometry;
  MemoryChartPainter memory_painter;
  QImage memory_image(kWidth, kMemoryHeight, QImage::Format_RGB32);
  CostStripGeometry strip_geometry;
  CostStripPainter strip_painter;
  CostStripStyle strip_style;
  QImage strip_image(kWidth, kStripHeight, QImage::Format_RGB32);

  int step = 0;
  for (auto _ : state) {
    // Boundary 7 goes one layer right, then back: every step is a real change.
    editor.move_boundary(7, 32 + (step++ % 2));
    if (parts >= 1) {
      frame.model.set_prediction(editor.result());
      frame.axis.set_extent(frame.model.extent_ms());
      frame.layout.build(frame.model, TimelineFrame::kRulerHeight,
                         kTimelineHeight - TimelineFrame::kRulerHeight);
      memory_geometry.build(frame.model, 4, kMemoryHeight - 8, 4, 12);
      strip_geometry.build(
          editor.layer_ms(), editor.plan().balance,
          QRectF(TimelineFrame::kGutterWidth, 18, kWidth - TimelineFrame::kGutterWidth - 12, 78));
    }
    if (parts >= 2) {
      frame.paint();
      QPainter m(&memory_image);
      memory_painter.paint(m, QRectF(0, 0, kWidth, kMemoryHeight), frame.model, frame.axis,
                           memory_geometry);
      m.end();
      QPainter s(&strip_image);
      strip_painter.paint(s, QRectF(0, 0, kWidth, kStripHeight), strip_geometry, strip_style);
      s.end();
    }
    benchmark::DoNotOptimize(frame.image.constBits());
  }
  state.counters["tasks"] = static_cast<double>(editor.result().tasks.size());
  state.counters["simulators_built"] = static_cast<double>(editor.simulators_built());
}
BENCHMARK(BM_EditThenRedraw16x128)
    ->ArgName("parts")
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace pipetune::gui::bench
