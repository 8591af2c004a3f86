// The exact min-max partition against torchgpipe's published weak cases and brute force.

#include "sim/partition.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>

namespace pipetune {
namespace {

Partition by_sum(const std::vector<double>& w, int parts) {
  std::vector<double> prefix(w.size() + 1, 0.0);
  std::partial_sum(w.begin(), w.end(), prefix.begin() + 1);
  return min_max_partition(static_cast<int>(w.size()), parts,
                           [&](int, int b, int e) { return prefix[e] - prefix[b]; });
}

// Every way to cut n items into `parts` non-empty blocks.
double brute_force(const std::vector<double>& w, int parts) {
  const int n = static_cast<int>(w.size());
  double best = 1e300;
  std::vector<int> cuts;
  std::function<void(int, int)> go = [&](int start, int left) {
    if (left == 1) {
      double worst = std::accumulate(w.begin() + start, w.end(), 0.0);
      for (std::size_t k = 0; k < cuts.size(); ++k) {
        const int b = k == 0 ? 0 : cuts[k - 1];
        worst = std::max(worst, std::accumulate(w.begin() + b, w.begin() + cuts[k], 0.0));
      }
      best = std::min(best, worst);
      return;
    }
    for (int c = start + 1; c <= n - left + 1; ++c) {
      cuts.push_back(c);
      go(c, left - 1);
      cuts.pop_back();
    }
  };
  go(0, parts);
  return best;
}

// `p` splits n items into `parts` non-empty blocks whose costliest is its bottleneck.
void expect_split_reaches_its_bottleneck(const Partition& p, int n, int parts,
                                         const std::function<double(int, int, int)>& cost) {
  ASSERT_EQ(static_cast<int>(p.sizes.size()), parts);
  EXPECT_EQ(std::accumulate(p.sizes.begin(), p.sizes.end(), 0), n);
  double worst = 0.0;
  for (int j = 0, b = 0; j < parts; b += p.sizes[j++]) {
    ASSERT_GE(p.sizes[j], 1);
    worst = std::max(worst, cost(j, b, b + p.sizes[j]));
  }
  EXPECT_EQ(worst, p.bottleneck);
}

TEST(MinMaxPartition, TorchgpipeCases) {
  const auto a = by_sum({1, 2, 3, 4, 5, 6}, 2);
  EXPECT_EQ(a.bottleneck, 11);  // [1..4] = 10 | [5,6] = 11
  EXPECT_EQ(a.sizes, (std::vector<int>{4, 2}));
  // torchgpipe's block partition: [2,2,4] with bottleneck 20; the optimum is 15.
  EXPECT_EQ(by_sum(std::vector<double>(8, 5), 3).bottleneck, 15);
  // torchgpipe: [4,4] with bottleneck 13; the optimum is 10.
  EXPECT_EQ(by_sum({10, 1, 1, 1, 1, 1, 1, 1}, 2).bottleneck, 10);
  // torchgpipe can return an empty block here; every block must hold a layer.
  const auto c = by_sum({12, 12, 20, 20}, 3);
  EXPECT_EQ(c.bottleneck, 24);
  EXPECT_EQ(c.sizes, (std::vector<int>{2, 1, 1}));
}

TEST(MinMaxPartition, EqualsBruteForceOnRandomInstances) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 12);
    const int parts = 1 + static_cast<int>(rng() % std::min(n, 5));
    std::vector<double> w(n);
    for (auto& x : w) x = static_cast<double>(rng() % 20);  // zeros included
    const auto p = by_sum(w, parts);
    EXPECT_DOUBLE_EQ(p.bottleneck, brute_force(w, parts));
    ASSERT_EQ(static_cast<int>(p.sizes.size()), parts);
    EXPECT_EQ(std::accumulate(p.sizes.begin(), p.sizes.end(), 0), n);
    EXPECT_TRUE(std::all_of(p.sizes.begin(), p.sizes.end(), [](int s) { return s >= 1; }));
  }
}

TEST(MinMaxPartition, PerBlockWeights) {
  // Block 0 on a device twice as fast: it takes more of the work.
  std::vector<double> prefix{0, 1, 2, 3, 4, 5, 6};
  const double speed[] = {2.0, 1.0};
  const auto p = min_max_partition(
      6, 2, [&](int j, int b, int e) { return (prefix[e] - prefix[b]) / speed[j]; });
  EXPECT_EQ(p.sizes, (std::vector<int>{4, 2}));
  EXPECT_EQ(p.bottleneck, 2.0);
}

// Every way to cut n items into `parts` non-empty blocks, block j's sum divided by speed[j].
double brute_force_with_speeds(const std::vector<double>& w, const std::vector<double>& speed) {
  const int n = static_cast<int>(w.size()), parts = static_cast<int>(speed.size());
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> ends;
  std::function<void(int)> go = [&](int start) {
    const int block = static_cast<int>(ends.size());
    if (block == parts - 1) {
      double worst = std::accumulate(w.begin() + start, w.end(), 0.0) / speed[block];
      for (int k = 0, b = 0; k < block; b = ends[k++]) {
        worst =
            std::max(worst, std::accumulate(w.begin() + b, w.begin() + ends[k], 0.0) / speed[k]);
      }
      best = std::min(best, worst);
      return;
    }
    for (int end = start + 1; end <= n - (parts - 1 - block); ++end) {
      ends.push_back(end);
      go(end);
      ends.pop_back();
    }
  };
  go(0);
  return best;
}

TEST(MinMaxPartition, PerBlockSpeedsWhereTheBestPrefixShrinksAsItGrows) {
  // Two items [2, 7] over speeds [2, 1] cost 7; three [2, 7, 2] cost 4.5 (7 moves to the fast
  // block): a prefix's best bottleneck need not grow with the prefix.
  const std::vector<double> prefix{0, 2, 9, 11, 12};
  const double speed[] = {2.0, 1.0, 1.0};
  const auto p = min_max_partition(
      4, 3, [&](int j, int b, int e) { return (prefix[e] - prefix[b]) / speed[j]; });
  EXPECT_EQ(p.sizes, (std::vector<int>{2, 1, 1}));
  EXPECT_EQ(p.bottleneck, 4.5);
}

TEST(MinMaxPartition, EqualsBruteForceWithPerBlockSpeeds) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 12);
    const int parts = 1 + static_cast<int>(rng() % std::min(n, 5));
    std::vector<double> w(n), speed(parts);
    for (auto& x : w) x = static_cast<double>(rng() % 20);  // zeros included
    for (auto& s : speed) s = 0.25 * static_cast<double>(1 + rng() % 16);
    std::vector<double> prefix(n + 1, 0.0);
    std::partial_sum(w.begin(), w.end(), prefix.begin() + 1);
    const auto cost = [&](int j, int b, int e) { return (prefix[e] - prefix[b]) / speed[j]; };
    const auto p = min_max_partition(n, parts, cost);
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << ": " << n << " items, " << parts << " blocks");
    EXPECT_DOUBLE_EQ(p.bottleneck, brute_force_with_speeds(w, speed));
    expect_split_reaches_its_bottleneck(p, n, parts, cost);
  }
}

TEST(MinMaxPartition, TooFewItems) {
  EXPECT_TRUE(by_sum({1, 2}, 3).sizes.empty());
  EXPECT_TRUE(min_max_partition_bisected({0, 1, 3}, {1, 1, 1}).sizes.empty());
}

TEST(MinMaxPartitionBisected, AHeavyItemSkipsASlowBlock) {
  // [1, 1, 9, 1] over speeds [1, 0.5, 1]: the best is [1 | 1 | 9, 1] at 10. At T = 10, block 0
  // filled as far as it can ends after [1, 1], and the slow block 1 cannot hold the 9 (18):
  // a probe that only followed the furthest end would call 10 infeasible.
  const std::vector<double> prefix{0, 1, 2, 11, 12};
  const std::vector<double> speed{1.0, 0.5, 1.0};
  const auto p = min_max_partition_bisected(prefix, speed);
  EXPECT_EQ(p.bottleneck, 10.0);
  EXPECT_EQ(p.sizes, (std::vector<int>{1, 1, 2}));
}

TEST(MinMaxPartitionBisected, AHintRoundedAboveTheBottleneckIsOnlyAHint) {
  // Work over the speeds' sum rounds to 1, above the best split's 1 - 2^-53.
  const double below_one = 1.0 - std::ldexp(1.0, -53);
  const std::vector<double> prefix{0, 0.5, below_one, 2};
  const std::vector<double> speed{1.0, 1.0 + std::ldexp(1.0, -52)};
  const double hint = prefix.back() / (speed[0] + speed[1]);
  ASSERT_EQ(hint, 1.0);
  const auto cost = [&](int j, int b, int e) { return (prefix[e] - prefix[b]) / speed[j]; };
  const auto dp = min_max_partition(3, 2, cost);
  ASSERT_LT(dp.bottleneck, hint);
  const auto p = min_max_partition_bisected(prefix, speed, hint);
  EXPECT_EQ(p.bottleneck, dp.bottleneck);
  expect_split_reaches_its_bottleneck(p, 3, 2, cost);
}

TEST(MinMaxPartitionBisected, NoSplitWhereABlockCannotWork) {
  // A block of speed 0 costs infinitely much, as the programme finds.
  const auto cost = [](int j, int b, int e) { return (e - b) / (j == 0 ? 1.0 : 0.0); };
  EXPECT_TRUE(min_max_partition(2, 2, cost).sizes.empty());
  EXPECT_TRUE(min_max_partition_bisected({0, 1, 2}, {1.0, 0.0}).sizes.empty());
}

TEST(MinMaxPartitionBisected, SameBottleneckAsTheProgrammeOnRandomInstances) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 5000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 40);
    const int parts = 1 + static_cast<int>(rng() % std::min(n, 12));
    std::vector<double> prefix(n + 1, 0.0), speed(parts);
    for (int x = 0; x < n; ++x) {  // a few heavy items, zeros included
      const auto w = rng() % 5 == 0 ? rng() % 60 : rng() % 7;
      prefix[x + 1] = prefix[x] + static_cast<double>(w);
    }
    const bool equal_speeds = rng() % 3 == 0;
    for (auto& s : speed) s = equal_speeds ? 1.0 : 0.25 * static_cast<double>(1 + rng() % 8);
    const auto cost = [&](int j, int b, int e) { return (prefix[e] - prefix[b]) / speed[j]; };
    const auto dp = min_max_partition(n, parts, cost);
    // Any floor at most the bottleneck, the bottleneck itself included.
    const double floor = dp.bottleneck * static_cast<double>(rng() % 3) / 2.0;
    std::uint64_t evaluations = 0;
    const auto p = min_max_partition_bisected(prefix, speed, floor, &evaluations);
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << ": " << n << " items, " << parts << " blocks");
    EXPECT_EQ(p.bottleneck, dp.bottleneck);
    EXPECT_GT(evaluations, 0u);
    expect_split_reaches_its_bottleneck(p, n, parts, cost);
  }
}

}  // namespace
}  // namespace pipetune
