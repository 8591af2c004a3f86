#include "sim/sweep.hpp"

#include <gtest/gtest.h>

#include <optional>

#include "sim/error.hpp"
#include "sim/simulator.hpp"
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

// The sweep is a library: its errors name the input in its own words, never a CLI flag, and say
// which input it is so a front end can name it its own way.
TEST(Sweep, ErrorsNameTheInputInTheLibrarysWords) {
  const Profile profile = testing::uniform_profile(4, 1.0, 2.0, 8);
  const Hardware hw = replicate_device(profile.device, 2);
  auto refusal = [&](const SweepSpec& spec) -> std::optional<InputError> {
    try {
      run_sweep(profile, hw, spec);
    } catch (const InputError& e) {
      return e;
    }
    return std::nullopt;
  };
  SweepSpec spec;
  spec.device_counts = {3};
  spec.chunks = {1};
  spec.checkpoints = {CheckpointMode::Never};
  spec.schedules = {ScheduleKind::GPipe};
  auto e = refusal(spec);
  ASSERT_TRUE(e);
  EXPECT_STREQ(e->what(), "devices: 3 devices asked for, the hardware has 2");
  EXPECT_EQ(e->input(), Input::Devices);
  EXPECT_EQ(e->naming_input_as("--devices"), "--devices: 3 devices asked for, the hardware has 2");
  spec.device_counts = {2};
  spec.balance = {1, 1, 2};
  e = refusal(spec);
  ASSERT_TRUE(e);
  EXPECT_STREQ(e->what(),
               "balance: 3 stages given, but the sweep asks for 2 devices and no schedule it "
               "tries runs 3 stages on them");
  EXPECT_EQ(e->input(), Input::Balance);
  // Four stages on two devices is an interleaved point's balance: those points use it, the
  // single-stage ones are left out.
  spec.balance = {1, 1, 1, 1};
  spec.schedules = {ScheduleKind::GPipe, ScheduleKind::Interleaved1F1B};
  spec.chunks = {2};
  EXPECT_FALSE(refusal(spec)) << refusal(spec)->what();
  const auto rows = run_sweep(profile, hw, spec);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].plan.schedule, ScheduleKind::Interleaved1F1B);
  EXPECT_EQ(rows[0].plan.balance, spec.balance);
}

TEST(InputErrorText, AnInputNamedTwoWays) {
  const InputError with_value(Input::Device, "cuda:3", "no such CUDA device");
  EXPECT_STREQ(with_value.what(), "device cuda:3: no such CUDA device");
  EXPECT_EQ(with_value.naming_input_as("--device"), "--device cuda:3: no such CUDA device");
  const InputError plain_input(Input::BatchSize, "expected a positive integer, got 0");
  EXPECT_STREQ(plain_input.what(), "batch size: expected a positive integer, got 0");
  EXPECT_EQ(plain_input.naming_input_as("--batch"), "--batch: expected a positive integer, got 0");
  // An error about a file names the file itself: nothing to rename.
  const InputError about_a_file("plan.json: chunks: expected at least 1, got 0");
  EXPECT_FALSE(about_a_file.input());
  EXPECT_EQ(about_a_file.naming_input_as("--plan"),
            "plan.json: chunks: expected at least 1, got 0");
}

}  // namespace
}  // namespace pipetune
