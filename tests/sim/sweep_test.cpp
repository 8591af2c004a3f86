#include <gtest/gtest.h>

#include "sim/error.hpp"
#include "sim/simulator.hpp"
#include "sim/sweep.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

TEST(Sweep, EveryCombinationMatchesASingleSimulation) {
  const Profile profile = testing::uniform_profile(8, 1.0, 2.0, 16);
  const Hardware hw = replicate_device(profile.device, 4);
  SweepSpec spec;
  spec.device_counts = {2, 4};
  spec.chunks = {1, 4, 16};
  spec.checkpoints = {CheckpointMode::Never, CheckpointMode::Always};
  spec.schedules = {ScheduleKind::GPipe, ScheduleKind::OneFOneB};
  spec.bandwidths = {1e6, 1e9};
  std::size_t calls = 0;
  const auto rows = run_sweep(profile, hw, spec, [&](std::size_t, std::size_t) { ++calls; });
  ASSERT_EQ(rows.size(), 2u * 2 * 2 * 2 * 3);
  EXPECT_EQ(calls, rows.size());
  for (const auto& row : rows) {
    Hardware point = hw;
    point.devices.resize(row.devices);
    point.link.bandwidth_bytes_per_s = row.bandwidth_bytes_per_s;
    const auto r = Simulator(profile, point).run(row.plan);
    EXPECT_DOUBLE_EQ(row.iteration_ms, r.iteration_ms);
    // Uniform layers split evenly.
    EXPECT_EQ(row.plan.balance, std::vector<int>(row.devices, 8 / row.devices));
  }
}

TEST(Sweep, RejectsImpossiblePoints) {
  const Profile profile = testing::uniform_profile(4, 1.0, 2.0, 8);
  const Hardware hw = replicate_device(profile.device, 2);
  SweepSpec spec;
  spec.device_counts = {3};
  spec.chunks = {1};
  spec.checkpoints = {CheckpointMode::Never};
  spec.schedules = {ScheduleKind::GPipe};
  EXPECT_THROW(run_sweep(profile, hw, spec), InputError);
  spec.device_counts = {2};
  spec.chunks = {9};
  EXPECT_THROW(run_sweep(profile, hw, spec), InputError);
}

}  // namespace
}  // namespace pipetune
