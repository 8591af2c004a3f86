#include "gui/model/timeline_model.hpp"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "gui/model/lane_layout.hpp"
#include "gui/model/time_axis.hpp"
#include "tests/gui/gui_test_support.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune::gui {
namespace {

using pipetune::testing::LayerSpec;
using pipetune::testing::make_profile;

// Six equal layers; copies take time (latency and bandwidth) so they can be hit.
struct SharedDeviceCase {
  Profile profile =
      make_profile(std::vector<LayerSpec>(6, LayerSpec{1.0, 2.0, 1 << 20, 4096, 0, 0}), 8, 4096);
  Hardware hardware = [] {
    Hardware hw = replicate_device(ProfileDevice{"cpu", "test", 0}, 2);
    hw.link = {1e9, 0.05};
    return hw;
  }();
  Plan plan = [] {
    Plan p;
    p.balance = {2, 2, 2};
    p.chunks = 4;
    p.checkpoint = CheckpointMode::ExceptLast;
    p.devices = {"cpu:0", "cpu:1", "cpu:0"};  // stages 0 and 2 share cpu:0
    return p;
  }();
};

TEST(TimelineModel, HoldsEverySimulatedTask) {
  const Profile profile = load_profile(testing::data_path("tiny.profile.json"));
  const Hardware hardware = load_hardware(testing::data_path("hardware-2.json"));
  const Plan plan = load_plan(testing::data_path("plan-2x4.json"));
  const SimulationResult result = testing::simulate_directly(profile, hardware, plan);
  TimelineModel model;
  model.set_prediction(result);

  ASSERT_EQ(model.rows().size(), 2u);
  EXPECT_EQ(model.rows()[0].name, "gpu0");
  EXPECT_EQ(model.rows()[1].name, "gpu1");
  EXPECT_EQ(model.micro_batches(), 4);
  EXPECT_DOUBLE_EQ(model.predicted_ms(), result.iteration_ms);
  const auto& tasks = model.tasks(Series::Predicted);
  ASSERT_EQ(tasks.size(), result.tasks.size());
  for (std::size_t k = 0; k < tasks.size(); ++k) {
    EXPECT_EQ(tasks[k].kind, result.tasks[k].kind);
    EXPECT_EQ(tasks[k].stage, result.tasks[k].stage);
    EXPECT_EQ(tasks[k].micro_batch, result.tasks[k].micro_batch);
    EXPECT_EQ(model.rows()[tasks[k].row].name, hardware.devices[result.tasks[k].device].name);
    EXPECT_DOUBLE_EQ(tasks[k].start_ms, result.tasks[k].start_ms);
    EXPECT_DOUBLE_EQ(tasks[k].end_ms, result.tasks[k].end_ms);
  }
  // Each task sits in one lane, in start order, and lanes never overlap in time.
  std::size_t placed = 0;
  for (const TimelineLane& lane : model.lanes()) {
    const auto& list = lane.of(Series::Predicted);
    placed += list.size();
    for (std::size_t k = 0; k < list.size(); ++k) {
      const TimelineTask& t = tasks[list[k]];
      EXPECT_EQ(t.row, lane.row);
      EXPECT_EQ(t.is_copy(), lane.copy);
      if (k > 0) {
        EXPECT_LE(tasks[list[k - 1]].end_ms, t.start_ms + 1e-9);
      }
    }
  }
  EXPECT_EQ(placed, tasks.size());
}

TEST(TimelineModel, ListenersHearEveryChangeWhileSubscribed) {
  const Profile profile = load_profile(testing::data_path("tiny.profile.json"));
  const Hardware hardware = load_hardware(testing::data_path("hardware-2.json"));
  const Plan plan = load_plan(testing::data_path("plan-2x4.json"));
  const SimulationResult result = testing::simulate_directly(profile, hardware, plan);
  auto model = std::make_unique<TimelineModel>();
  int heard = 0, revision_seen = -1;
  auto subscription = model->subscribe([&] {
    ++heard;
    revision_seen = static_cast<int>(model->revision());  // called after the rebuild
  });
  model->set_prediction(result);
  model->clear_measured();
  model->clear_prediction();
  EXPECT_EQ(heard, 3);
  EXPECT_EQ(revision_seen, static_cast<int>(model->revision()));

  // A copy has listeners of its own (none), not the original's.
  TimelineModel copy = *model;
  copy.set_prediction(result);
  EXPECT_EQ(heard, 3);

  subscription.reset();
  model->set_prediction(result);
  EXPECT_EQ(heard, 3);

  // A handle that outlives its model ends quietly.
  auto late = model->subscribe([&] { ++heard; });
  model.reset();
  late.reset();
  EXPECT_EQ(heard, 3);
}

TEST(TimelineModel, StagesSharingADeviceShareItsComputeLane) {
  const SharedDeviceCase c;
  TimelineModel model;
  model.set_prediction(testing::simulate_directly(c.profile, c.hardware, c.plan));

  ASSERT_EQ(model.rows().size(), 2u);
  EXPECT_EQ(model.rows()[0].stages, (std::vector<int>{0, 2}));
  EXPECT_EQ(model.rows()[1].stages, (std::vector<int>{1}));
  // Per row: a compute lane and one copy lane towards the other device.
  ASSERT_EQ(model.lanes().size(), 4u);
  EXPECT_EQ(model.rows()[0].lane_count, 2);
  EXPECT_EQ(model.rows()[1].lane_count, 2);

  // Counted by hand: M = 4 micro-batches, except_last recomputes 3 of them, so a stage runs
  // 4 F + 3 R + 4 B = 11 tasks; cpu:0 runs stages 0 and 2.
  const auto& tasks = model.tasks(Series::Predicted);
  const TimelineLane& compute0 = model.lanes()[model.rows()[0].first_lane];
  const TimelineLane& compute1 = model.lanes()[model.rows()[1].first_lane];
  EXPECT_EQ(compute0.of(Series::Predicted).size(), 22u);
  EXPECT_EQ(compute1.of(Series::Predicted).size(), 11u);
  std::set<int> stages_in_lane;
  for (int k : compute0.of(Series::Predicted)) stages_in_lane.insert(tasks[k].stage);
  EXPECT_EQ(stages_in_lane, (std::set<int>{0, 2}));
  // Copies from cpu:0: activations of stage 0 and gradients of stage 2, 4 each; and back.
  for (int row : {0, 1}) {
    const TimelineLane& copies = model.lanes()[model.rows()[row].first_lane + 1];
    EXPECT_TRUE(copies.copy);
    EXPECT_EQ(copies.peer_row, 1 - row);
    EXPECT_EQ(copies.of(Series::Predicted).size(), 8u);
    std::map<TaskKind, std::set<int>> sent;
    for (int k : copies.of(Series::Predicted)) sent[tasks[k].kind].insert(tasks[k].stage);
    if (row == 0) {
      EXPECT_EQ(sent[TaskKind::SendActivation], (std::set<int>{0}));
      EXPECT_EQ(sent[TaskKind::SendGradient], (std::set<int>{2}));
    } else {
      EXPECT_EQ(sent[TaskKind::SendActivation], (std::set<int>{1}));
      EXPECT_EQ(sent[TaskKind::SendGradient], (std::set<int>{1}));
    }
  }
  // One compute stream: the two stages' tasks never overlap on cpu:0.
  const auto& list = compute0.of(Series::Predicted);
  for (std::size_t k = 1; k < list.size(); ++k) {
    EXPECT_LE(tasks[list[k - 1]].end_ms, tasks[list[k]].start_ms + 1e-9);
  }
}

TEST(TimelineModel, HitsTheTaskUnderATimeAndNothingInGaps) {
  const SharedDeviceCase c;
  TimelineModel model;
  model.set_prediction(testing::simulate_directly(c.profile, c.hardware, c.plan));
  const auto& tasks = model.tasks(Series::Predicted);
  const double tolerance = 0.01;
  int gaps_checked = 0;
  for (int l = 0; l < static_cast<int>(model.lanes().size()); ++l) {
    const auto& list = model.lanes()[l].of(Series::Predicted);
    for (std::size_t k = 0; k < list.size(); ++k) {
      const TimelineTask& t = tasks[list[k]];
      const double middle = 0.5 * (t.start_ms + t.end_ms);
      const auto hit = model.hit(l, middle, 0.0);
      ASSERT_TRUE(hit);
      EXPECT_EQ(hit->index, list[k]);
      // Just past its end, within the tolerance, it is still the nearest.
      if (k + 1 == list.size() || tasks[list[k + 1]].start_ms - t.end_ms > 2 * tolerance) {
        const auto near = model.hit(l, t.end_ms + tolerance / 2, tolerance);
        ASSERT_TRUE(near);
        EXPECT_EQ(near->index, list[k]);
      }
      if (k + 1 < list.size() && tasks[list[k + 1]].start_ms - t.end_ms > 3 * tolerance) {
        const double gap = 0.5 * (t.end_ms + tasks[list[k + 1]].start_ms);
        EXPECT_FALSE(model.hit(l, gap, tolerance));
        ++gaps_checked;
      }
    }
  }
  EXPECT_GT(gaps_checked, 5);
  EXPECT_FALSE(model.hit(-1, 1.0, 1.0));
  EXPECT_FALSE(model.hit(99, 1.0, 1.0));
}

// From pixels: the centre of every task at least two pixels wide maps back to that task through
// the axis, the lane layout and the model.
TEST(TimelineModel, PixelsMapBackToTheirTasks) {
  const SharedDeviceCase c;
  TimelineModel model;
  model.set_prediction(testing::simulate_directly(c.profile, c.hardware, c.plan));
  TimeAxis axis;
  axis.set_pixels(176, 1576);
  axis.set_extent(model.extent_ms());
  axis.fit();
  LaneLayout layout;
  layout.build(model, 26, 600);
  int checked = 0;
  const auto& tasks = model.tasks(Series::Predicted);
  for (std::size_t k = 0; k < tasks.size(); ++k) {
    const TimelineTask& t = tasks[k];
    const double x0 = axis.to_x(t.start_ms), x1 = axis.to_x(t.end_ms);
    if (x1 - x0 < 2) continue;
    const Band& band = layout.lane(t.lane);
    const int lane = layout.lane_at(band.top + band.height / 2);
    ASSERT_EQ(lane, t.lane);
    const auto hit = model.hit(lane, axis.to_ms(0.5 * (x0 + x1)), 3.0 / axis.pixels_per_ms());
    ASSERT_TRUE(hit);
    EXPECT_EQ(hit->index, static_cast<int>(k));
    ++checked;
  }
  EXPECT_GE(checked, 33);  // at least every compute task (22 on cpu:0, 11 on cpu:1)
}

TEST(TimelineModel, TooltipSaysWhatWhereAndWhen) {
  const SharedDeviceCase c;
  TimelineModel model;
  model.set_prediction(testing::simulate_directly(c.profile, c.hardware, c.plan));
  const auto& tasks = model.tasks(Series::Predicted);
  for (std::size_t k = 0; k < tasks.size(); ++k) {
    if (tasks[k].kind != TaskKind::Backward || tasks[k].stage != 2 || tasks[k].micro_batch != 3)
      continue;
    const QString text = describe_task(model, {Series::Predicted, static_cast<int>(k)});
    EXPECT_TRUE(text.contains(QStringLiteral("2B3")));
    EXPECT_TRUE(text.contains(QStringLiteral("stage 2 · micro-batch 3 · cpu:0")));
    EXPECT_TRUE(text.contains(QStringLiteral("duration 4.00 ms")));  // 2 layers × 2 ms
    return;
  }
  FAIL() << "no 2B3 task";
}

// A measured task's thread CPU time is in its tooltip, as a share of its duration.
TEST(TimelineModel, TooltipOfAMeasuredTaskSaysHowLongItsThreadWasOnACore) {
  const SharedDeviceCase c;
  TimelineModel model;
  const Trace predicted =
      trace_from_simulation(testing::simulate_directly(c.profile, c.hardware, c.plan), "m");
  auto measured = std::make_shared<Trace>(predicted);
  measured->kind = "measured";
  for (TraceTask& t : measured->tasks) {
    if (t.kind == TaskKind::Backward && t.stage == 2 && t.micro_batch == 3)
      t.cpu_ms = 0.75 * t.duration_ms();
  }
  model.set_prediction(predicted);
  model.set_measured(measured);
  int described = 0;
  const auto& tasks = model.tasks(Series::Measured);
  for (std::size_t k = 0; k < tasks.size(); ++k) {
    const QString text = describe_task(model, {Series::Measured, static_cast<int>(k)});
    const bool carries =
        tasks[k].kind == TaskKind::Backward && tasks[k].stage == 2 && tasks[k].micro_batch == 3;
    EXPECT_EQ(text.contains(QStringLiteral("on a core")), carries) << tasks[k].label();
    if (carries) {
      EXPECT_TRUE(text.contains(QStringLiteral("on a core 3.00 ms of it (75 %)")))
          << text.toStdString();
      ++described;
    }
  }
  EXPECT_EQ(described, 1);
}

}  // namespace
}  // namespace pipetune::gui
