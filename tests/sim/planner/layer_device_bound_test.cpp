// One layer's device as a single machine with heads and tails: by hand, and never above the best
// balance through the simulator (every multi-stage schedule, both runtimes, every checkpoint
// mode, unequal speeds) on models with one layer much heavier than the rest.

#include "sim/planner/layer_device_bound.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "sim/simulator.hpp"
#include "tests/sim/fixtures.hpp"
#include "tests/sim/planner/planner_brute_force.hpp"

namespace pipetune {
namespace {

using planner_testing::for_each_balance;
using planning::layer_device_bound;

// Eleven layers of forward 0.1 and backward 0.2 ms, the middle one of forward 1 and backward
// 2 ms; four micro-batches of one sample. The middle layer's device runs 4 x (1 + 2) = 12 ms of
// it, which cannot start before the five layers before it have gone forward (0.5 ms), and
// whose last backward must still go back through them (1 ms): 13.5 ms, where some device
// running the heaviest layer said 12. Split, the tail goes (a W may come last): 12.5 ms.
// Speed 2 halves the compute, each of the layer's 8 tasks adds its overhead.
TEST(LayerDeviceBound, HeadBodyAndTailByHand) {
  std::vector<testing::LayerSpec> specs(11, {0.1, 0.2, 1000, 0, 0, 0});
  specs[5] = {1.0, 2.0, 1000, 0, 0, 0};
  const Profile profile = testing::make_profile(specs, 4);
  const CostModel costs(profile);
  const std::vector<std::int64_t> sizes(4, 1);
  EXPECT_NEAR(layer_device_bound(costs, sizes, /*split=*/false, 1.0, 0.0), 13.5, 1e-12);
  EXPECT_NEAR(layer_device_bound(costs, sizes, /*split=*/true, 1.0, 0.0), 12.5, 1e-12);
  EXPECT_NEAR(layer_device_bound(costs, sizes, /*split=*/false, 2.0, 0.25), 6.75 + 8 * 0.25, 1e-12);
}

// The round trips around a heavy layer, eight micro-batches of one sample, non-split.
// A first layer of forward 2 and backward 0.2 ms, then four of 0.1 + 0.2 and one of 0.1 + 1:
// after the device's last forward of the first layer (8 x 2 = 16 ms), that micro-batch goes
// forward through the rest (0.5 ms) and back through every layer (2 ms): 18.5 ms, where head,
// body and tail give 16 + 1.6 = 17.6.
// A first layer of forward 0.2 and backward 2 ms, then five of 0.1 + 0.2: no backward of it
// starts before a micro-batch's forward through all (0.7 ms) and way back through the rest
// (1 ms), then its 16 ms of backwards: 17.7 ms, where head, body and tail give 17.6.
TEST(LayerDeviceBound, RoundTripsAroundTheLayerByHand) {
  const std::vector<std::int64_t> sizes(8, 1);
  std::vector<testing::LayerSpec> forward_heavy(6, {0.1, 0.2, 1000, 0, 0, 0});
  forward_heavy[0] = {2.0, 0.2, 1000, 0, 0, 0};
  forward_heavy[5] = {0.1, 1.0, 1000, 0, 0, 0};
  const Profile first = testing::make_profile(forward_heavy, 8);
  EXPECT_NEAR(layer_device_bound(CostModel(first), sizes, false, 1.0, 0.0), 18.5, 1e-12);
  std::vector<testing::LayerSpec> backward_heavy(6, {0.1, 0.2, 1000, 0, 0, 0});
  backward_heavy[0] = {0.2, 2.0, 1000, 0, 0, 0};
  const Profile second = testing::make_profile(backward_heavy, 8);
  EXPECT_NEAR(layer_device_bound(CostModel(second), sizes, false, 1.0, 0.0), 17.7, 1e-12);
}

// Random small models with one layer 5 to 40 times the others at a random place: the bound is
// never above the best balance simulated, and often near it.
TEST(LayerDeviceBound, NeverAboveTheBestBalance) {
  std::mt19937 rng(3303);
  int checked = 0, near = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const ScheduleKind kind = kMultiStageScheduleKinds[trial % std::size(kMultiStageScheduleKinds)];
    const int devices = 2;
    const int v = fixed_stages_per_device(kind).value_or(2);
    const int stages = v * devices;
    const int layers = stages + 1 + static_cast<int>(rng() % 4);
    const std::int64_t batch = 2 + rng() % 6;
    Profile profile = testing::random_profile(rng, layers, batch);
    LayerProfile& heavy = profile.layers[rng() % layers];
    const double factor = 5.0 + static_cast<double>(rng() % 36);
    for (double& ms : heavy.forward_ms) ms *= factor * (rng() % 2 ? 1.0 : 0.3);
    for (double& ms : heavy.backward_ms) ms *= factor;
    for (double& ms : heavy.forward_nograd_ms) ms *= factor;
    Hardware hw = replicate_device(profile.device, devices);
    hw.launch_overhead_ms = (rng() % 3) / 100.0;
    for (auto& d : hw.devices) d.speed = 0.5 * static_cast<double>(1 + rng() % 4);
    if (trial % 4 >= 2) {  // torch's runtime: the first stage's I empty, its W the whole backward
      hw.runtime = Runtime::TorchPipelining;
      testing::split_backward_dearer(profile);
    }
    const int chunks = 2 + static_cast<int>(rng() % (batch - 1));
    const CheckpointMode checkpoint = kAllCheckpointModes[rng() % 3];
    const std::vector<std::int64_t> sizes = split_batch(batch, chunks);
    if (schedule_refusal(kind, devices, v, static_cast<int>(sizes.size()))) continue;
    double max_speed = 0.0;
    for (const auto& d : hw.devices) max_speed = std::max(max_speed, d.speed);
    const CostModel costs(profile);
    const double bound =
        layer_device_bound(costs, sizes, splits_backward(kind), max_speed, hw.launch_overhead_ms);
    const Simulator simulator(profile, hw);
    Plan plan = testing::make_plan(std::vector<int>(stages, 1), chunks, checkpoint, kind);
    plan.stages_per_device = v;
    double optimum = 1e300;
    for_each_balance(layers, stages, [&](const std::vector<int>& balance) {
      plan.balance = balance;
      optimum = std::min(optimum, simulator.run(plan).iteration_ms);
    });
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " " << describe_plan(plan));
    EXPECT_LE(bound, optimum * (1 + 1e-12));
    if (bound > 0.85 * optimum) ++near;
    ++checked;
  }
  EXPECT_GE(checked, 300);
  EXPECT_GE(near, 50);  // not trivially small: within 15 % on 74 of 327
}

}  // namespace
}  // namespace pipetune
