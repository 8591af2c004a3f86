// The cache model: coldness against hand-computed byte distances, the simulator's times against
// hand-summed ones, and profiles without cold times predicting as before.

#include "sim/cache_model.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "sim/simulator.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

using ::testing::HasSubstr;
using testing::make_plan;

CacheTask task(TaskKind kind, int micro_batch, int device = 0, int stage = 0,
               std::int64_t kept = 100, bool keeps = true) {
  return {device, kind, stage, micro_batch, keeps, kept};
}

TEST(CacheColdness, GPipeOrderAgainstOneFOneBOrder) {
  using enum TaskKind;
  // GPipe, one stage, two micro-batches of 100 kept bytes, a cache of 400: F1 writes past the
  // 100 bytes F0 wrote since the last free (0.25); B1 follows F1 at once (0); B0 finds F1 and B1
  // touched 200 bytes since F0 (0.5).
  const std::vector<CacheTask> gpipe{task(Forward, 0), task(Forward, 1), task(Backward, 1),
                                     task(Backward, 0)};
  EXPECT_EQ(cache_coldness(gpipe, 1, 400), (std::vector<double>{0.0, 0.25, 0.0, 0.5}));
  // 1F1B: each backward right after its forward, each forward into memory just freed.
  const std::vector<CacheTask> one_f_one_b{task(Forward, 0), task(Backward, 0), task(Forward, 1),
                                           task(Backward, 1)};
  EXPECT_EQ(cache_coldness(one_f_one_b, 1, 400), (std::vector<double>{0.0, 0.0, 0.0, 0.0}));
  // Beyond the cache, cold through and through.
  EXPECT_EQ(cache_coldness(gpipe, 1, 100), (std::vector<double>{0.0, 1.0, 0.0, 1.0}));
}

TEST(CacheColdness, SplitBackwardsCheckpointsAndDevicesApart) {
  using enum TaskKind;
  // I touches the kept tensors again, so W right after it is hot; W frees them.
  const std::vector<CacheTask> split{task(Forward, 0),   task(Forward, 1),    task(InputGrad, 0),
                                     task(InputGrad, 1), task(WeightGrad, 0), task(WeightGrad, 1),
                                     task(Forward, 2)};
  // I0: F1 since F0 (100 / 400); I1: I0 since F1 (100); W0: I1 since I0 (100); W1: W0 since I1
  // (100); F2: nothing since W1 freed (0).
  EXPECT_EQ(cache_coldness(split, 1, 400),
            (std::vector<double>{0.0, 0.25, 0.25, 0.25, 0.25, 0.25, 0.0}));
  // A checkpointed forward keeps nothing; its recompute writes what the backward reads at once.
  const std::vector<CacheTask> checkpointed{task(Forward, 0, 0, 0, 100, false),
                                            task(Forward, 1, 0, 0, 100, false),
                                            task(Recompute, 1),
                                            task(Backward, 1),
                                            task(Recompute, 0),
                                            task(Backward, 0)};
  EXPECT_EQ(cache_coldness(checkpointed, 1, 400),
            (std::vector<double>{0.0, 0.0, 0.0, 0.0, 0.0, 0.0}));
  // Each device has its own cache: device 1's tasks between device 0's move nothing there.
  const std::vector<CacheTask> two{task(Forward, 0, 0, 0), task(Forward, 0, 1, 1, 300),
                                   task(Backward, 0, 1, 1, 300), task(Backward, 0, 0, 0)};
  EXPECT_EQ(cache_coldness(two, 2, 400), (std::vector<double>{0.0, 0.0, 0.0, 0.0}));
}

// One layer (forward 1 ms, backward 2 ms; cold 3 and 6 ms) on one device, two micro-batches,
// a cache of one byte so that any distance is cold. GPipe: F0 hot, F1 cold (it writes past
// F0's tensors), B1 hot (right after F1), B0 cold: 1 + 3 + 2 + 6 = 12 ms. 1F1B: every task hot,
// 6 ms, as without cold times.
TEST(CacheSimulator, HandSummedOneDevice) {
  testing::LayerSpec layer{1.0, 2.0, 0, 0, 64, 0};
  Profile profile = testing::make_profile({layer}, 2);
  const Hardware hw = replicate_device(profile.device, 1);
  const Plan gpipe = make_plan({1}, 2, CheckpointMode::Never, ScheduleKind::GPipe);
  const Plan one_f_one_b = make_plan({1}, 2, CheckpointMode::Never, ScheduleKind::OneFOneB);
  EXPECT_DOUBLE_EQ(Simulator(profile, hw).run(gpipe).iteration_ms, 6.0);

  profile.device.cache_bytes = 1;
  for (auto& l : profile.layers) {
    for (double ms : l.forward_ms) l.forward_cold_ms.push_back(3 * ms);
    for (double ms : l.backward_ms) l.backward_cold_ms.push_back(3 * ms);
  }
  const auto r = Simulator(profile, hw).run(gpipe);
  EXPECT_DOUBLE_EQ(r.iteration_ms, 12.0);
  for (const SimTask& t : r.tasks) {
    const bool cold = t.micro_batch == (t.kind == TaskKind::Forward ? 1 : 0);
    const double hot_ms = t.kind == TaskKind::Forward ? 1.0 : 2.0;
    EXPECT_DOUBLE_EQ(t.duration_ms(), cold ? 3 * hot_ms : hot_ms) << t.label();
  }
  EXPECT_DOUBLE_EQ(Simulator(profile, hw).run(one_f_one_b).iteration_ms, 6.0);
}

// Cold times equal to the hot ones predict bit for bit what no cold times predict; dearer ones
// never predict less.
TEST(CacheSimulator, RandomPlansWithoutExtraAreUnchangedAndWithItNoShorter) {
  std::mt19937 rng(63);
  const ScheduleKind kinds[] = {ScheduleKind::GPipe, ScheduleKind::OneFOneB,
                                ScheduleKind::Interleaved1F1B, ScheduleKind::ZBV};
  for (int trial = 0; trial < 40; ++trial) {
    const int layers = 4 + static_cast<int>(rng() % 5);
    const std::int64_t batch = 2 + static_cast<std::int64_t>(rng() % 8);
    const Profile hot = testing::random_profile(rng, layers, batch);
    const ScheduleKind kind = kinds[rng() % 4];
    // The multi-stage ones: four stages, two per device, two micro-batches.
    const bool looped = kind == ScheduleKind::ZBV || kind == ScheduleKind::Interleaved1F1B;
    const int stages = looped ? 4 : 1 + static_cast<int>(rng() % 4);
    std::vector<int> balance(stages, 1);
    for (int extra = layers - stages; extra > 0; --extra) ++balance[rng() % stages];
    Plan plan = make_plan(balance, looped ? 2 : 1 + static_cast<int>(rng() % batch),
                          CheckpointMode::Never, kind);
    if (looped) plan.stages_per_device = 2;
    const Hardware hw = replicate_device(hot.device, looped ? 2 : stages);
    Profile same = hot, dearer = hot;
    same.device.cache_bytes = dearer.device.cache_bytes =
        1 + static_cast<std::int64_t>(rng() % 4096);
    for (int l = 0; l < layers; ++l) {
      same.layers[l].forward_cold_ms = hot.layers[l].forward_ms;
      same.layers[l].backward_cold_ms = hot.layers[l].backward_ms;
      for (double ms : hot.layers[l].forward_ms) dearer.layers[l].forward_cold_ms.push_back(ms * 2);
      for (double ms : hot.layers[l].backward_ms)
        dearer.layers[l].backward_cold_ms.push_back(ms * 2);
    }
    const std::string what = describe_plan(plan);
    const auto base = Simulator(hot, hw).run(plan);
    const auto unchanged = Simulator(same, hw).run(plan);
    ASSERT_EQ(unchanged.iteration_ms, base.iteration_ms) << what;
    for (std::size_t d = 0; d < base.devices.size(); ++d)
      EXPECT_EQ(unchanged.devices[d].peak_memory_bytes, base.devices[d].peak_memory_bytes) << what;
    EXPECT_GE(Simulator(dearer, hw).run(plan).iteration_ms, base.iteration_ms * (1 - 1e-12))
        << what;
  }
}

// Two stages of one layer each (forward 1 ms, backward 2 ms, cold times as hot), 1F1B, two
// micro-batches: each device's first task of the step, its first forward, takes the step-start
// time (1.5 and 3 ms); every other task its hot time. Step-start times equal to the hot ones
// predict bit for bit what none predict.
TEST(CacheSimulator, EachDevicesFirstForwardTakesItsStepStartTime) {
  testing::LayerSpec layer{1.0, 2.0, 0, 0, 64, 0};
  Profile profile = testing::make_profile({layer, layer}, 2);
  profile.device.cache_bytes = 1 << 20;
  for (auto& l : profile.layers) {
    l.forward_cold_ms = l.forward_ms;
    l.backward_cold_ms = l.backward_ms;
  }
  const Hardware hw = replicate_device(profile.device, 2);
  const Plan plan = make_plan({1, 1}, 2, CheckpointMode::Never, ScheduleKind::OneFOneB);
  const auto base = Simulator(profile, hw).run(plan);

  Profile same = profile;
  for (auto& l : same.layers) l.forward_step_start_ms = l.forward_ms;
  ASSERT_TRUE(same.has_step_start_times());
  EXPECT_EQ(Simulator(same, hw).run(plan).iteration_ms, base.iteration_ms);

  Profile first = profile;
  for (auto& l : first.layers) l.forward_step_start_ms = {1.5, 1.5};
  first.layers[1].forward_step_start_ms = {3.0, 3.0};
  const auto r = Simulator(first, hw).run(plan);
  int firsts = 0;
  for (const SimTask& t : r.tasks) {
    if (!is_compute(t.kind)) continue;
    const bool step_start = t.kind == TaskKind::Forward && t.micro_batch == 0;
    firsts += step_start ? 1 : 0;
    const double hot_ms = t.kind == TaskKind::Forward ? 1.0 : 2.0;
    EXPECT_DOUBLE_EQ(t.duration_ms(), step_start ? (t.stage == 0 ? 1.5 : 3.0) : hot_ms)
        << t.label();
  }
  EXPECT_EQ(firsts, 2);
  // Both first forwards lie on the step's critical path: 0.5 + 2 ms more.
  EXPECT_DOUBLE_EQ(r.iteration_ms, base.iteration_ms + 2.5);
}

TEST(CacheProfile, StepStartTimesRoundTripAndComeWithTheColdTimes) {
  std::mt19937 rng(7);
  Profile p = testing::random_profile(rng, 3, 4);
  p.device.cache_bytes = 2 << 20;
  for (auto& l : p.layers) {
    l.forward_cold_ms = l.forward_ms;
    l.backward_cold_ms = l.backward_ms;
    for (double ms : l.forward_ms) l.forward_step_start_ms.push_back(ms * 1.2);
  }
  const Profile q = parse_profile(profile_to_json(p), "again.json");
  EXPECT_TRUE(q.has_step_start_times());
  EXPECT_EQ(q.layers[2].forward_step_start_ms, p.layers[2].forward_step_start_ms);

  const auto error = [](const Profile& bad) {
    return testing::error_of(
        [](const std::string& t, const std::string& s) { parse_profile(t, s); },
        profile_to_json(bad));
  };
  Profile no_cold = p;
  no_cold.device.cache_bytes = 0;
  for (auto& l : no_cold.layers) l.forward_cold_ms.clear(), l.backward_cold_ms.clear();
  EXPECT_THAT(error(no_cold), HasSubstr("layers[0]: has forward_step_start_ms, but no "
                                        "forward_cold_ms"));
  Profile one_without = p;
  one_without.layers[1].forward_step_start_ms.clear();
  EXPECT_THAT(error(one_without), HasSubstr("layers[0]: has forward_step_start_ms, but layer"));
  Profile first_without = p;
  first_without.layers[0].forward_step_start_ms.clear();
  EXPECT_THAT(error(first_without), HasSubstr("layers[1]: has forward_step_start_ms, but layer"));
}

TEST(CacheProfile, ColdTimesRoundTripAndNeedTheCache) {
  std::mt19937 rng(5);
  Profile p = testing::random_profile(rng, 3, 4);
  EXPECT_THAT(profile_to_json(p), ::testing::Not(HasSubstr("cold")));
  EXPECT_FALSE(parse_profile(profile_to_json(p), "old.json").has_cold_times());
  p.device.cache_bytes = 2 << 20;
  for (auto& l : p.layers) {
    for (double ms : l.forward_ms) l.forward_cold_ms.push_back(ms * 1.5);
    for (double ms : l.backward_ms) l.backward_cold_ms.push_back(ms * 1.25);
  }
  const Profile q = parse_profile(profile_to_json(p), "again.json");
  EXPECT_EQ(q.device.cache_bytes, 2 << 20);
  EXPECT_EQ(q.layers[2].forward_cold_ms, p.layers[2].forward_cold_ms);
  EXPECT_EQ(q.layers[1].backward_cold_ms, p.layers[1].backward_cold_ms);

  const auto error = [](const Profile& bad) {
    return testing::error_of(
        [](const std::string& t, const std::string& s) { parse_profile(t, s); },
        profile_to_json(bad));
  };
  Profile no_cache = p;
  no_cache.device.cache_bytes = 0;
  EXPECT_THAT(error(no_cache), HasSubstr("has forward_cold_ms, but the profile's device has no "
                                         "cache_bytes"));
  Profile one_layer_hot = p;
  one_layer_hot.layers[1].forward_cold_ms.clear();
  one_layer_hot.layers[1].backward_cold_ms.clear();
  EXPECT_THAT(error(one_layer_hot), HasSubstr("layers[1]: missing field \"forward_cold_ms\""));
  nlohmann::json half = nlohmann::json::parse(profile_to_json(p));
  half["layers"][0].erase("backward_cold_ms");
  EXPECT_EQ(
      testing::error_of([](const std::string& t, const std::string& s) { parse_profile(t, s); },
                        half.dump()),
      "in.json: layers[0]: missing field \"backward_cold_ms\" (forward_cold_ms and "
      "backward_cold_ms come together)");
}

}  // namespace
}  // namespace pipetune
