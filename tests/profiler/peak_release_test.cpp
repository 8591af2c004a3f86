// When a backward is done with its peak, from fabricated allocator records: no torch needed.

#include "profiler/peak_release.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>

namespace pipetune::profiler {
namespace {

LevelRecord record(std::vector<CounterSample> samples, double duration_ms) {
  return {std::move(samples), duration_ms};
}

TEST(PeakRelease, TheShareThatSavesTheMostAfterThePeak) {
  // Peak 300 until 3 ms of 10; then at most 150 until 9 ms, then 50.
  const LevelRecord r = record({{0, 0}, {1, 100}, {2, 300}, {3, 120}, {6, 150}, {9, 50}}, 10.0);
  const PeakRelease p = peak_release(std::span(&r, 1));
  // At 0.3: 150 below for 0.7 of the time (105); at 0.6: 150 for 0.4; at 0.9: 250 for 0.1.
  EXPECT_DOUBLE_EQ(p.share, 0.3);
  EXPECT_EQ(p.drop, 150);
}

TEST(PeakRelease, TrueForEveryRecordAfterTheLatestPeak) {
  const std::vector<LevelRecord> r{
      record({{0, 0}, {1, 100}, {2, 300}, {3, 120}, {6, 150}, {9, 50}}, 10.0),
      record({{0, 0}, {1, 200}, {5, 400}, {6, 100}}, 10.0)};
  const PeakRelease p = peak_release(r);
  // Not before the second's peak is over (0.6); there the first is 150 below its own peak.
  EXPECT_DOUBLE_EQ(p.share, 0.6);
  EXPECT_EQ(p.drop, 150);
}

TEST(PeakRelease, APeakThatLastsToTheEndOrComesBackReleasesNothingBefore) {
  const LevelRecord held = record({{0, 0}, {1, 100}, {9, 300}}, 10.0);
  const PeakRelease none = peak_release(std::span(&held, 1));
  EXPECT_DOUBLE_EQ(none.share, 1.0);
  EXPECT_EQ(none.drop, 0);
  // Reached twice: over after the second time only.
  const LevelRecord twice = record({{0, 0}, {1, 300}, {2, 100}, {4, 300}, {5, 0}}, 10.0);
  const PeakRelease p = peak_release(std::span(&twice, 1));
  EXPECT_DOUBLE_EQ(p.share, 0.5);
  EXPECT_EQ(p.drop, 300);
  EXPECT_EQ(peak_release({}).drop, 0);
  // A record of no duration cannot place anything.
  const std::vector<LevelRecord> instant{record({{0, 0}, {1, 300}, {2, 100}}, 10.0),
                                         record({{0, 0}, {0, 300}, {0, 100}}, 0.0)};
  EXPECT_DOUBLE_EQ(peak_release(instant).share, 1.0);
  EXPECT_EQ(peak_release(instant).drop, 0);
}

// Against brute force on random records: the answer holds for every record (every level in
// force from its share on is at least `drop` under the record's peak), and no share on a fine
// grid or at any change saves more.
TEST(PeakRelease, HoldsAndSavesTheMostOnRandomRecords) {
  std::mt19937 rng(7);
  for (int round = 0; round < 300; ++round) {
    std::vector<LevelRecord> records(1 + rng() % 3);
    for (LevelRecord& r : records) {
      r.duration_ms = 1.0 + rng() % 20;
      double t = 0.0;
      const int changes = 1 + static_cast<int>(rng() % 12);
      // Now and then past the duration (a change timed after the clock read the end).
      for (int i = 0; i < changes && t <= r.duration_ms + 2.0; ++i) {
        r.samples.push_back({t, static_cast<std::int64_t>(rng() % 1000)});
        t += static_cast<double>(rng() % 4) * 0.5;
      }
    }
    // The highest level from share x on, scanned directly: the change in force at x (the last
    // at or before it; the first if none) and every later one.
    auto from = [](const LevelRecord& r, double x) {
      auto share = [&](std::size_t i) { return std::min(1.0, r.samples[i].time / r.duration_ms); };
      std::size_t in_force = 0;
      for (std::size_t i = 0; i < r.samples.size(); ++i)
        if (share(i) <= x) in_force = i;
      std::int64_t highest = r.samples[in_force].value;
      for (std::size_t i = 0; i < r.samples.size(); ++i)
        if (share(i) > x) highest = std::max(highest, r.samples[i].value);
      return highest;
    };
    auto peak = [](const LevelRecord& r) {
      std::int64_t p = 0;
      for (const auto& s : r.samples) p = std::max(p, s.value);
      return p;
    };
    auto drop_at = [&](double x) {
      std::int64_t drop = std::numeric_limits<std::int64_t>::max();
      for (const LevelRecord& r : records) drop = std::min(drop, peak(r) - from(r, x));
      return drop;
    };
    const PeakRelease p = peak_release(records);
    ASSERT_GE(p.drop, 0);
    ASSERT_LE(p.drop, drop_at(p.share)) << "round " << round;
    double best = 0.0;
    std::vector<double> shares;
    for (int g = 0; g <= 1000; ++g) shares.push_back(g / 1000.0);
    for (const LevelRecord& r : records)
      for (const auto& s : r.samples) shares.push_back(std::min(1.0, s.time / r.duration_ms));
    for (double x : shares) best = std::max(best, static_cast<double>(drop_at(x)) * (1.0 - x));
    ASSERT_NEAR(static_cast<double>(p.drop) * (1.0 - p.share), best, 1e-9) << "round " << round;
  }
}

}  // namespace
}  // namespace pipetune::profiler
