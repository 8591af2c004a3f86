// CUPTI record attribution on fabricated buffers: no GPU needed.

#include "profiler/activity.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace pipetune::profiler {
namespace {

using Kind = ActivityRecord::Kind;

ActivityRecord kernel(std::uint64_t start, std::uint64_t end, std::uint32_t correlation) {
  return {Kind::Kernel, start, end, correlation, 0};
}
ActivityRecord external(std::uint32_t correlation, std::uint64_t id) {
  return {Kind::ExternalCorrelation, 0, 0, correlation, id};
}

TEST(ActivityAttribution, SpanIncludesTheGapsBusyDoesNot) {
  ActivityAttribution a;
  const std::vector<ActivityRecord> records{external(1, 7), external(2, 7),
                                            kernel(1'000'000, 1'500'000, 1),
                                            kernel(2'000'000, 3'000'000, 2)};
  a.add(records);
  const auto r = a.regions();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_DOUBLE_EQ(r.at(7).span_ms, 2.0);  // 1.0 ms to 3.0 ms
  EXPECT_DOUBLE_EQ(r.at(7).busy_ms, 1.5);  // 0.5 + 1.0
  EXPECT_EQ(r.at(7).records, 2);
}

// The device's own time: kernels, and the short gaps of a device moving on to queued work,
// not the long ones of a device waiting for the host's next launch; overlapping work once.
TEST(ActivityAttribution, DeviceTimeKeepsQueuedGapsNotWaitsForTheHost) {
  ActivityAttribution a;
  const std::uint64_t short_gap = kQueuedGapNs, long_gap = kQueuedGapNs + 1;
  const std::vector<ActivityRecord> records{
      external(1, 3),
      external(2, 3),
      external(3, 3),
      external(4, 3),
      external(5, 4),
      kernel(0, 10'000, 1),                               // 10 µs
      kernel(10'000 + short_gap, 30'000 + short_gap, 2),  // queued: its gap counts
      kernel(30'000 + short_gap + long_gap, 40'000 + short_gap + long_gap, 3),  // waited
      kernel(35'000 + short_gap + long_gap, 50'000 + short_gap + long_gap, 4),  // overlaps it
      kernel(0, 1'000, 5)};
  a.add(records);
  const auto r = a.regions();
  EXPECT_DOUBLE_EQ(r.at(3).device_ms, (10'000 + short_gap + 20'000 + 20'000) / 1e6);
  EXPECT_DOUBLE_EQ(r.at(3).busy_ms, (10'000 + 20'000 + 10'000 + 15'000) / 1e6);
  EXPECT_DOUBLE_EQ(r.at(3).span_ms, (50'000 + short_gap + long_gap) / 1e6);
  EXPECT_DOUBLE_EQ(r.at(4).device_ms, 0.001);
}

TEST(ActivityAttribution, CorrelationAcrossBuffersInAnyOrder) {
  ActivityAttribution a;
  // Kernels first, their external correlations in a later buffer, everything shuffled.
  const std::vector<ActivityRecord> first{
      kernel(5'000, 6'000, 12), kernel(1'000, 2'000, 10), {Kind::Memcpy, 2'500, 3'000, 11, 0}};
  const std::vector<ActivityRecord> second{external(11, 1), external(12, 2), external(10, 1)};
  a.add(first);
  a.add(second);
  const auto r = a.regions();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_DOUBLE_EQ(r.at(1).span_ms, 0.002);  // 1 µs to 3 µs: kernel and copy of region 1
  EXPECT_EQ(r.at(1).records, 2);
  EXPECT_DOUBLE_EQ(r.at(2).span_ms, 0.001);
  EXPECT_EQ(a.unmatched(), 0u);
}

TEST(ActivityAttribution, DroppedAndUnmatchedRecordsAreReported) {
  ActivityAttribution a;
  const std::vector<ActivityRecord> records{kernel(0, 10, 99)};
  a.add(records);
  a.note_dropped(3);
  EXPECT_TRUE(a.regions().empty());
  EXPECT_EQ(a.unmatched(), 1u);
  const auto w = a.warnings();
  ASSERT_EQ(w.size(), 2u);
  EXPECT_THAT(w[0], ::testing::HasSubstr("CUPTI dropped 3 activity records"));
  EXPECT_THAT(w[1], ::testing::HasSubstr("none of the 1 GPU activities could be joined"));
  a.clear();
  EXPECT_TRUE(a.warnings().empty());
  // Work between layers (here correlation 5) is expected once some work was joined.
  const std::vector<ActivityRecord> mixed{external(1, 7), kernel(0, 10, 1), kernel(20, 30, 5)};
  a.add(mixed);
  EXPECT_EQ(a.unmatched(), 1u);
  EXPECT_TRUE(a.warnings().empty());
}

TEST(ClockMapping, MapsCuptiTimestampsOntoTheHostClock) {
  const ClockMapping m = ClockMapping::from(/*cupti*/ 5'000, /*host*/ 1'000'000);
  EXPECT_EQ(m.to_host(5'000), 1'000'000u);
  EXPECT_EQ(m.to_host(6'500), 1'001'500u);
  const ClockMapping back = ClockMapping::from(1'000'000, 5'000);  // host clock behind
  EXPECT_EQ(back.to_host(1'000'010), 5'010u);
}

}  // namespace
}  // namespace pipetune::profiler
