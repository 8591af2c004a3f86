// The ceilings of sim/limits.hpp: every loader refuses a value beyond one with one line, and the
// largest values they accept simulate without overflow. The latter is checked against an
// independent truth: the simulator is linear in bytes and in times, so a profile scaled by a
// power of two to the ceilings must predict exactly the scaled peaks and iteration time of the
// small one. A wrapped counter or a lost digit breaks the equality; under UBSan
// (scripts/sanitize.sh) a signed overflow aborts the run.

#include "sim/limits.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "sim/cost_model.hpp"
#include "sim/error.hpp"
#include "sim/hardware.hpp"
#include "sim/plan.hpp"
#include "sim/profile.hpp"
#include "sim/simulator.hpp"
#include "sim/trace.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

using ::testing::HasSubstr;
using testing::LayerSpec;
using testing::make_plan;
using testing::make_profile;

using testing::error_of;

// A small profile through its writer, with one replacement.
std::string profile_text(std::string_view from = {}, std::string_view to = {}) {
  Profile p = make_profile({{1.0, 2.0, 64, 4, 8, 2}, {1.5, 2.5, 32, 4, 4, 0}}, 8, 4);
  std::string text = profile_to_json(p);
  if (!from.empty()) {
    const auto at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
  }
  return text;
}

TEST(Limits, AProfileTimeBeyondTheCeilingIsRefused) {
  // The issue's case: 1e300 ms was accepted and predicted a 300-digit iteration.
  const std::string text =
      profile_text("\"forward_ms\": [\n        1.0", "\"forward_ms\": [\n        1e300");
  EXPECT_EQ(
      error_of(parse_profile, text),
      "in.json: layers[0].forward_ms[0]: expected a non-negative number of milliseconds up to "
      "1e9, got 1e+300");
  // The ceiling itself is accepted.
  EXPECT_EQ(error_of(parse_profile, profile_text("\"forward_ms\": [\n        1.0",
                                                 "\"forward_ms\": [\n        1e9")),
            "");
}

TEST(Limits, AProfileByteCountBeyondTheCeilingIsRefused) {
  EXPECT_EQ(
      error_of(parse_profile,
               profile_text("\"param_bytes\": 64", "\"param_bytes\": 70368744177665")),
      "in.json: layers[0].param_bytes: expected a byte count from 0 to 70368744177664 (64 TiB), "
      "got 70368744177665");
  EXPECT_EQ(
      error_of(parse_profile,
               profile_text("\"memory_bytes\": 0", "\"memory_bytes\": 9000000000000000000")),
      "in.json: device.memory_bytes: expected a byte count from 0 to 70368744177664 (64 TiB), "
      "got 9000000000000000000");
}

TEST(Limits, AProfileWhoseBytesAddUpBeyondTheCeilingIsRefused) {
  // Each count within the ceiling, two of them above it together.
  Profile p = make_profile(
      {{1, 1, limits::kMaxBytes / 2 + 1, 0, 0, 0}, {1, 1, limits::kMaxBytes / 2, 0, 0, 0}}, 4);
  EXPECT_EQ(
      error_of(parse_profile, profile_to_json(p)),
      "in.json: layers: the byte counts add up to 7.037e+13 bytes at a micro-batch of 1 sample "
      "(parameters, input and every per-size field), above the 64 TiB a profile may hold");
  // Within the measured sizes and fine, but extended to the batch (1e9 samples from sizes 1 and
  // 2) far beyond: the cost model would be asked for that size when chunks is 1.
  Profile q = make_profile({{1, 1, 0, 1 << 20, 0, 0}}, 2);
  q.batch_size = 1'000'000'000;
  EXPECT_THAT(
      error_of(parse_profile, profile_to_json(q)),
      HasSubstr("in.json: layers: the byte counts add up to 1.049e+15 bytes at a micro-batch of "
                "1000000000 samples (parameters, input and every per-size field, extended beyond "
                "the measured sizes)"));
  q.batch_size = (limits::kMaxBytes >> 20);  // exactly at the ceiling
  EXPECT_EQ(error_of(parse_profile, profile_to_json(q)), "");
  q.batch_size = 1'000'000'001;
  EXPECT_EQ(error_of(parse_profile, profile_to_json(q)),
            "in.json: batch_size: expected a positive integer up to 1000000000, got 1000000001");
}

TEST(Limits, HardwareBeyondTheCeilingsIsRefused) {
  const std::string ok =
      R"({"format":"pipetune.hardware/1","devices":[{"name":"a","memory_bytes":0}],
    "link":{"bandwidth_bytes_per_s":1,"latency_ms":1e9},"launch_overhead_ms":1e9})";
  EXPECT_EQ(error_of(parse_hardware, ok), "");
  auto with = [&](std::string_view from, std::string_view to) {
    std::string t = ok;
    t.replace(t.find(from), from.size(), to);
    return error_of(parse_hardware, t);
  };
  EXPECT_EQ(
      with("\"bandwidth_bytes_per_s\":1", "\"bandwidth_bytes_per_s\":1e-300"),
      "in.json: link.bandwidth_bytes_per_s: expected at least 1 (bytes per second), or null for "
      "unlimited, got 1e-300");
  EXPECT_EQ(with("\"latency_ms\":1e9", "\"latency_ms\":1.5e9"),
            "in.json: link.latency_ms: expected a non-negative number of milliseconds up to 1e9, "
            "got 1500000000.0");
  EXPECT_EQ(with("\"launch_overhead_ms\":1e9", "\"launch_overhead_ms\":1e300"),
            "in.json: launch_overhead_ms: expected a non-negative number of milliseconds up to "
            "1e9, got 1e+300");
  EXPECT_EQ(
      with("\"memory_bytes\":0", "\"memory_bytes\":70368744177665"),
      "in.json: devices[0].memory_bytes: expected a byte count from 0 to 70368744177664 (64 TiB), "
      "got 70368744177665");
  EXPECT_EQ(with("\"memory_bytes\":0", "\"memory_bytes\":0,\"speed\":1e-7"),
            "in.json: devices[0].speed: expected a number from 1e-6 to 1e6, got 1e-07");
  EXPECT_EQ(
      with("\"launch_overhead_ms\":1e9", "\"calibration\":{\"compute_scale\":{\"2\":1e7}}"),
      "in.json: calibration.compute_scale.2: expected a number from 1e-6 to 1e6, got 10000000.0");
  EXPECT_EQ(
      with("\"launch_overhead_ms\":1e9", "\"calibration\":{\"task_overhead_ms\":2e9}"),
      "in.json: calibration.task_overhead_ms: expected a non-negative number of milliseconds up to "
      "1e9, got 2000000000.0");

  // 1025 devices: the simulator keeps a link per ordered pair.
  std::string many =
      R"({"format":"pipetune.hardware/1","link":{"bandwidth_bytes_per_s":null,"latency_ms":0},"devices":[)";
  for (int d = 0; d < limits::kMaxDevices + 1; ++d) {
    many += (d ? "," : "") + std::string(R"({"name":"d)") + std::to_string(d) +
            R"(","memory_bytes":0})";
  }
  many += "]}";
  EXPECT_EQ(error_of(parse_hardware, many),
            "in.json: devices: expected at most 1024 devices, got an array of 1025 elements");
}

TEST(Limits, PlansBeyondTheCeilingsAreRefused) {
  const auto plan_with = [](const std::string& balance, const std::string& chunks) {
    return R"({"format":"pipetune.plan/1","balance":)" + balance + R"(,"chunks":)" + chunks +
           R"(,"checkpoint":"never","schedule":"gpipe"})";
  };
  EXPECT_EQ(error_of(parse_plan, plan_with("[1]", "4096")), "");
  EXPECT_EQ(error_of(parse_plan, plan_with("[1]", "4097")),
            "in.json: chunks: expected at most 4096 micro-batches, got 4097");
  std::string stages = "[1";
  for (int s = 1; s < limits::kMaxStages + 1; ++s) stages += ",1";
  stages += "]";
  EXPECT_EQ(error_of(parse_plan, plan_with(stages, "1")),
            "in.json: balance: expected at most 1024 stages, got an array of 1025 elements");

  // Against a profile whose batch is above the chunk ceiling: the ceiling is the bound named.
  Profile p = make_profile({{1, 1, 0, 0, 0, 0}}, 8);
  p.batch_size = 10'000;
  Plan plan = make_plan({1}, 5000, CheckpointMode::Never);
  try {
    check_plan(plan, p, replicate_device(p.device, 1), "plan.json");
    ADD_FAILURE() << "accepted 5000 chunks";
  } catch (const InputError& e) {
    EXPECT_STREQ(
        e.what(),
        "plan.json: chunks: expected 1 to 4096 (the most micro-batches a plan may have), got 5000");
  }
}

TEST(Limits, TheCostModelIsAskedOnlyForSizesTheLoaderBounded) {
  // Its cache is keyed by size, not indexed by it: a batch of 10^9 costs no memory.
  Profile p = make_profile({{1, 2, 0, 4, 0, 0}}, 2);
  p.batch_size = 1'000'000'000;
  const CostModel model(p);
  EXPECT_EQ(model.at(p.batch_size).output_bytes[0], 4'000'000'000);
  EXPECT_THROW(model.at(0), std::out_of_range);
  EXPECT_THROW(model.at(p.batch_size + 1), std::out_of_range);
}

// Every byte count multiplied by `bytes`, every time by `times`, through the writer and the
// loader (so the result is something the loader accepts).
Profile scaled(const Profile& p, std::int64_t bytes, double times) {
  Profile s = p;
  auto scale = [&](std::vector<std::int64_t>& v) {
    for (auto& b : v) b *= bytes;
  };
  scale(s.input_bytes);
  for (auto& l : s.layers) {
    l.param_bytes *= bytes;
    for (auto* v : {&l.output_bytes, &l.saved_bytes, &l.workspace_bytes}) scale(*v);
    for (auto* v : {&l.forward_ms, &l.backward_ms}) {
      for (auto& t : *v) t *= times;
    }
  }
  return parse_profile(profile_to_json(s), "scaled.json");
}

TEST(Limits, TheLargestAcceptedValuesSimulateWithoutOverflow) {
  // Four layers, bytes linear in the micro-batch size, batch 4096: the most micro-batches a plan
  // may have, each of one sample.
  const Profile small =
      make_profile({{1, 2, 3, 5, 7, 1}, {2, 1, 1, 3, 2, 4}, {1, 1, 2, 1, 5, 0}, {3, 2, 4, 2, 1, 2}},
                   limits::kMaxChunks, 1);
  // Scale by the largest power of two that keeps the profile total within the ceiling, and the
  // times by the largest power of two within 1e9 ms.
  double total = static_cast<double>(small.input_bytes.back());
  for (const auto& l : small.layers) {
    total += static_cast<double>(l.param_bytes + l.output_bytes.back() + l.saved_bytes.back() +
                                 l.workspace_bytes.back());
  }
  std::int64_t bytes = 1;
  while (total * static_cast<double>(bytes * 2) <= static_cast<double>(limits::kMaxProfileBytes))
    bytes *= 2;
  const double times = std::ldexp(1.0, 28);  // the slowest layer (3 ms) becomes 8.1e8 ms
  ASSERT_GT(total * static_cast<double>(bytes), static_cast<double>(limits::kMaxProfileBytes) / 2);
  const Profile big = scaled(small, bytes, times);

  Hardware hardware = replicate_device(small.device, 4);
  for (const Plan& base :
       {make_plan({1, 1, 1, 1}, limits::kMaxChunks, CheckpointMode::Never),
        make_plan({1, 1, 1, 1}, limits::kMaxChunks, CheckpointMode::Always, ScheduleKind::OneFOneB),
        make_plan({2, 2}, limits::kMaxChunks, CheckpointMode::ExceptLast)}) {
    Plan plan = base;
    plan.optimizer_state_factor = 1000;
    SCOPED_TRACE(describe_plan(plan));
    const SimulationResult a = Simulator(small, hardware).run(plan, SimulationOptions{});
    const SimulationResult b = Simulator(big, hardware).run(plan, SimulationOptions{});
    EXPECT_EQ(b.iteration_ms, a.iteration_ms * times);
    ASSERT_EQ(a.devices.size(), b.devices.size());
    for (std::size_t d = 0; d < a.devices.size(); ++d) {
      EXPECT_GT(a.devices[d].peak_memory_bytes, 0);
      EXPECT_EQ(b.devices[d].peak_memory_bytes, a.devices[d].peak_memory_bytes * bytes);
    }
  }

  // The slowest link and the largest latency and overhead the loader takes: every time finite.
  Hardware slow = hardware;
  slow.link = {limits::kMinBandwidth, limits::kMaxMs};
  slow.launch_overhead_ms = limits::kMaxMs;
  for (auto& d : slow.devices) d.speed = limits::kMinSpeed;
  const SimulationResult r = Simulator(big, slow).run(
      make_plan({1, 1, 1, 1}, limits::kMaxChunks, CheckpointMode::Never), SimulationOptions{});
  EXPECT_TRUE(std::isfinite(r.iteration_ms));
  EXPECT_GT(r.iteration_ms, limits::kMaxMs * limits::kMaxChunks);
}

}  // namespace
}  // namespace pipetune
