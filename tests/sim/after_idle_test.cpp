// What a wait costs the work after it: the curve, the debt a device pays on, the probe's fit,
// the profile's field, and the simulator's fixed point against timelines worked out by hand.

#include "sim/after_idle.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "sim/simulator.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

using ::testing::HasSubstr;
using testing::make_plan;

const std::vector<AfterIdlePoint> kCurve{{1.0, 0.5}, {4.0, 2.0}};

TEST(AfterIdle, ExtraIsLinearFromZeroThroughThePointsThenFlat) {
  EXPECT_DOUBLE_EQ(after_idle_extra_ms(kCurve, 0.0), 0.0);
  EXPECT_DOUBLE_EQ(after_idle_extra_ms(kCurve, 0.5), 0.25);
  EXPECT_DOUBLE_EQ(after_idle_extra_ms(kCurve, 1.0), 0.5);
  EXPECT_DOUBLE_EQ(after_idle_extra_ms(kCurve, 2.0), 1.0);
  EXPECT_DOUBLE_EQ(after_idle_extra_ms(kCurve, 4.0), 2.0);
  EXPECT_DOUBLE_EQ(after_idle_extra_ms(kCurve, 100.0), 2.0);
  EXPECT_DOUBLE_EQ(after_idle_extra_ms({}, 100.0), 0.0);
}

// Waits 4 (owes 2.0), then tasks of 0.5, 1.0 and 3.0 back to back pay 0.5, 1.0 and the last
// 0.5; a wait of 1 (owes 0.5) then renews nothing bigger than what a later wait owes.
TEST(AfterIdle, ADeviceCarriesWhatAShortTaskCouldNotPay) {
  const std::vector<double> idle{4.0, 0.0, 0.0, 1.0, 2.0};
  const std::vector<double> work{0.5, 1.0, 3.0, 0.2, 5.0};
  AfterIdleDebt debt;
  std::vector<double> pays;
  for (std::size_t k = 0; k < idle.size(); ++k) pays.push_back(debt.pay(kCurve, idle[k], work[k]));
  EXPECT_THAT(pays, ::testing::ElementsAre(0.5, 1.0, 0.5, 0.2, 1.0));
}

// Medians over the back-to-back one's; the fall from 0.25 to 0.15 is pooled to 0.2 (equal
// weights), and an extra below zero is zero.
TEST(AfterIdle, FitPoolsFallingPointsAndClampsAtZero) {
  const std::vector<double> idle{0.0, 1.0, 2.0, 5.0};
  const std::vector<std::vector<double>> samples{
      {1.0, 1.1, 0.9}, {1.3, 1.2, 1.25}, {1.1, 1.15, 1.2}, {2.0, 2.1, 1.9}};
  const auto points = fit_after_idle(idle, samples);
  ASSERT_EQ(points.size(), 3u);
  EXPECT_DOUBLE_EQ(points[0].idle_ms, 1.0);
  EXPECT_NEAR(points[0].extra_ms, 0.2, 1e-12);
  EXPECT_NEAR(points[1].extra_ms, 0.2, 1e-12);
  EXPECT_NEAR(points[2].extra_ms, 1.0, 1e-12);
  const std::vector<std::vector<double>> faster{{1.0, 1.0}, {0.9, 0.8}};
  EXPECT_EQ(fit_after_idle(std::vector<double>{0.0, 1.0}, faster)[0].extra_ms, 0.0);
  EXPECT_THROW(fit_after_idle(std::vector<double>{0.0}, std::vector<std::vector<double>>{{1.0}}),
               std::invalid_argument);
}

// The probe's layers against every run of consecutive layers: the least total of those taking
// at least 2 ms (the earliest of equal ones), or all of them where together they take less.
TEST(AfterIdle, CheapestRunIsTheBruteForceOne) {
  std::mt19937 rng(62);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<double> ms(1 + rng() % 12);
    for (double& m : ms) m = static_cast<double>(rng() % 9) * 0.25;  // 0 to 2 ms, ties
    double total = 0.0;
    for (const double m : ms) total += m;
    LayerRun expected{0, ms.size(), total};
    if (total >= 2.0) {
      for (std::size_t a = 0; a < ms.size(); ++a) {
        double sum = 0.0;
        for (std::size_t b = a; b < ms.size(); ++b) {
          sum += ms[b];
          if (sum >= 2.0 && sum < expected.ms) expected = {a, b + 1, sum};
          if (sum >= 2.0) break;
        }
      }
    }
    const LayerRun run = cheapest_run(ms, 2.0);
    ASSERT_DOUBLE_EQ(run.ms, expected.ms) << trial;
    ASSERT_EQ(run.first, expected.first) << trial;
    ASSERT_EQ(run.end, expected.end) << trial;
  }
}

TEST(AfterIdle, ProfileKeepsItsPointsAndRejectsThemOutOfOrder) {
  Profile p = testing::uniform_profile(2, 1.0, 2.0, 2);
  p.device.after_idle = kCurve;
  const Profile back = parse_profile(profile_to_json(p), "p.json");
  ASSERT_EQ(back.device.after_idle.size(), 2u);
  EXPECT_EQ(back.device.after_idle[1].idle_ms, 4.0);
  EXPECT_EQ(back.device.after_idle[1].extra_ms, 2.0);
  EXPECT_FALSE(parse_profile(profile_to_json(testing::uniform_profile(2, 1.0, 2.0, 2)), "p.json")
                   .has_after_idle());

  p.device.after_idle = {{2.0, 0.5}, {1.0, 0.7}};
  const std::string message = testing::error_of(parse_profile, profile_to_json(p));
  EXPECT_THAT(message, HasSubstr("in.json"));
  EXPECT_THAT(message, HasSubstr("after_idle"));
  EXPECT_THAT(message, HasSubstr("a positive idle, above the point's before it"));
}

// Two one-layer stages on two devices, GPipe, one micro-batch, ideal links. Without the curve:
// 0F0 [0, 2], 1F0 [2, 2.4], 1B0 [2.4, 3.4], 0B0 [3.4, 6.4]. With it: 1F0 waited 2 from the
// step's start and owes 1.0, pays 0.4 (its work) and leaves 0.6 to 1B0, right after it:
// 1F0 [2, 2.8], 1B0 [2.8, 4.4]. 0B0 waited 4.4 - 2 = 2.4 and pays 0.5 + 1.4 / 3 × 1.5 = 1.2:
// [4.4, 8.6].
TEST(AfterIdleSimulator, HandComputedTwoDevices) {
  testing::LayerSpec first{2.0, 3.0}, second{0.4, 1.0};
  Profile profile = testing::make_profile({first, second}, 1);
  const Hardware hw = replicate_device(profile.device, 2);
  const Plan plan = make_plan({1, 1}, 1, CheckpointMode::Never);
  EXPECT_NEAR(Simulator(profile, hw).run(plan).iteration_ms, 6.4, 1e-12);

  profile.device.after_idle = kCurve;
  const SimulationResult r = Simulator(profile, hw).run(plan);
  EXPECT_NEAR(r.iteration_ms, 8.6, 1e-9);
  for (const SimTask& t : r.tasks) {
    if (!is_compute(t.kind)) continue;
    const double expected = t.stage == 0 ? (t.kind == TaskKind::Forward ? 2.0 : 4.2)
                                         : (t.kind == TaskKind::Forward ? 0.8 : 1.6);
    EXPECT_NEAR(t.duration_ms(), expected, 1e-9) << t.label();
  }
  EXPECT_NEAR(r.devices[0].busy_ms, 6.2, 1e-9);
}

// A curve only adds time: over random plans and schedules the prediction is at least the one
// without it, and at most that plus the largest extra for every compute task.
TEST(AfterIdleSimulator, RandomPlansLieBetweenNoCostAndEveryTaskPayingTheMost) {
  std::mt19937 rng(61);
  const ScheduleKind kinds[] = {ScheduleKind::GPipe, ScheduleKind::OneFOneB};
  for (int trial = 0; trial < 40; ++trial) {
    const int layers = 2 + static_cast<int>(rng() % 7);
    const int stages = 1 + static_cast<int>(rng() % std::min(layers, 4));
    const std::int64_t batch = 1 + static_cast<std::int64_t>(rng() % 8);
    Profile profile = testing::random_profile(rng, layers, batch);
    std::vector<int> balance(stages, 1);
    for (int extra = layers - stages; extra > 0; --extra) ++balance[rng() % stages];
    const Plan plan = make_plan(balance, 1 + static_cast<int>(rng() % batch), CheckpointMode::Never,
                                kinds[rng() % 2]);
    const Hardware hw = replicate_device(profile.device, stages);
    const SimulationResult without = Simulator(profile, hw).run(plan);
    profile.device.after_idle = {{0.5, 0.1}, {5.0, 0.7}};
    const SimulationResult with = Simulator(profile, hw).run(plan);
    std::size_t compute = 0;
    for (const SimTask& t : with.tasks) compute += is_compute(t.kind) ? 1 : 0;
    const std::string what = describe_plan(plan);
    EXPECT_GE(with.iteration_ms, without.iteration_ms - 1e-9) << what;
    EXPECT_LE(with.iteration_ms, without.iteration_ms + 0.7 * compute + 1e-9) << what;
  }
}

}  // namespace
}  // namespace pipetune
