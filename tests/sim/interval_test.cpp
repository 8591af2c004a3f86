// The iteration's interval: the normal's quantiles against tabled values, one device's interval
// against its hand sum, and the order of the ends on random plans.

#include "sim/interval.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "sim/error.hpp"
#include "sim/hardware.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

using testing::make_plan;

TEST(NormalQuantile, TabledValues) {
  EXPECT_NEAR(normal_quantile(0.5), 0.0, 1e-12);
  EXPECT_NEAR(normal_quantile(0.9), 1.2815515655446004, 1e-8);
  EXPECT_NEAR(normal_quantile(0.975), 1.959963984540054, 1e-8);
  EXPECT_NEAR(normal_quantile(0.001), -3.090232306167813, 1e-8);
  EXPECT_THROW(normal_quantile(1.0), std::invalid_argument);
}

// One layer on one device, one micro-batch: the iteration is the forward (2 ms, spread 0.1) and
// the backward (4 ms, spread 0.4) end to end, so its 80 % interval is 6 ms ± z (σf + σb), with
// σ = 1.4826 × the spread and z = 1.2816.
TEST(IterationInterval, OneDeviceIsTheHandSum) {
  Profile profile = testing::make_profile({testing::LayerSpec{2.0, 4.0}}, 4);
  const Hardware hw = replicate_device(profile.device, 1);
  const Plan plan = make_plan({1}, 1, CheckpointMode::Never);
  const Simulator simulator(profile, hw);
  const IterationInterval none = iteration_interval(simulator, profile, plan);
  EXPECT_FALSE(none.from_spreads);
  EXPECT_EQ(none.low_ms, none.median_ms);
  EXPECT_EQ(none.high_ms, none.median_ms);

  for (auto& l : profile.layers) {
    l.forward_ms_spread.assign(l.forward_ms.size(), 0.1);
    l.backward_ms_spread.assign(l.backward_ms.size(), 0.4);
  }
  const Simulator with_spreads(profile, hw);
  const IterationInterval r = iteration_interval(with_spreads, profile, plan);
  const double half = normal_quantile(0.9) * 1.4826 * (0.1 + 0.4);
  EXPECT_TRUE(r.from_spreads);
  EXPECT_NEAR(r.median_ms, 6.0, 1e-12);
  EXPECT_NEAR(r.low_ms, 6.0 - half, 1e-9);
  EXPECT_NEAR(r.high_ms, 6.0 + half, 1e-9);
  EXPECT_NEAR(r.width(), 2 * half / 6.0, 1e-9);
  EXPECT_TRUE(r.holds(6.5));
  EXPECT_FALSE(r.holds(6.0 + half + 1e-6));
}

// The model's error on the machine (Hardware::model_error) adds to each half in quadrature, at
// the same quantile; alone, it is the interval.
TEST(IterationInterval, TheModelsErrorWidensItInQuadrature) {
  Profile profile = testing::make_profile({testing::LayerSpec{2.0, 4.0}}, 4);
  Hardware hw = replicate_device(profile.device, 1);
  hw.model_error = 0.1;
  const Plan plan = make_plan({1}, 1, CheckpointMode::Never);
  const double z = normal_quantile(0.9);
  const IterationInterval alone = iteration_interval(Simulator(profile, hw), profile, plan);
  EXPECT_TRUE(alone.from_model_error && !alone.from_spreads && alone.known());
  EXPECT_NEAR(alone.low_ms, 6.0 - z * 0.6, 1e-9);
  EXPECT_NEAR(alone.high_ms, 6.0 + z * 0.6, 1e-9);
  for (auto& l : profile.layers) {
    l.forward_ms_spread.assign(l.forward_ms.size(), 0.1);
    l.backward_ms_spread.assign(l.backward_ms.size(), 0.4);
  }
  const IterationInterval both = iteration_interval(Simulator(profile, hw), profile, plan);
  const double half = std::hypot(z * 1.4826 * 0.5, z * 0.6);
  EXPECT_NEAR(both.low_ms, 6.0 - half, 1e-9);
  EXPECT_NEAR(both.high_ms, 6.0 + half, 1e-9);
  // It is a field of hardware.json, checked where read.
  const Hardware again = parse_hardware(hardware_to_json(hw), "hw.json");
  EXPECT_EQ(again.model_error, 0.1);
  nlohmann::json bad = nlohmann::json::parse(hardware_to_json(hw));
  bad["model_error"] = -0.5;
  EXPECT_THROW(parse_hardware(bad.dump(), "bad.json"), InputError);
}

// The median is the simulator's prediction, bit for bit, and the ends bracket it.
TEST(IterationInterval, EndsBracketThePredictionOnRandomPlans) {
  std::mt19937 rng(80);
  for (int trial = 0; trial < 30; ++trial) {
    const int layers = 2 + static_cast<int>(rng() % 6);
    const int stages = 1 + static_cast<int>(rng() % std::min(layers, 3));
    const std::int64_t batch = 1 + static_cast<std::int64_t>(rng() % 8);
    Profile profile = testing::random_profile(rng, layers, batch);
    for (auto& l : profile.layers) {
      for (double ms : l.forward_ms) l.forward_ms_spread.push_back(ms * (rng() % 10) / 100.0);
      for (double ms : l.backward_ms) l.backward_ms_spread.push_back(ms * (rng() % 10) / 100.0);
    }
    std::vector<int> balance(stages, 1);
    for (int extra = layers - stages; extra > 0; --extra) ++balance[rng() % stages];
    const Plan plan = make_plan(balance, 1 + static_cast<int>(rng() % batch),
                                CheckpointMode::ExceptLast, ScheduleKind::OneFOneB);
    const Hardware hw = replicate_device(profile.device, stages);
    const Simulator simulator(profile, hw);
    const IterationInterval r = iteration_interval(simulator, profile, plan);
    EXPECT_EQ(r.median_ms, simulator.run(plan).iteration_ms);
    EXPECT_LE(r.low_ms, r.median_ms);
    EXPECT_GE(r.high_ms, r.median_ms);
  }
}

}  // namespace
}  // namespace pipetune
