// Inputs that the libFuzzer targets (fuzz/, scripts/fuzz.sh) and the probes that followed them
// found to crash a loader, to throw something other than InputError, to be accepted with a value
// silently changed, or to be accepted and then break the writer. Each is now refused with one
// InputError that names the file, the JSON path and what was expected.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "sim/error.hpp"
#include "sim/hardware.hpp"
#include "sim/plan.hpp"
#include "sim/profile.hpp"
#include "sim/trace.hpp"
#include "sim/units.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

using ::testing::HasSubstr;

using testing::error_of;

std::string profile_error(std::string_view t) {
  return error_of(parse_profile, t);
}
std::string hardware_error(std::string_view t) {
  return error_of(parse_hardware, t);
}
std::string plan_error(std::string_view t) {
  return error_of(parse_plan, t);
}
std::string trace_error(std::string_view t) {
  return error_of(parse_trace, t);
}

std::string nested_arrays(int depth) {
  return std::string(static_cast<std::size_t>(depth), '[') +
         std::string(static_cast<std::size_t>(depth), ']');
}

// A trace with two devices and one event, `event`.
std::string trace_with(std::string_view event) {
  return std::string(R"({"pipetune":{"format":"pipetune.trace/1","kind":"measured","model":"m",
    "summary":{"iteration_ms":1,"throughput_samples_per_s":1,"bubble_fraction":0,"devices":[
      {"name":"d","stages":[0],"busy_ms":1,"peak_memory_bytes":0,"memory_capacity_bytes":0},
      {"name":"e","stages":[1],"busy_ms":1,"peak_memory_bytes":0,"memory_capacity_bytes":0}]}},
    "traceEvents":[)") +
         std::string(event) + "]}";
}

TEST(FuzzRegression, NumberBeyondDoubleIsInputError) {
  // plan_fuzz crash-4daaeb1f: nlohmann reports a number beyond double's range as out_of_range,
  // not parse_error, and that exception escaped every loader.
  const std::string crash =
      "{\"format\":\"pipetmne.plan/1\",\"balance\":[1,2,1],\"chunks\":"
      "3e44444444444444444444444444444444"
      "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff_factor\"z1}\n";
  EXPECT_EQ(plan_error(crash),
            "in.json: invalid JSON: number overflow parsing '3e44444444444444444444444444444444'");
  EXPECT_THAT(profile_error(R"({"format":"pipetune.profile/1","batch_size":1e400})"),
              HasSubstr("in.json: invalid JSON: number overflow parsing '1e400'"));
  EXPECT_THAT(hardware_error(R"({"devices":[{"name":"a","memory_bytes":-1e999}]})"),
              HasSubstr("in.json: invalid JSON: number overflow parsing '-1e999'"));
  EXPECT_THAT(trace_error(trace_with(R"({"ph":"X","ts":1e309})")),
              HasSubstr("in.json: invalid JSON: number overflow parsing '1e309'"));
}

TEST(FuzzRegression, DeepNestingIsRefused) {
  // A profile's free-form meta nested 30000 deep was accepted, and profile_to_json then asked
  // for 2 GB (dump re-indents every level) on the way to overflowing the stack.
  const std::string deep_meta =
      R"({"format":"pipetune.profile/1","meta":{"a":)" + nested_arrays(30000) + "}}";
  EXPECT_EQ(profile_error(deep_meta), "in.json: invalid JSON: nested deeper than 64 levels");
  // The same for a trace's embedded plan, which the reader dumps and parses again.
  const std::string deep_plan =
      R"({"pipetune":{"format":"pipetune.trace/1","plan":)" + nested_arrays(30000) + "}}";
  EXPECT_EQ(trace_error(deep_plan), "in.json: invalid JSON: nested deeper than 64 levels");
  // 64 levels still parse (and fail on their content); 65 do not.
  const std::string plan_at = R"({"format":"pipetune.plan/1","balance":)";
  EXPECT_THAT(plan_error(plan_at + nested_arrays(63) + "}"), HasSubstr("in.json: balance[0]:"));
  EXPECT_EQ(plan_error(plan_at + nested_arrays(64) + "}"),
            "in.json: invalid JSON: nested deeper than 64 levels");
}

TEST(FuzzRegression, TraceStageNearIntMaxIsRefused) {
  // A copy of stage 2147483647 was accepted; writing the trace computed its consumer's stage,
  // stage + 1, and overflowed int (UBSan: signed integer overflow in trace.cpp consumer_of).
  const std::string e = trace_error(trace_with(
      R"({"ph":"X","pid":0,"tid":2,"cat":"copy","ts":0,"dur":1,"args":{"stage":2147483647,
          "micro_batch":0,"direction":"activation","to":1,"bytes":4}})"));
  EXPECT_EQ(e,
            "in.json: traceEvents[0].args.stage: expected a non-negative integer up to "
            "1000000000, got 2147483647");
  EXPECT_THAT(trace_error(trace_with(
                  R"({"ph":"X","pid":0,"tid":0,"cat":"forward","ts":0,"dur":1,
                      "args":{"stage":0,"micro_batch":4294967296}})")),
              HasSubstr("traceEvents[0].args.micro_batch: expected a non-negative integer up to "
                        "1000000000, got 4294967296"));
}

TEST(FuzzRegression, TraceCopyTargetDoesNotWrap) {
  // "to": 2^32 was cast to int before the range check and read as pid 0.
  const std::string e = trace_error(trace_with(
      R"({"ph":"X","pid":0,"tid":2,"cat":"copy","ts":0,"dur":1,"args":{"stage":0,
          "micro_batch":0,"direction":"activation","to":4294967296,"bytes":4}})"));
  EXPECT_EQ(e, "in.json: traceEvents[0].args.to: expected a device pid below 2, got 4294967296");
}

TEST(FuzzRegression, TraceEndTimeMustBeFinite) {
  // ts and dur each finite, their sum not: the task ended at infinity, trace_to_json wrote
  // "dur":inf, and the written trace could not be read back.
  const std::string e = trace_error(trace_with(
      R"({"ph":"X","pid":0,"tid":0,"cat":"forward","ts":1e308,"dur":1e308,
          "args":{"stage":0,"micro_batch":0}})"));
  EXPECT_EQ(e,
            "in.json: traceEvents[0]: expected ts + dur to be a finite time, got 1e+308 + 1e+308");
}

TEST(FuzzRegression, PlanBalanceDoesNotWrap) {
  // 4294967297 layers in a stage was cast to int and read as 1.
  const std::string e = plan_error(
      R"({"format":"pipetune.plan/1","balance":[4294967297,1],"chunks":1,"checkpoint":"never",
          "schedule":"gpipe"})");
  EXPECT_EQ(e, "in.json: balance[0]: expected at most 1000000000 layers per stage, got 4294967297");
}

TEST(FuzzRegression, PlanOptimizerStateFactorIsBounded) {
  // optimizer_state_factor 1e308 was accepted; the memory model's llround of the optimizer
  // state then overflowed and the simulator reported -8192 PiB peaks that "fit".
  const std::string e = plan_error(
      R"({"format":"pipetune.plan/1","balance":[1],"chunks":1,"checkpoint":"never",
          "schedule":"gpipe","optimizer_state_factor":1e308})");
  EXPECT_EQ(e, "in.json: optimizer_state_factor: expected a number from 0 to 1000, got 1e+308");
  EXPECT_EQ(plan_error(R"({"format":"pipetune.plan/1","balance":[1],"chunks":1,
      "checkpoint":"never","schedule":"gpipe","optimizer_state_factor":1000})"),
            "");
}

TEST(FuzzRegression, ParseBytesBeyondInt64IsNotASize) {
  // cli_flags_fuzz: "1e30" came back as INT64_MIN (llround out of range), not -1.
  EXPECT_EQ(parse_bytes("1e30"), -1);
  EXPECT_EQ(parse_bytes("1e19"), -1);
  EXPECT_EQ(parse_bytes("8388608TiB"), -1);  // exactly 2^63
  EXPECT_EQ(parse_bytes("9e18"), 9'000'000'000'000'000'000);
  EXPECT_EQ(parse_bytes("16GiB"), std::int64_t{16} << 30);
}

TEST(FuzzRegression, SplitBatchNearInt64Max) {
  // ceil(batch / chunks) was computed as (batch + chunks - 1) / chunks, which overflows.
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(split_batch(kMax, 2), (std::vector<std::int64_t>{kMax / 2 + 1, kMax / 2}));
  EXPECT_EQ(split_batch(10, 4), (std::vector<std::int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(split_batch(10, 6), (std::vector<std::int64_t>{2, 2, 2, 2, 2}));
}

}  // namespace
}  // namespace pipetune
