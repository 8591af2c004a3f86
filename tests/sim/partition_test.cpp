// The exact min-max partition against torchgpipe's published weak cases and brute force.

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>

#include "sim/partition.hpp"

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
  const auto p = min_max_partition(6, 2, [&](int j, int b, int e) { return (prefix[e] - prefix[b]) / speed[j]; });
  EXPECT_EQ(p.sizes, (std::vector<int>{4, 2}));
  EXPECT_EQ(p.bottleneck, 2.0);
}

TEST(MinMaxPartition, TooFewItems) {
  EXPECT_TRUE(by_sum({1, 2}, 3).sizes.empty());
}

}  // namespace
}  // namespace pipetune
