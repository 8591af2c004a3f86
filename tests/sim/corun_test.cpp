// The co-run slowdown: shares of co-running against hand-computed ones, the simulator's fixed
// point against its closed form, and profiles without co-run times predicting as before.

#include "sim/corun.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "sim/simulator.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

using ::testing::HasSubstr;
using testing::make_plan;

TEST(CorunShares, TwoTasksOverlappingHalfOfEachOther) {
  // Device 0 computes over [0, 2), device 1 over [1, 3): each overlaps the other for 1 ms.
  const std::vector<ComputeSpan> spans{{0, 0.0, 2.0}, {1, 1.0, 3.0}};
  EXPECT_EQ(corun_shares(spans, 1), (std::vector<double>{0.5, 0.5}));
}

TEST(CorunShares, CountsOtherDevicesUpToTheCoRunners) {
  // Device 0 over [0, 4); device 1 over [0, 2); device 2 over [1, 4). Measured beside two
  // co-runners, device 0 sees 1 other in [0, 1), 2 in [1, 2), 1 in [2, 4):
  // (1/2 + 1 + 2 × 1/2) / 4. Device 1: 1 other in [0, 1), 2 in [1, 2): (1/2 + 1) / 2.
  // Device 2: 2 others in [1, 2), 1 in [2, 4): (1 + 2 × 1/2) / 3.
  const std::vector<ComputeSpan> spans{{0, 0.0, 4.0}, {1, 0.0, 2.0}, {2, 1.0, 4.0}};
  const auto shares = corun_shares(spans, 2);
  EXPECT_DOUBLE_EQ(shares[0], 2.5 / 4);
  EXPECT_DOUBLE_EQ(shares[1], 1.5 / 2);
  EXPECT_DOUBLE_EQ(shares[2], 2.0 / 3);
  // Beside one co-runner, any other device computing counts fully.
  const auto one = corun_shares(spans, 1);
  EXPECT_DOUBLE_EQ(one[0], 1.0);
  EXPECT_DOUBLE_EQ(one[1], 1.0);
  EXPECT_DOUBLE_EQ(one[2], 1.0);
}

TEST(CorunShares, OwnDeviceNeverCountsAndEmptyTasksHaveNone) {
  // One device's tasks back to back, and a zero-length task elsewhere: nothing co-runs.
  const std::vector<ComputeSpan> spans{{0, 0.0, 1.0}, {0, 1.0, 3.0}, {1, 2.0, 2.0}};
  EXPECT_EQ(corun_shares(spans, 1), (std::vector<double>{0.0, 0.0, 0.0}));
}

// Two one-layer stages on two devices, GPipe over 2 micro-batches, ideal link. Solo: 0F0
// [0, 2], 0F1 [2, 4] beside 1F0 [2, 3], then 1F1 after 0F1. Only stage 0's forward slows down
// beside a co-runner (2 ms solo, 4 ms co-run); 0F1 overlaps 1F0 for 1 ms whatever its length
// d ≥ 1, so it settles where d = 2 + (1 / d)(4 − 2): d = 1 + √3. 0F1 is on the critical path
// (1F1 waits for it), and nothing after it changes its time, so the iteration grows by d − 2.
TEST(CorunSimulator, HandComputedTwoDevices) {
  testing::LayerSpec first{2.0, 1.0}, second{1.0, 1.0};
  Profile profile = testing::make_profile({first, second}, 2);
  const Hardware hw = replicate_device(profile.device, 2);
  const Plan plan = make_plan({1, 1}, 2, CheckpointMode::Never);
  const double solo = Simulator(profile, hw).run(plan).iteration_ms;

  profile.co_runners = 1;
  for (auto& layer : profile.layers) {
    layer.forward_corun_ms = layer.forward_ms;
    layer.backward_corun_ms = layer.backward_ms;
  }
  for (double& ms : profile.layers[0].forward_corun_ms) ms = 4.0;
  const auto r = Simulator(profile, hw).run(plan);
  const double d = 1.0 + std::sqrt(3.0);
  EXPECT_NEAR(r.iteration_ms, solo + d - 2.0, 1e-8);
  bool seen = false;
  for (const SimTask& t : r.tasks) {
    if (t.kind != TaskKind::Forward) continue;
    if (t.stage == 0 && t.micro_batch == 1) {
      EXPECT_NEAR(t.duration_ms(), d, 1e-8);
      seen = true;
    } else {
      EXPECT_DOUBLE_EQ(t.duration_ms(), t.stage == 0 ? 2.0 : 1.0) << t.label();
    }
  }
  EXPECT_TRUE(seen);
}

// What the planner charges a simulation by (Simulator::engine_runs()): one engine run without
// co-run times; with them a fixed point first, one run that moves nothing where they equal the
// solo times, more where they move the durations, and the final run.
TEST(CorunSimulator, EngineRunsCountTheFixedPointsRounds) {
  testing::LayerSpec first{2.0, 1.0}, second{1.0, 1.0};
  Profile profile = testing::make_profile({first, second}, 2);
  const Hardware hw = replicate_device(profile.device, 2);
  const Plan plan = make_plan({1, 1}, 2, CheckpointMode::Never);
  const Simulator solo(profile, hw);
  solo.run(plan);
  solo.run(plan);
  EXPECT_EQ(solo.engine_runs(), 2u);

  profile.co_runners = 1;
  for (auto& layer : profile.layers) {
    layer.forward_corun_ms = layer.forward_ms;
    layer.backward_corun_ms = layer.backward_ms;
  }
  const Simulator unmoved(profile, hw);
  unmoved.run(plan);
  EXPECT_EQ(unmoved.engine_runs(), 2u);

  for (double& ms : profile.layers[0].forward_corun_ms) ms = 4.0;
  const Simulator moved(profile, hw);
  moved.run(plan);
  EXPECT_GE(moved.engine_runs(), 4u);  // solo times, the first shares' times, at least one more
  EXPECT_LE(moved.engine_runs(), 33u);
}

// A profile whose co-run times equal its solo times predicts bit for bit what the same profile
// without them predicts, over random plans; and one with dearer co-run times lies between the
// solo prediction and the one with every task at its co-run time (with each stream's order
// fixed, the iteration is a longest path, which grows with every duration).
TEST(CorunSimulator, RandomPlansWithoutSlowdownAreUnchangedAndWithItBounded) {
  std::mt19937 rng(16);
  const ScheduleKind kinds[] = {ScheduleKind::GPipe, ScheduleKind::OneFOneB};
  const CheckpointMode modes[] = {CheckpointMode::Never, CheckpointMode::ExceptLast,
                                  CheckpointMode::Always};
  for (int trial = 0; trial < 60; ++trial) {
    const int layers = 2 + static_cast<int>(rng() % 7);
    const int stages = 1 + static_cast<int>(rng() % std::min(layers, 4));
    const std::int64_t batch = 1 + static_cast<std::int64_t>(rng() % 16);
    const Profile solo = testing::random_profile(rng, layers, batch);
    std::vector<int> balance(stages, 1);
    for (int extra = layers - stages; extra > 0; --extra) ++balance[rng() % stages];
    const int chunks = 1 + static_cast<int>(rng() % batch);
    const Plan plan = make_plan(balance, chunks, modes[rng() % 3], kinds[rng() % 2]);
    Hardware hw = replicate_device(solo.device, stages);
    hw.link.bandwidth_bytes_per_s = 1e5 + static_cast<double>(rng() % 1000) * 1e3;
    hw.launch_overhead_ms = (rng() % 3) * 0.05;

    Profile same = solo, slower = solo, all_slow = solo;
    same.co_runners = slower.co_runners = 1 + static_cast<int>(rng() % 3);
    // One slowdown for every layer: the simulator slows the unmeasured parts (the forward
    // without autograd) by their stage's factor, which is then this one.
    const double factor = 1.0 + (rng() % 20) / 10.0;  // 1.0 .. 2.9
    for (int l = 0; l < layers; ++l) {
      same.layers[l].forward_corun_ms = solo.layers[l].forward_ms;
      same.layers[l].backward_corun_ms = solo.layers[l].backward_ms;
      for (double ms : solo.layers[l].forward_ms)
        slower.layers[l].forward_corun_ms.push_back(ms * factor);
      for (double ms : solo.layers[l].backward_ms)
        slower.layers[l].backward_corun_ms.push_back(ms * factor);
      // Every task at its co-run time, as the simulator scales the unmeasured halves.
      for (double& ms : all_slow.layers[l].forward_ms) ms *= factor;
      for (double& ms : all_slow.layers[l].backward_ms) ms *= factor;
      for (double& ms : all_slow.layers[l].forward_nograd_ms) ms *= factor;
    }
    const auto base = Simulator(solo, hw).run(plan);
    const auto unchanged = Simulator(same, hw).run(plan);
    const std::string what = describe_plan(plan);
    ASSERT_EQ(unchanged.iteration_ms, base.iteration_ms) << what;
    ASSERT_EQ(unchanged.tasks.size(), base.tasks.size());
    for (std::size_t t = 0; t < base.tasks.size(); ++t) {
      ASSERT_EQ(unchanged.tasks[t].start_ms, base.tasks[t].start_ms) << what;
      ASSERT_EQ(unchanged.tasks[t].end_ms, base.tasks[t].end_ms) << what;
    }
    for (std::size_t d = 0; d < base.devices.size(); ++d) {
      EXPECT_EQ(unchanged.devices[d].busy_ms, base.devices[d].busy_ms);
      EXPECT_EQ(unchanged.devices[d].peak_memory_bytes, base.devices[d].peak_memory_bytes);
    }
    const double slowed = Simulator(slower, hw).run(plan).iteration_ms;
    const double ceiling = Simulator(all_slow, hw).run(plan).iteration_ms;
    EXPECT_GE(slowed, base.iteration_ms * (1 - 1e-12)) << what;
    EXPECT_LE(slowed, ceiling * (1 + 1e-12)) << what;
    if (stages == 1) {  // nothing runs beside it
      EXPECT_EQ(slowed, base.iteration_ms) << what;
    }
  }
}

TEST(CorunProfile, OldProfilesRoundTripWithoutCoRunFields) {
  std::mt19937 rng(3);
  const Profile p = testing::random_profile(rng, 4, 8);
  const std::string text = profile_to_json(p);
  EXPECT_THAT(text, ::testing::Not(HasSubstr("corun")));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("co_runners")));
  EXPECT_FALSE(parse_profile(text, "old.json").has_corun_times());
}

TEST(CorunProfile, CoRunTimesRoundTripAndAreCheckedTogether) {
  std::mt19937 rng(4);
  Profile p = testing::random_profile(rng, 3, 4);
  p.co_runners = 2;
  for (auto& l : p.layers) {
    for (double ms : l.forward_ms) l.forward_corun_ms.push_back(ms * 1.5);
    for (double ms : l.backward_ms) l.backward_corun_ms.push_back(ms * 1.25);
  }
  const Profile q = parse_profile(profile_to_json(p), "again.json");
  EXPECT_EQ(q.co_runners, 2);
  EXPECT_EQ(q.layers[1].forward_corun_ms, p.layers[1].forward_corun_ms);
  EXPECT_EQ(q.layers[2].backward_corun_ms, p.layers[2].backward_corun_ms);

  const auto error = [](const Profile& bad) {
    return testing::error_of(
        [](const std::string& t, const std::string& s) { parse_profile(t, s); },
        profile_to_json(bad));
  };
  Profile no_count = p;
  no_count.co_runners = 0;
  EXPECT_THAT(error(no_count),
              HasSubstr("layers[0]: has forward_corun_ms, but the profile has no co_runners"));
  Profile one_layer_missing = p;
  one_layer_missing.layers[1].forward_corun_ms.clear();
  one_layer_missing.layers[1].backward_corun_ms.clear();
  EXPECT_THAT(error(one_layer_missing), HasSubstr("layers[1]: missing field \"forward_corun_ms\""));
  nlohmann::json half = nlohmann::json::parse(profile_to_json(p));
  half["layers"][2].erase("backward_corun_ms");
  EXPECT_EQ(
      testing::error_of([](const std::string& t, const std::string& s) { parse_profile(t, s); },
                        half.dump()),
      "in.json: layers[2]: missing field \"backward_corun_ms\" (forward_corun_ms and "
      "backward_corun_ms come together)");
  Profile wrong_length = p;
  wrong_length.layers[0].forward_corun_ms.pop_back();
  EXPECT_THAT(error(wrong_length), HasSubstr("forward_corun_ms"));
}

}  // namespace
}  // namespace pipetune
