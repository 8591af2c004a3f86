// Step alignment and task matching (sim/trace), against traces built by hand whose spans and
// pairs are read off their construction.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "sim/error.hpp"
#include "sim/trace.hpp"

namespace pipetune {
namespace {

TraceTask task(TaskKind kind, int stage, int micro_batch, double start_ms, double end_ms,
               int step = 0) {
  TraceTask t;
  t.kind = kind;
  t.stage = stage;
  t.micro_batch = micro_batch;
  t.start_ms = start_ms;
  t.end_ms = end_ms;
  t.step = step;
  return t;
}

Trace trace_of(std::vector<TraceTask> tasks) {
  Trace t;
  t.tasks = std::move(tasks);
  return t;
}

std::string error_of(auto work) {
  try {
    work();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

constexpr auto F = TaskKind::Forward;
constexpr auto B = TaskKind::Backward;
constexpr auto R = TaskKind::Recompute;
constexpr auto Act = TaskKind::SendActivation;

TEST(TraceSpan, RunsFromTheEarliestStartToTheLatestEndWhateverTheOrder) {
  // The latest end is not the last task's, the earliest start not the first's.
  const std::vector<TraceTask> tasks = {task(B, 0, 0, 7.0, 9.0), task(F, 0, 0, 2.5, 20.0),
                                        task(F, 1, 0, 4.0, 5.0)};
  const TaskSpan span = task_span(tasks);
  EXPECT_EQ(span.start_ms, 2.5);
  EXPECT_EQ(span.end_ms, 20.0);
  EXPECT_EQ(span.duration_ms(), 17.5);
  const TaskSpan none = task_span({});
  EXPECT_EQ(none.start_ms, 0.0);
  EXPECT_EQ(none.duration_ms(), 0.0);
}

TEST(TraceSteps, AreTheDistinctStepsAscending) {
  EXPECT_EQ(trace_steps(
                trace_of({task(F, 0, 0, 0, 1, 3), task(F, 0, 0, 5, 6, 1), task(B, 0, 0, 6, 7, 3)})),
            (std::vector<int>{1, 3}));
  EXPECT_TRUE(trace_steps(Trace{}).empty());
}

TEST(StepTasks, HoldsOneStepsTasksInTraceOrderAndItsOwnSpan) {
  // Step 1 runs from 10 to 16; step 0's and step 2's tasks must not widen it.
  const std::vector<TraceTask> tasks = {task(F, 0, 0, 0, 2, 0),   task(F, 0, 0, 10, 12, 1),
                                        task(F, 1, 0, 12, 13, 1), task(F, 0, 0, 20, 30, 2),
                                        task(B, 1, 0, 13, 16, 1), task(B, 0, 0, 3, 5, 0)};
  const StepTasks step(tasks, 1, "m.json");
  EXPECT_EQ(step.indices(), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(step.span().start_ms, 10.0);
  EXPECT_EQ(step.span().end_ms, 16.0);
  EXPECT_EQ(step.find({F, 0, 0}), 0);
  EXPECT_EQ(step.find({F, 1, 0}), 1);
  EXPECT_EQ(step.find({B, 1, 0}), 2);
  EXPECT_EQ(step.find({B, 0, 0}), -1);  // only in step 0
  EXPECT_EQ(step.find({R, 0, 0}), -1);  // the kind is part of the key
  EXPECT_EQ(step.find({F, 0, 1}), -1);  // and the micro-batch

  const StepTasks absent(tasks, 7, "m.json");
  EXPECT_TRUE(absent.indices().empty());
  EXPECT_EQ(absent.span().duration_ms(), 0.0);
}

TEST(StepTasks, KeysDoNotCollideAcrossLargeStagesAndMicroBatches) {
  // The loader's bound is 10^9 for both; neighbours must stay distinct.
  const int big = 1'000'000'000;
  const std::vector<TraceTask> tasks = {task(F, big, big, 0, 1), task(F, big, big - 1, 1, 2),
                                        task(F, big - 1, big, 2, 3), task(B, big, big, 3, 4)};
  const StepTasks step(tasks, 0, "m.json");
  EXPECT_EQ(step.find({F, big, big}), 0);
  EXPECT_EQ(step.find({F, big, big - 1}), 1);
  EXPECT_EQ(step.find({F, big - 1, big}), 2);
  EXPECT_EQ(step.find({B, big, big}), 3);
}

TEST(StepTasks, RefusesATaskTwiceInOneStepNamingTheSource) {
  const std::vector<TraceTask> tasks = {task(F, 0, 2, 0, 1, 4), task(F, 0, 2, 1, 2, 4)};
  EXPECT_EQ(error_of([&] { StepTasks(tasks, 4, "m.json"); }),
            "m.json: task 0F2 appears twice in step 4; a step runs each task once");
  // The same task in two different steps is two tasks.
  const std::vector<TraceTask> two_steps = {task(F, 0, 2, 0, 1, 0), task(F, 0, 2, 1, 2, 1)};
  EXPECT_EQ(StepTasks(two_steps, 1, "m.json").indices(), (std::vector<int>{1}));
}

TEST(MatchTasks, PairsByKindStageAndMicroBatchAndCountsEachSidesLeftovers) {
  // Predicted: 0F0 0F1 1F0 0>1 act 0 1B0. Measured, in another order: 1B0 0F0 0>1 act 0 0F1
  // and two tasks the prediction lacks (0R0, 1F1); it lacks 1F0.
  const Trace predicted = trace_of({task(F, 0, 0, 0, 1), task(F, 0, 1, 1, 2), task(F, 1, 0, 2, 3),
                                    task(Act, 0, 0, 1, 2), task(B, 1, 0, 3, 5)});
  const Trace measured =
      trace_of({task(B, 1, 0, 30, 50), task(F, 0, 0, 0, 10), task(R, 0, 0, 50, 60),
                task(Act, 0, 0, 10, 20), task(F, 0, 1, 10, 20), task(F, 1, 1, 40, 45)});
  const TaskMatching matching = match_tasks(predicted, measured, "m.json");
  const std::vector<std::pair<int, int>> expected = {{0, 1}, {1, 4}, {3, 3}, {4, 0}};
  EXPECT_EQ(matching.pairs, expected);
  EXPECT_EQ(matching.unmatched, 3u);  // 1F0 predicted only; 0R0 and 1F1 measured only
}

TEST(MatchTasks, OfIdenticalTracesPairsEveryTaskWithItself) {
  const Trace t = trace_of(
      {task(F, 0, 0, 0, 1), task(F, 1, 0, 1, 2), task(B, 1, 0, 2, 4), task(B, 0, 0, 4, 6)});
  const TaskMatching matching = match_tasks(t, t, "m.json");
  EXPECT_EQ(matching.pairs, (std::vector<std::pair<int, int>>{{0, 0}, {1, 1}, {2, 2}, {3, 3}}));
  EXPECT_EQ(matching.unmatched, 0u);
  const TaskMatching empty = match_tasks(Trace{}, t, "m.json");
  EXPECT_TRUE(empty.pairs.empty());
  EXPECT_EQ(empty.unmatched, 4u);
}

TEST(MatchTasks, TakesOneStepOnEachSideAndSaysWhichTraceHasMore) {
  const Trace one = trace_of({task(F, 0, 0, 0, 1, 2)});  // step 2 only: still one step
  const Trace several =
      trace_of({task(F, 0, 0, 0, 1, 0), task(F, 0, 0, 5, 6, 1), task(F, 0, 0, 9, 10, 3)});
  EXPECT_EQ(match_tasks(one, one, "m.json").pairs.size(), 1u);
  EXPECT_EQ(error_of([&] { match_tasks(one, several, "m.json"); }),
            "m.json: holds 3 training steps (0 to 3); expected a trace of one step");
  EXPECT_EQ(error_of([&] { match_tasks(several, one, "m.json"); }),
            "the prediction: holds 3 training steps (0 to 3); expected a trace of one step");
  const Trace twice = trace_of({task(B, 1, 0, 0, 1), task(B, 1, 0, 2, 3)});
  EXPECT_EQ(error_of([&] { match_tasks(one, twice, "m.json"); }),
            "m.json: task 1B0 appears twice in step 0; a step runs each task once");
}

TEST(TraceLoader, RefusesATaskTwiceInOneStepButNotInTwoSteps) {
  Trace t = trace_of({task(F, 0, 0, 0, 1, 0), task(F, 0, 0, 2, 3, 1)});
  t.kind = "measured";
  t.devices.push_back({"cpu:0", {0}});
  const Trace read = parse_trace(trace_to_json(t), "in.json");
  EXPECT_EQ(read.tasks.size(), 2u);
  t.tasks[1].step = 0;
  EXPECT_THAT(error_of([&] { parse_trace(trace_to_json(t), "in.json"); }),
              ::testing::MatchesRegex(
                  "in\\.json: traceEvents\\[[0-9]+\\]: expected each task once a step, got 0F0 "
                  "of step 0 again \\(first at traceEvents\\[[0-9]+\\]\\)"));
}

}  // namespace
}  // namespace pipetune
