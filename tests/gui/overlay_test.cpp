// The overlay against a hand-built pair of traces whose differences are known: the measured
// one starts its steps at 100 ms and 200 ms, lists its devices in the other order, stretches
// step 0's forwards by 1.25, shrinks its backwards to 0.8 and doubles its copies, and has one
// task the prediction lacks (and lacks one the prediction has).

#include <gtest/gtest.h>

#include <cmath>

#include "gui/model/overlay_summary.hpp"
#include "gui/model/timeline_model.hpp"

namespace pipetune::gui {
namespace {

struct Row {
  int device;  // in the predicted trace: 0 gpu0, 1 gpu1
  TaskKind kind;
  int stage, micro_batch;
  double start, end;
};

const std::vector<Row> kPredicted = {
    {0, TaskKind::Forward, 0, 0, 0.0, 2.0},        {0, TaskKind::Forward, 0, 1, 2.0, 4.0},
    {0, TaskKind::SendActivation, 0, 0, 2.0, 2.5}, {0, TaskKind::SendActivation, 0, 1, 4.0, 4.5},
    {1, TaskKind::Forward, 1, 0, 2.5, 5.0},        {1, TaskKind::Forward, 1, 1, 5.0, 7.5},
    {1, TaskKind::Backward, 1, 1, 7.5, 8.5},       {1, TaskKind::Backward, 1, 0, 8.5, 9.0},
    {1, TaskKind::SendGradient, 1, 1, 8.5, 9.0},   {1, TaskKind::SendGradient, 1, 0, 9.0, 9.5},
    {0, TaskKind::Backward, 0, 1, 9.0, 12.0},      {0, TaskKind::Backward, 0, 0, 12.0, 15.0},
};

TraceTask task_of(const Row& r, int pid, int peer_pid) {
  TraceTask t;
  t.kind = r.kind;
  t.stage = r.stage;
  t.micro_batch = r.micro_batch;
  t.device = pid;
  t.peer = is_compute(r.kind) ? -1 : peer_pid;
  t.start_ms = r.start;
  t.end_ms = r.end;
  return t;
}

Trace predicted_trace() {
  Trace t;
  t.kind = "predicted";
  t.iteration_ms = 15.0;
  t.devices = {{"gpu0", {0}, 10.0, 1000, 4000, {{0.0, 600}, {2.0, 1000}, {15.0, 300}}},
               {"gpu1", {1}, 6.0, 2000, 4000, {{0.0, 200}, {2.5, 2000}, {9.0, 200}}}};
  for (const Row& r : kPredicted) t.tasks.push_back(task_of(r, r.device, 1 - r.device));
  return t;
}

double scale_of(TaskKind kind, int step) {
  if (step == 1) return 1.0;
  if (kind == TaskKind::Forward) return 1.25;
  if (kind == TaskKind::Backward) return 0.8;
  return 2.0;  // copies
}

// gpu1 is pid 0 and gpu0 pid 1 here.
Trace measured_trace() {
  Trace t;
  t.kind = "measured";
  t.devices = {
      {"gpu1", {1}, 0.0, 1600, 4000, {{102.0, 700}, {110.0, 1600}}},
      {"gpu0",
       {0},
       0.0,
       1250,
       4000,
       {{50.0, 300}, {100.0, 500}, {105.0, 1250}, {115.6, 400}, {200.0, 500}, {210.0, 900}}}};
  for (int step : {0, 1}) {
    const double offset = step == 0 ? 100.0 : 200.0;
    for (const Row& r : kPredicted) {
      if (step == 0 && r.kind == TaskKind::SendActivation && r.micro_batch == 1) continue;  // lost
      const int pid = 1 - r.device;
      TraceTask task = task_of(r, pid, 1 - pid);
      const double start = step == 0 ? r.start * 1.1 : r.start;
      task.start_ms = offset + start;
      task.end_ms = task.start_ms + (r.end - r.start) * scale_of(r.kind, step);
      task.step = step;
      t.tasks.push_back(task);
    }
  }
  // A recompute the prediction does not have.
  TraceTask extra = task_of({0, TaskKind::Recompute, 1, 0, 0, 0}, 0, -1);
  extra.start_ms = 106.0, extra.end_ms = 107.0, extra.step = 0;
  t.tasks.push_back(extra);
  return t;
}

const TimelineTask* find(const TimelineModel& model, Series s, TaskKind kind, int stage, int mb) {
  for (const auto& t : model.tasks(s)) {
    if (t.kind == kind && t.stage == stage && t.micro_batch == mb) return &t;
  }
  return nullptr;
}

TEST(Overlay, AlignsAStepAtItsFirstTaskAndMatchesTaskByTask) {
  TimelineModel model;
  model.set_prediction(predicted_trace());
  model.set_measured(std::make_shared<Trace>(measured_trace()), 0);

  EXPECT_EQ(model.measured_steps(), (std::vector<int>{0, 1}));
  EXPECT_EQ(model.measured_step(), 0);
  EXPECT_DOUBLE_EQ(model.measured_offset_ms(), 100.0);
  // The last task to end is 0B0: starts at 12 × 1.1 = 13.2, lasts 3 × 0.8 = 2.4.
  EXPECT_NEAR(model.measured_ms(), 15.6, 1e-9);

  for (const Row& r : kPredicted) {
    const TimelineTask* p = find(model, Series::Predicted, r.kind, r.stage, r.micro_batch);
    const TimelineTask* m = find(model, Series::Measured, r.kind, r.stage, r.micro_batch);
    ASSERT_NE(p, nullptr);
    if (r.kind == TaskKind::SendActivation && r.micro_batch == 1) {
      EXPECT_EQ(m, nullptr);
      EXPECT_EQ(p->match, -1);
      EXPECT_TRUE(std::isnan(p->error));
      continue;
    }
    ASSERT_NE(m, nullptr);
    // Same device row by name although the measured trace numbers its devices the other way.
    EXPECT_EQ(m->row, p->row);
    EXPECT_EQ(m->lane, p->lane);
    EXPECT_NEAR(m->start_ms, r.start * 1.1, 1e-9);
    EXPECT_EQ(&model.tasks(Series::Measured)[p->match], m);
    EXPECT_EQ(&model.tasks(Series::Predicted)[m->match], p);
    // (predicted − measured) / measured with measured = predicted × scale: 1 / scale − 1.
    const double expected = 1.0 / scale_of(r.kind, 0) - 1.0;
    EXPECT_NEAR(p->error, expected, 1e-9) << p->label();
    EXPECT_NEAR(m->error, expected, 1e-9);
  }
  EXPECT_EQ(model.unmatched(Series::Predicted), 1);
  EXPECT_EQ(model.unmatched(Series::Measured), 1);  // the recompute
  EXPECT_EQ(model.dropped_measured(), 0);
}

TEST(Overlay, TheLastStepIsShownUnlessAnotherIsChosen) {
  TimelineModel model;
  model.set_prediction(predicted_trace());
  model.set_measured(std::make_shared<Trace>(measured_trace()));
  EXPECT_EQ(model.measured_step(), 1);
  EXPECT_DOUBLE_EQ(model.measured_offset_ms(), 200.0);
  EXPECT_NEAR(model.measured_ms(), 15.0, 1e-9);
  for (const TimelineTask& m : model.tasks(Series::Measured)) {
    const TimelineTask& p = model.tasks(Series::Predicted)[m.match];
    EXPECT_NEAR(m.start_ms, p.start_ms, 1e-9);
    EXPECT_NEAR(m.error, 0.0, 1e-9);
  }
  EXPECT_EQ(model.unmatched(Series::Predicted), 0);
}

TEST(Overlay, MemoryCurvesAreShiftedLikeTheTasks) {
  TimelineModel model;
  model.set_prediction(predicted_trace());
  model.set_measured(std::make_shared<Trace>(measured_trace()), 0);
  const TimelineRow& gpu0 = model.rows()[0];
  const TimelineRow& gpu1 = model.rows()[1];
  ASSERT_EQ(gpu0.name, "gpu0");
  // Step 0 runs from 100 to 115.6 ms; later samples belong to step 1.
  ASSERT_EQ(gpu0.measured_memory.size(), 3u);
  EXPECT_DOUBLE_EQ(gpu0.measured_memory[0].time, 0.0);
  EXPECT_EQ(gpu0.measured_memory[0].value, 500);
  EXPECT_NEAR(gpu0.measured_memory[1].time, 5.0, 1e-9);
  EXPECT_EQ(gpu0.measured_memory[1].value, 1250);
  EXPECT_NEAR(gpu0.measured_memory[2].time, 15.6, 1e-9);
  // gpu1's first sample comes after the step starts: the level before it (nothing) holds at 0.
  ASSERT_EQ(gpu1.measured_memory.size(), 3u);
  EXPECT_EQ(gpu1.measured_memory[0].value, 0);
  EXPECT_NEAR(gpu1.measured_memory[1].time, 2.0, 1e-9);
  EXPECT_NEAR(gpu1.measured_memory[2].time, 10.0, 1e-9);
  EXPECT_EQ(gpu0.measured_peak_bytes, 1250);
  EXPECT_EQ(gpu1.measured_peak_bytes, 1600);
}

TEST(Overlay, SummaryErrorsAreTheHandComputedOnes) {
  TimelineModel model;
  model.set_prediction(predicted_trace());
  model.set_measured(std::make_shared<Trace>(measured_trace()), 0);
  const OverlaySummary s = summarize(model, nullptr);
  ASSERT_TRUE(s.has_measured);
  EXPECT_DOUBLE_EQ(s.predicted_ms, 15.0);
  EXPECT_NEAR(s.measured_ms, 15.6, 1e-9);
  EXPECT_NEAR(s.time_error, (15.0 - 15.6) / 15.6, 1e-12);
  ASSERT_EQ(s.devices.size(), 2u);
  EXPECT_EQ(s.devices[0].name, "gpu0");
  EXPECT_NEAR(s.devices[0].error, (1000.0 - 1250.0) / 1250.0, 1e-12);  // −20 %
  EXPECT_NEAR(s.devices[1].error, (2000.0 - 1600.0) / 1600.0, 1e-12);  // +25 %
  EXPECT_EQ(s.matched_tasks, 11);
  EXPECT_EQ(s.unmatched_predicted, 1);
  EXPECT_EQ(s.unmatched_measured, 1);
  // Compute tasks' |errors|: 4 forwards at 0.2, 4 backwards at 0.25: the median is their middle.
  EXPECT_NEAR(s.median_abs_task_error, 0.225, 1e-12);
  EXPECT_FALSE(s.other_plan);
}

TEST(Overlay, SaysWhenTheTraceRanAnotherPlan) {
  Trace measured = measured_trace();
  Plan ran;
  ran.balance = {1, 1};
  ran.chunks = 2;
  measured.plan = ran;
  TimelineModel model;
  model.set_prediction(predicted_trace());
  model.set_measured(std::make_shared<Trace>(measured));
  EXPECT_FALSE(summarize(model, &ran).other_plan);
  Plan current = ran;
  current.chunks = 4;
  const auto s = summarize(model, &current);
  ASSERT_TRUE(s.other_plan);
  EXPECT_EQ(*s.other_plan, describe_plan(ran));
}

TEST(Overlay, DevicesWithOtherNamesMatchByPositionWhenTheCountsAgree) {
  Trace measured = measured_trace();
  measured.devices[0].name = "cuda:0";
  measured.devices[1].name = "cuda:1";
  TimelineModel model;
  model.set_prediction(predicted_trace());
  model.set_measured(std::make_shared<Trace>(measured), 1);
  // Now pid 0 is taken as row 0 (gpu0): the measured tasks of row 0 are those the trace put on
  // its pid 0, which the prediction has on gpu1; they still match by task, across rows.
  EXPECT_EQ(model.dropped_measured(), 0);
  const TimelineTask* m = find(model, Series::Measured, TaskKind::Forward, 1, 0);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->row, 0);
}

TEST(Overlay, TasksOnDevicesThePredictionLacksAreLeftOut) {
  Trace measured = measured_trace();
  measured.devices.push_back({"gpu2", {2}, 0.0, 0, 0, {}});
  TraceTask stray;
  stray.kind = TaskKind::Forward;
  stray.stage = 2;
  stray.device = 2;
  stray.start_ms = 201.0, stray.end_ms = 202.0, stray.step = 1;
  measured.tasks.push_back(stray);
  TimelineModel model;
  model.set_prediction(predicted_trace());
  model.set_measured(std::make_shared<Trace>(measured));
  EXPECT_EQ(model.dropped_measured(), 1);
  EXPECT_EQ(model.rows().size(), 2u);
  std::size_t in_lanes = 0;
  for (const auto& lane : model.lanes()) in_lanes += lane.of(Series::Measured).size();
  EXPECT_EQ(in_lanes, model.tasks(Series::Measured).size() - 1);
}

TEST(Overlay, AMeasuredTraceAloneIsShownOnItsOwnDevices) {
  TimelineModel model;
  model.set_measured(std::make_shared<Trace>(measured_trace()));
  EXPECT_FALSE(model.has_prediction());
  ASSERT_EQ(model.rows().size(), 2u);
  EXPECT_EQ(model.rows()[0].name, "gpu1");
  std::size_t in_lanes = 0;
  for (const auto& lane : model.lanes()) in_lanes += lane.of(Series::Measured).size();
  EXPECT_EQ(in_lanes, model.tasks(Series::Measured).size());
  model.clear_measured();
  EXPECT_TRUE(model.rows().empty());
}

}  // namespace
}  // namespace pipetune::gui
