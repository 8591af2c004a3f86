// The best plan one choice away from the winner, against a brute force over balances with that
// choice fixed, through the simulator.

#include "sim/planner/one_choice_away.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <random>
#include <set>

#include "sim/schedule.hpp"
#include "sim/simulator.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

// The fastest balance of `layers` over two stages for one (chunks, checkpoint, schedule).
double brute_force(const Profile& profile, const Hardware& hw, int chunks, CheckpointMode mode,
                   ScheduleKind kind) {
  double best = std::numeric_limits<double>::infinity();
  const int layers = profile.layer_count();
  for (int first = 1; first < layers; ++first) {
    Plan plan = testing::make_plan({first, layers - first}, chunks, mode, kind);
    const SimulationResult r = Simulator(profile, hw).run(plan);
    if (r.fits()) best = std::min(best, r.iteration_ms);
  }
  return best;
}

TEST(OneChoiceAway, EachIsTheBestWithThatChoiceChanged) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> cost(0.5, 3.0);
  std::vector<testing::LayerSpec> layers;
  for (int l = 0; l < 7; ++l) layers.push_back({cost(rng), 2 * cost(rng), 4096, 512, 1024, 0});
  const Profile profile = testing::make_profile(layers, 8, 256);
  const Hardware hw = replicate_device(profile.device, 2);
  PlannerOptions options = single_stage_planner_options();
  options.chunks = {1, 2, 4, 8};
  const PlanSearchResult result = find_best_plans(profile, hw, options);
  ASSERT_FALSE(result.ranked.empty());
  ASSERT_TRUE(result.stats.proven);
  const PlanCandidate& best = result.ranked.front();

  const auto alternatives = one_choice_away(profile, hw, options, best);
  // Two other checkpoint modes (one with a single micro-batch, where except_last is never),
  // one other schedule, and half and/or twice the chunks.
  const std::size_t chunk_changes =
      (best.plan.chunks / 2 >= 1 ? 1 : 0) + (best.plan.chunks * 2 <= 8 ? 1 : 0);
  const std::size_t checkpoint_changes = best.plan.chunks == 1 ? 1 : 2;
  ASSERT_EQ(alternatives.size(), checkpoint_changes + 1 + chunk_changes);
  for (const Alternative& a : alternatives) {
    ASSERT_TRUE(a.best) << a.change;
    const Plan& p = a.best->plan;
    const int changed = (p.chunks != best.plan.chunks) + (p.checkpoint != best.plan.checkpoint) +
                        (p.schedule != best.plan.schedule);
    EXPECT_EQ(changed, 1) << a.change;  // exactly the one choice named
    EXPECT_GE(a.best->iteration_ms, best.iteration_ms - 1e-9) << a.change;  // the winner is optimal
    EXPECT_NEAR(a.best->iteration_ms, brute_force(profile, hw, p.chunks, p.checkpoint, p.schedule),
                1e-9)
        << a.change;
  }
}

// Every balance of `layers` over `stages` stages (compositions), for the brute force below.
void for_each_balance(int layers, int stages, std::vector<int>& prefix,
                      const std::function<void(const std::vector<int>&)>& visit) {
  if (static_cast<int>(prefix.size()) == stages - 1) {
    prefix.push_back(layers);
    visit(prefix);
    prefix.pop_back();
    return;
  }
  for (int n = 1; n <= layers - (stages - 1 - static_cast<int>(prefix.size())); ++n) {
    prefix.push_back(n);
    for_each_balance(layers - n, stages, prefix, visit);
    prefix.pop_back();
  }
}

TEST(OneChoiceAway, OffersEveryAllowedScheduleAndStagesPerDeviceOnly) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> cost(0.5, 3.0);
  std::vector<testing::LayerSpec> layers;
  for (int l = 0; l < 7; ++l) layers.push_back({cost(rng), 2 * cost(rng), 4096, 512, 1024, 0});
  const Profile profile = testing::make_profile(layers, 8, 256);
  const Hardware hw = replicate_device(profile.device, 2);
  PlannerOptions options = single_stage_planner_options();
  options.chunks = {2, 4};
  options.checkpoints = {CheckpointMode::Never};
  // gpipe and looped-bfs are ruled out by the user: never offered.
  options.schedules = {ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B,
                       ScheduleKind::InterleavedZB, ScheduleKind::ZBV};
  options.stages_per_device = {2, 3};
  const PlanSearchResult result = find_best_plans(profile, hw, options);
  ASSERT_FALSE(result.ranked.empty());
  const PlanCandidate& best = result.ranked.front();

  std::set<std::string> expected{"schedule 1f1b",
                                 "schedule interleaved-1f1b, 2/device",
                                 "schedule interleaved-1f1b, 3/device",
                                 "schedule interleaved-zb, 2/device",
                                 "schedule interleaved-zb, 3/device",
                                 "schedule zbv, 2/device"};
  std::string own = fmt::format("schedule {}", to_string(best.plan.schedule));
  if (is_multi_stage(best.plan.schedule))
    own += fmt::format(", {}/device", best.plan.stages_per_device);
  ASSERT_EQ(expected.erase(own), 1u) << own;
  std::set<std::string> offered;
  for (const Alternative& a : one_choice_away(profile, hw, options, best)) {
    if (a.change.rfind("schedule", 0) != 0) {
      // The other choices keep the winner's schedule and stages per device.
      if (a.best) {
        EXPECT_EQ(a.best->plan.schedule, best.plan.schedule) << a.change;
        EXPECT_EQ(a.best->plan.stages_per_device, best.plan.stages_per_device) << a.change;
      }
      continue;
    }
    offered.insert(a.change);
    if (!a.best) continue;  // torch refuses that micro-batch count for the schedule
    const Plan& p = a.best->plan;
    EXPECT_EQ(p.chunks, best.plan.chunks) << a.change;
    EXPECT_EQ(p.checkpoint, best.plan.checkpoint) << a.change;
    // Its time is the best over every balance of that (schedule, stages per device).
    double brute = std::numeric_limits<double>::infinity();
    std::vector<int> prefix;
    for_each_balance(profile.layer_count(), p.stages(), prefix, [&](const std::vector<int>& b) {
      Plan q = p;
      q.balance = b;
      const SimulationResult r = Simulator(profile, hw).run(q);
      if (r.fits()) brute = std::min(brute, r.iteration_ms);
    });
    EXPECT_NEAR(a.best->iteration_ms, brute, 1e-9) << a.change;
  }
  EXPECT_EQ(offered, expected);
}

// A change torch cannot run (DualPipeV needs as many micro-batches as stages) says why, and is
// not reported as a memory misfit.
TEST(OneChoiceAway, AChangeTorchRefusesSaysWhy) {
  std::vector<testing::LayerSpec> layers(6, testing::LayerSpec{1.0, 2.0, 0, 256, 4096, 0});
  const Profile profile = testing::make_profile(layers, 4, 64);
  const Hardware hw = replicate_device(profile.device, 2);
  PlannerOptions options = single_stage_planner_options();
  options.chunks = {2};
  options.schedules = {ScheduleKind::OneFOneB, ScheduleKind::DualPipeV};
  const PlanSearchResult result = find_best_plans(profile, hw, options);
  ASSERT_FALSE(result.ranked.empty());
  ASSERT_EQ(result.ranked.front().plan.schedule, ScheduleKind::OneFOneB);
  bool saw = false;
  for (const Alternative& a : one_choice_away(profile, hw, options, result.ranked.front())) {
    if (a.change != "schedule dualpipev, 2/device") {
      EXPECT_TRUE(a.refused.empty()) << a.change;
      continue;
    }
    saw = true;
    EXPECT_FALSE(a.best);
    EXPECT_EQ(a.refused, *schedule_refusal(ScheduleKind::DualPipeV, 2, 2, 2));
  }
  EXPECT_TRUE(saw);
}

// One micro-batch: except_last and never are the same plan, so neither is offered for the other.
TEST(OneChoiceAway, OneMicroBatchOffersNoCheckpointModeThatIsTheSamePlan) {
  std::vector<testing::LayerSpec> layers(4, testing::LayerSpec{1.0, 2.0, 0, 256, 4096, 0});
  const Profile profile = testing::make_profile(layers, 4, 64);
  const Hardware hw = replicate_device(profile.device, 2);
  PlannerOptions options = single_stage_planner_options();
  options.chunks = {1};
  const PlanSearchResult result = find_best_plans(profile, hw, options);
  ASSERT_FALSE(result.ranked.empty());
  ASSERT_EQ(result.ranked.front().plan.checkpoint, CheckpointMode::Never);
  std::vector<std::string> checkpoint_changes;
  for (const Alternative& a : one_choice_away(profile, hw, options, result.ranked.front())) {
    if (a.change.rfind("checkpoint", 0) == 0) checkpoint_changes.push_back(a.change);
  }
  EXPECT_EQ(checkpoint_changes, std::vector<std::string>{"checkpoint always"});
}

TEST(OneChoiceAway, AChangeThatFitsNowhereSaysSo) {
  // Checkpointing every micro-batch saves memory; a cap between the two modes' peaks leaves
  // "never" without a plan.
  std::vector<testing::LayerSpec> layers(4, testing::LayerSpec{1.0, 2.0, 0, 256, 4096, 0});
  const Profile profile = testing::make_profile(layers, 4, 64);
  Hardware hw = replicate_device(profile.device, 2);
  PlannerOptions options = single_stage_planner_options();
  options.chunks = {4};
  options.checkpoints = {CheckpointMode::Always};
  const PlanSearchResult lean = find_best_plans(profile, hw, options);
  ASSERT_FALSE(lean.ranked.empty());
  for (auto& d : hw.devices) d.memory_bytes = lean.ranked.front().max_peak_memory_bytes();
  options.checkpoints = {std::begin(kAllCheckpointModes), std::end(kAllCheckpointModes)};
  const PlanSearchResult capped = find_best_plans(profile, hw, options);
  ASSERT_FALSE(capped.ranked.empty());
  bool saw_misfit = false;
  for (const Alternative& a : one_choice_away(profile, hw, options, capped.ranked.front())) {
    if (a.change == "checkpoint never") saw_misfit = !a.best.has_value();
  }
  EXPECT_TRUE(saw_misfit);
}

}  // namespace
}  // namespace pipetune
