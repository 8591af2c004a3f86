// What torch.distributed.pipelining runs of pipetune's plans, and the planner kept to it.

#include "sim/planner/runtime_support.hpp"

#include <gtest/gtest.h>

#include "sim/planner/planner.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

using testing::make_plan;

Hardware torch_hardware() {
  Hardware hw = replicate_device({"cpu", "x", 0}, 2);
  hw.runtime = Runtime::TorchPipelining;
  return hw;
}

TEST(RuntimeSupport, TorchRunsTheChunkCountsWhoseMicroBatchesAreOfOneSize) {
  // tensor.chunk(c) makes pieces of ceil(B / c) and a smaller last one where that does not
  // divide B: one size exactly when ceil(B / c) divides B.
  for (std::int64_t batch = 1; batch <= 40; ++batch) {
    PlannerOptions options;
    ASSERT_EQ(keep_what_the_runtime_runs(options, torch_hardware(), batch, "cpu"), "");
    std::vector<int> expected;
    for (int c = 1; c <= batch; ++c) {
      const std::int64_t piece = (batch + c - 1) / c;
      if (batch % piece == 0) expected.push_back(c);
    }
    EXPECT_EQ(options.chunks, expected) << "batch " << batch;
    for (int c = 1; c <= batch; ++c) {
      const bool runs =
          torch_cannot_run(make_plan({1, 1}, c, CheckpointMode::Never), batch, "cpu").empty();
      EXPECT_EQ(runs, std::find(expected.begin(), expected.end(), c) != expected.end())
          << "batch " << batch << ", " << c << " chunks";
    }
  }
  EXPECT_EQ(torch_cannot_run(make_plan({1, 1}, 3, CheckpointMode::Never), 8, "cpu"),
            "a batch of 8 in 3 chunks makes micro-batches of 3 and 2: torch's stages check every "
            "micro-batch against one shape");
}

TEST(RuntimeSupport, TorchCannotCheckpointAllButTheLastNorRunAVOnCpu) {
  PlannerOptions options;
  ASSERT_EQ(keep_what_the_runtime_runs(options, torch_hardware(), 8, "cpu"), "");
  EXPECT_EQ(options.checkpoints,
            (std::vector<CheckpointMode>{CheckpointMode::Always, CheckpointMode::Never}));
  for (const ScheduleKind kind : options.schedules) {
    EXPECT_NE(kind, ScheduleKind::ZBV);
    EXPECT_NE(kind, ScheduleKind::DualPipeV);
  }
  EXPECT_EQ(options.schedules.size(), std::size(kAllScheduleKinds) - 2);
  PlannerOptions on_gpus;
  ASSERT_EQ(keep_what_the_runtime_runs(on_gpus, torch_hardware(), 8, "cuda"), "");
  EXPECT_EQ(on_gpus.schedules.size(), std::size(kAllScheduleKinds));  // NCCL carries them
  EXPECT_FALSE(
      torch_cannot_run(make_plan({1, 1}, 2, CheckpointMode::ExceptLast), 8, "cuda").empty());
  Plan v = make_plan({1, 1, 1, 1}, 2, CheckpointMode::Never, ScheduleKind::ZBV);
  EXPECT_EQ(torch_cannot_run(v, 8, "cuda"), "");
  EXPECT_EQ(torch_cannot_run(v, 8, "cpu"),
            "zbv on CPU: torch's V schedules send tensors between a rank's two stages as messages "
            "to itself, which Gloo cannot carry");
}

TEST(RuntimeSupport, PipetunesExecutorRunsEverythingAndNothingLeftIsSaid) {
  PlannerOptions options;
  Hardware own = torch_hardware();
  own.runtime = Runtime::Pipetune;
  ASSERT_EQ(keep_what_the_runtime_runs(options, own, 8, "cpu"), "");
  EXPECT_TRUE(options.chunks.empty());  // still every count
  EXPECT_EQ(options.checkpoints.size(), std::size(kAllCheckpointModes));
  EXPECT_EQ(options.schedules.size(), std::size(kAllScheduleKinds));

  PlannerOptions uneven;
  uneven.chunks = {3, 5};
  EXPECT_EQ(keep_what_the_runtime_runs(uneven, torch_hardware(), 8, "cpu"), "");
  EXPECT_EQ(uneven.chunks, (std::vector<int>{5}));  // 5 chunks of 8: four of 2
  uneven.chunks = {3};
  EXPECT_EQ(keep_what_the_runtime_runs(uneven, torch_hardware(), 8, "cpu"),
            "no chunk count asked for splits the batch of 8 evenly, as torch's stages need");
  PlannerOptions except_last;
  except_last.checkpoints = {CheckpointMode::ExceptLast};
  EXPECT_NE(keep_what_the_runtime_runs(except_last, torch_hardware(), 8, "cpu"), "");
  PlannerOptions only_v;
  only_v.schedules = {ScheduleKind::DualPipeV};
  EXPECT_NE(keep_what_the_runtime_runs(only_v, torch_hardware(), 8, "cpu"), "");
}

}  // namespace
}  // namespace pipetune
