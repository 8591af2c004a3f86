#include "sim/critical_path.hpp"

#include <gtest/gtest.h>

#include <random>

#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

double length(const SimulationResult& r, const std::vector<int>& path) {
  double total = 0;
  for (int t : path) total += r.tasks[t].duration_ms();
  return total;
}

TEST(CriticalPath, UniformGPipeRunsDownTheDiagonalAndBack) {
  // K = 3, M = 4, f = 1, b = 2: the longest chain is 0F0 1F0 2F0 2F1 2F2 2F3 2B3 ... 2B0 1B0 0B0
  // (any chain of equal length would do; its length must be the iteration time).
  const Profile profile = testing::uniform_profile(3, 1.0, 2.0, 4);
  const Hardware hw = replicate_device(profile.device, 3);
  SimulationOptions options;
  options.record_edges = true;
  const auto r =
      Simulator(profile, hw).run(testing::make_plan({1, 1, 1}, 4, CheckpointMode::Never), options);
  const auto path = critical_path(r);
  EXPECT_DOUBLE_EQ(length(r, path), r.iteration_ms);
  EXPECT_EQ(r.tasks[path.front()].label(), "0F0");
  EXPECT_EQ(r.tasks[path.back()].label(), "0B0");
  for (std::size_t k = 1; k < path.size(); ++k) {
    EXPECT_LE(r.tasks[path[k - 1]].end_ms, r.tasks[path[k]].start_ms + 1e-12);
  }
}

TEST(CriticalPath, LengthEqualsIterationTimeOnRandomPlans) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<testing::LayerSpec> specs(6);
    for (auto& s : specs) {
      s.forward_ms = 0.5 + rng() % 10;
      s.backward_ms = 0.5 + rng() % 10;
      s.output_per_sample = 1000 * (rng() % 10);
    }
    const Profile profile = testing::make_profile(specs, 8);
    Hardware hw = replicate_device(profile.device, 3);
    hw.link.bandwidth_bytes_per_s = 1e6;
    const Plan plan = testing::make_plan({2, 1, 3}, 1 + rng() % 8, kAllCheckpointModes[rng() % 3],
                                         kAllScheduleKinds[rng() % 2]);
    SimulationOptions options;
    options.record_edges = true;
    const auto r = Simulator(profile, hw).run(plan, options);
    EXPECT_NEAR(length(r, critical_path(r)), r.iteration_ms, 1e-9);
  }
}

}  // namespace
}  // namespace pipetune
