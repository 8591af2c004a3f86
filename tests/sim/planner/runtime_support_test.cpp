// What torch.distributed.pipelining runs of pipetune's plans, and the planner kept to it.

#include "sim/planner/runtime_support.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "sim/planner/planner.hpp"
#include "tests/sim/fixtures.hpp"
#include "tests/sim/planner/planner_brute_force.hpp"

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
    ASSERT_EQ(keep_what_the_runtime_runs(options, torch_hardware(), batch), "");
    std::vector<int> expected;
    for (int c = 1; c <= batch; ++c) {
      const std::int64_t piece = (batch + c - 1) / c;
      if (batch % piece == 0) expected.push_back(c);
    }
    EXPECT_EQ(options.chunks, expected) << "batch " << batch;
    for (int c = 1; c <= batch; ++c) {
      const bool runs =
          torch_cannot_run(make_plan({1, 1}, c, CheckpointMode::Never), batch).empty();
      EXPECT_EQ(runs, std::find(expected.begin(), expected.end(), c) != expected.end())
          << "batch " << batch << ", " << c << " chunks";
    }
  }
  EXPECT_EQ(torch_cannot_run(make_plan({1, 1}, 3, CheckpointMode::Never), 8),
            "a batch of 8 in 3 chunks makes micro-batches of 3 and 2: torch's stages check every "
            "micro-batch against one shape");
}

TEST(RuntimeSupport, TorchCannotCheckpointAllButTheLastNorACheckpointedSplitBackward) {
  PlannerOptions options;
  ASSERT_EQ(keep_what_the_runtime_runs(options, torch_hardware(), 8), "");
  EXPECT_EQ(options.checkpoints,
            (std::vector<CheckpointMode>{CheckpointMode::Always, CheckpointMode::Never}));
  EXPECT_EQ(options.schedules.size(), std::size(kAllScheduleKinds));  // the V ones on CPU too
  EXPECT_FALSE(options.checkpointed_split_backward);
  EXPECT_FALSE(torch_cannot_run(make_plan({1, 1}, 2, CheckpointMode::ExceptLast), 8).empty());
  Plan v = make_plan({1, 1, 1, 1}, 2, CheckpointMode::Never, ScheduleKind::ZBV);
  EXPECT_EQ(torch_cannot_run(v, 8), "");
  v.checkpoint = CheckpointMode::Always;
  EXPECT_EQ(torch_cannot_run(v, 8),
            "checkpoint always under zbv: torch recomputes a checkpointed stage at its I and again "
            "for each of its W's parameter groups (a stage of L layers with weights runs its "
            "forward L + 1 times more)");
  for (const ScheduleKind kind : kAllScheduleKinds) {
    Plan p = make_plan({1, 1, 1, 1}, 2, CheckpointMode::Always, kind);
    EXPECT_EQ(torch_cannot_run(p, 8).empty(), !splits_backward(kind)) << to_string(kind);
  }
}

TEST(RuntimeSupport, ThePlannerLeavesOutCheckpointedSplitBackwardsForTorch) {
  // Four equal layers on two devices: every plan the search ranks for torch is one torch runs as
  // predicted, and the split-backward schedules still appear without checkpointing.
  const Profile p =
      testing::make_profile(std::vector<testing::LayerSpec>(4, {1, 2, 64, 16, 16, 0}), 8);
  PlannerOptions options;
  options.top = 1000;
  options.schedules = {ScheduleKind::InterleavedZB, ScheduleKind::ZBV, ScheduleKind::OneFOneB};
  ASSERT_EQ(keep_what_the_runtime_runs(options, torch_hardware(), p), "");
  const PlanSearchResult found = find_best_plans(p, torch_hardware(), options);
  bool unsplit_checkpointed = false, split = false;
  for (const PlanCandidate& c : found.ranked) {
    EXPECT_EQ(torch_cannot_run(c.plan, p.batch_size), "") << c.plan.balance.size();
    unsplit_checkpointed |= c.plan.checkpoint == CheckpointMode::Always;
    split |= splits_backward(c.plan.schedule);
  }
  EXPECT_TRUE(unsplit_checkpointed);
  EXPECT_TRUE(split);
  EXPECT_NE(found.search_space.find("checkpoint always only where the backward is not split"),
            std::string::npos)
      << found.search_space;
  PlannerOptions only_split;
  only_split.schedules = {ScheduleKind::DualPipeV};
  only_split.checkpoints = {CheckpointMode::Always};
  EXPECT_NE(keep_what_the_runtime_runs(only_split, torch_hardware(), 8), "");
}

TEST(RuntimeSupport, PipetunesExecutorRunsEverythingAndNothingLeftIsSaid) {
  PlannerOptions options;
  Hardware own = torch_hardware();
  own.runtime = Runtime::Pipetune;
  ASSERT_EQ(keep_what_the_runtime_runs(options, own, 8), "");
  EXPECT_TRUE(options.chunks.empty());  // still every count
  EXPECT_EQ(options.checkpoints.size(), std::size(kAllCheckpointModes));
  EXPECT_EQ(options.schedules.size(), std::size(kAllScheduleKinds));

  PlannerOptions uneven;
  uneven.chunks = {3, 5};
  EXPECT_EQ(keep_what_the_runtime_runs(uneven, torch_hardware(), 8), "");
  EXPECT_EQ(uneven.chunks, (std::vector<int>{5}));  // 5 chunks of 8: four of 2
  uneven.chunks = {3};
  EXPECT_EQ(keep_what_the_runtime_runs(uneven, torch_hardware(), 8),
            "no chunk count asked for splits the batch of 8 evenly, as torch's stages need");
  PlannerOptions except_last;
  except_last.checkpoints = {CheckpointMode::ExceptLast};
  EXPECT_NE(keep_what_the_runtime_runs(except_last, torch_hardware(), 8), "");
  PlannerOptions only_v;
  only_v.schedules = {ScheduleKind::DualPipeV};
  EXPECT_EQ(keep_what_the_runtime_runs(only_v, torch_hardware(), 8), "");
}

// Layers 0 and 1 change their input in place; 3 is a view, 4 changes its input in place; 2
// makes its own output.
Profile changing_inputs() {
  Profile p = testing::make_profile({{1, 1, 0, 8, 0, 0},
                                     {1, 1, 0, 8, 0, 0},
                                     {1, 1, 0, 8, 0, 0},
                                     {1, 1, 0, 8, 0, 0},
                                     {1, 1, 0, 8, 0, 0}},
                                    4, 8);
  for (int l : {0, 1, 3, 4}) p.layers[l].output_aliases_input = true;
  for (int l : {0, 1, 4}) p.layers[l].modifies_input = true;
  return p;
}

TEST(RuntimeSupport, TorchRefusesAStageAfterTheFirstThatChangesItsInputInPlace) {
  const Profile p = changing_inputs();
  auto refused = [&](std::vector<int> balance) {
    return torch_changed_stage_input(make_plan(std::move(balance), 2, CheckpointMode::Never), p);
  };
  EXPECT_EQ(refused({2, 3}), "");  // layer 0 works on the micro-batch, which needs no gradient
  EXPECT_EQ(refused({1, 4}),
            "stage 1 starts with layer '1', which changes its input in place: torch hands "
            "the stage its input as a leaf that needs a gradient, which autograd does not let "
            "change (cut elsewhere, or make that layer out of place)");
  EXPECT_EQ(refused({3, 2}).substr(0, 50), "stage 1 reaches its input through views in layer '");
  EXPECT_NE(refused({2, 1, 2}).find("stage 2 reaches its input through views in layer '4'"),
            std::string::npos);
  EXPECT_NE(refused({4, 1}).find("stage 1 starts with layer '4'"), std::string::npos);
  EXPECT_EQ(refused({5}), "");
  // Without the flag, as a profile written before it: nothing is known, nothing refused.
  Profile unknown = p;
  for (auto& l : unknown.layers) l.modifies_input = false;
  EXPECT_EQ(torch_changed_stage_input(make_plan({1, 4}, 2, CheckpointMode::Never), unknown), "");
  // The planner is held to it for torch only, and only where a layer changes its input.
  PlannerOptions torch, own, plain;
  ASSERT_EQ(keep_what_the_runtime_runs(torch, torch_hardware(), p), "");
  EXPECT_TRUE(torch.stage_inputs_unchanged);
  Hardware pipetune_hw = torch_hardware();
  pipetune_hw.runtime = Runtime::Pipetune;
  ASSERT_EQ(keep_what_the_runtime_runs(own, pipetune_hw, p), "");
  EXPECT_FALSE(own.stage_inputs_unchanged);
  ASSERT_EQ(keep_what_the_runtime_runs(plain, torch_hardware(), unknown), "");
  EXPECT_FALSE(plain.stage_inputs_unchanged);
  // Its layers that only make views still keep a zero-bubble middle stage from ending there.
  EXPECT_EQ(search_space_text(plain, 4).substr(0, 76),
            "every balance whose middle stages do not end with a view under zero bubble, ");
  EXPECT_EQ(search_space_text(torch, 4).substr(0, 69),
            "every balance whose stages after the first do not start by changing t");
}

// Layer 2 makes a view of its input (a Flatten), layer 3 then changes it in place (a dropout):
// torch's zero-bubble I detaches a middle stage's output in place, which a view refuses.
Profile viewing_outputs() {
  Profile p = testing::make_profile({{1, 1, 16, 8, 0, 0},
                                     {1, 1, 16, 8, 0, 0},
                                     {1, 1, 0, 8, 0, 0},
                                     {1, 1, 0, 8, 0, 0},
                                     {1, 1, 16, 8, 0, 0},
                                     {1, 1, 16, 8, 0, 0}},
                                    4, 8);
  p.layers[2].output_aliases_input = true;
  p.layers[3].output_aliases_input = true;
  p.layers[3].modifies_input = true;
  return p;
}

TEST(RuntimeSupport, TorchRefusesAZeroBubbleMiddleStageEndingWithAView) {
  const Profile p = viewing_outputs();
  auto refused = [&](std::vector<int> balance, ScheduleKind kind = ScheduleKind::InterleavedZB) {
    return torch_view_stage_output(make_plan(std::move(balance), 2, CheckpointMode::Never, kind),
                                   p);
  };
  EXPECT_EQ(refused({1, 2, 2, 1}),
            "stage 1 ends with layer '2', whose output is a view of its input: torch's "
            "zero-bubble I detaches a stage's output in place, which a view refuses (cut "
            "elsewhere)");
  // Through the in-place layer after it, to the view.
  EXPECT_NE(refused({1, 3, 1, 1}).find("stage 1 ends with layer '2'"), std::string::npos);
  EXPECT_NE(refused({1, 3, 2}, ScheduleKind::ZBV).find("stage 1 ends with layer '2'"),
            std::string::npos);
  EXPECT_EQ(refused({3, 1, 1, 1}), "");  // the first stage runs no I
  EXPECT_EQ(refused({1, 1, 3, 1}), "");  // stages ending before and after the view
  EXPECT_EQ(refused({1, 1, 4}), "");     // the last stage: torch does not detach a view there
  EXPECT_EQ(refused({1, 2, 2, 1}, ScheduleKind::Interleaved1F1B), "");  // no I at all
  EXPECT_EQ(refused({1, 2, 2, 1}, ScheduleKind::OneFOneB), "");
  // The planner is held to it for torch, where a layer makes a view.
  PlannerOptions torch, own;
  ASSERT_EQ(keep_what_the_runtime_runs(torch, torch_hardware(), p), "");
  EXPECT_TRUE(torch.stage_outputs_detachable);
  EXPECT_TRUE(torch.stage_inputs_unchanged);
  EXPECT_NE(search_space_text(torch, 4).find(
                "in place and whose middle stages do not end with a view under zero bubble"),
            std::string::npos);
  Hardware pipetune_hw = torch_hardware();
  pipetune_hw.runtime = Runtime::Pipetune;
  ASSERT_EQ(keep_what_the_runtime_runs(own, pipetune_hw, p), "");
  EXPECT_FALSE(own.stage_outputs_detachable);
}

// On a model whose fastest zero-bubble plans cut right after a view, the planner for torch
// proposes only plans torch runs, where pipetune's own runtime's answer includes such cuts.
TEST(RuntimeSupport, ThePlannerForTorchProposesNoZeroBubbleStageEndingWithAView) {
  Profile p = viewing_outputs();
  p.layers[3].modifies_input = false;
  p.layers[3].output_aliases_input = false;
  for (auto& l : p.layers) l.forward_ms = l.backward_ms = {1.0, 1.0, 1.0};
  Hardware hw = replicate_device(p.device, 2);
  hw.runtime = Runtime::TorchPipelining;
  PlannerOptions torch;
  torch.schedules = {ScheduleKind::InterleavedZB};
  torch.checkpoints = {CheckpointMode::Never};
  torch.top = 100;
  PlannerOptions own = torch;
  ASSERT_EQ(keep_what_the_runtime_runs(torch, hw, p), "");
  const PlanSearchResult restricted = find_best_plans(p, hw, torch);
  ASSERT_FALSE(restricted.ranked.empty());
  for (const PlanCandidate& c : restricted.ranked)
    EXPECT_EQ(torch_view_stage_output(c.plan, p), "");
  Hardware pipetune_hw = hw;
  pipetune_hw.runtime = Runtime::Pipetune;
  const PlanSearchResult free = find_best_plans(p, pipetune_hw, own);
  EXPECT_TRUE(std::any_of(free.ranked.begin(), free.ranked.end(), [&](const PlanCandidate& c) {
    return !torch_view_stage_output(c.plan, p).empty();
  }));
}

// A frozen stem (layers 0 and 1): torch asks a gradient of every stage input, so a stage that
// starts before the first layer that trains does work the profile does not hold.
TEST(RuntimeSupport, ACutInsideAFrozenStemIsSaidToBePredictedShortForTorch) {
  Profile p = changing_inputs();
  for (auto& l : p.layers) l.param_bytes = 16;
  p.layers[0].trainable_param_bytes = 0;
  p.layers[1].trainable_param_bytes = 0;
  auto said = [&](std::vector<int> balance) {
    return torch_frozen_stem_unmodelled(make_plan(std::move(balance), 2, CheckpointMode::Never), p);
  };
  EXPECT_NE(said({1, 4}).find("stage 1 starts inside the frozen stem (no layer before layer '1' "
                              "trains)"),
            std::string::npos);
  EXPECT_NE(said({2, 3}).find("layer '2'"), std::string::npos);  // the first that trains
  EXPECT_EQ(said({3, 2}), "");
  EXPECT_EQ(said({3, 1, 1}), "");
  EXPECT_EQ(said({5}), "");
  Profile trained = p;
  for (auto& l : trained.layers) l.trainable_param_bytes = -1;
  EXPECT_EQ(torch_frozen_stem_unmodelled(make_plan({1, 4}, 2, CheckpointMode::Never), trained), "");
}

// On random models with in-place layers here and there, the planner for torch's runtime answers
// the fastest plan torch runs, as brute force over every plan finds it; where the fastest plan
// of all starts a stage with an in-place layer, its answer is slower than the unrestricted one.
TEST(RuntimeSupport, ThePlannerForTorchAnswersTheFastestPlanTorchRuns) {
  std::mt19937 rng(2026);
  int restricted = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int layers = 4 + static_cast<int>(rng() % 6);  // 4..9
    const int stages = 2 + static_cast<int>(rng() % 2);  // 2..3
    const std::int64_t batch = 1 + rng() % 8;
    Profile profile = testing::random_profile(rng, layers, batch);
    for (auto& l : profile.layers) {
      if (rng() % 2 == 0) {
        l.output_aliases_input = true;
        l.modifies_input = rng() % 3 != 0;
      }
    }
    Hardware hw = replicate_device(profile.device, stages);
    hw.runtime = Runtime::TorchPipelining;
    hw.link.bandwidth_bytes_per_s = 1e6;
    PlannerOptions options = single_stage_planner_options();
    options.top = 100;
    ASSERT_EQ(keep_what_the_runtime_runs(options, hw, profile), "");
    const auto torch_runs = [&](const Plan& plan) {
      return torch_cannot_run(plan, batch).empty() &&
             torch_changed_stage_input(plan, profile).empty();
    };
    const planner_testing::BruteForce expected =
        planner_testing::brute_force(profile, hw, false, torch_runs);
    const planner_testing::BruteForce any = planner_testing::brute_force(profile, hw);
    const PlanSearchResult result = find_best_plans(profile, hw, options);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": " << layers << " layers, "
                                      << stages << " stages, batch " << batch);
    if (planner_testing::expect_none_fits(result, expected) ||
        !planner_testing::expect_proven_best(result, expected))
      continue;
    for (const PlanCandidate& c : result.ranked) EXPECT_TRUE(torch_runs(c.plan));
    if (expected.best_ms > any.best_ms * (1 + 1e-9) &&
        torch_cannot_run(any.best_plan, batch).empty())
      ++restricted;
  }
  std::printf("the in-place layers ruled out the fastest plan in %d of 40 models\n", restricted);
  EXPECT_GE(restricted, 5);  // they did bind
}

}  // namespace
}  // namespace pipetune
