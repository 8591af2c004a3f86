// Interpolation across micro-batch sizes, and tensor.chunk's split.

#include <gtest/gtest.h>

#include "sim/cost_model.hpp"
#include "sim/plan.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

const std::vector<std::int64_t> kSizes{1, 2, 4, 8};
const std::vector<double> kTimes{1.0, 1.5, 2.0, 4.0};

TEST(Interpolate, HitsTheMeasuredPoints) {
  for (std::size_t k = 0; k < kSizes.size(); ++k) {
    EXPECT_DOUBLE_EQ(interpolate(kSizes, kTimes, static_cast<double>(kSizes[k])), kTimes[k]);
  }
}

TEST(Interpolate, IsLinearBetweenPoints) {
  EXPECT_DOUBLE_EQ(interpolate(kSizes, kTimes, 3.0), 1.75);  // halfway from 2 to 4
  EXPECT_DOUBLE_EQ(interpolate(kSizes, kTimes, 6.0), 3.0);   // halfway from 4 to 8
  EXPECT_DOUBLE_EQ(interpolate(kSizes, kTimes, 5.0), 2.5);
}

TEST(Interpolate, ExtrapolatesAlongTheLastSegment) {
  // Slope of the last segment: (4 - 2) / (8 - 4) = 0.5 per sample.
  EXPECT_DOUBLE_EQ(interpolate(kSizes, kTimes, 16.0), 8.0);
  EXPECT_DOUBLE_EQ(interpolate(kSizes, kTimes, 10.0), 5.0);
}

TEST(Interpolate, NeverNegative) {
  const std::vector<std::int64_t> sizes{2, 4};
  const std::vector<double> falling{1.0, 0.2};
  EXPECT_DOUBLE_EQ(interpolate(sizes, falling, 8.0), 0.0);  // 0.2 - 4 * 0.4 < 0
  const std::vector<double> rising{1.0, 3.0};
  EXPECT_DOUBLE_EQ(interpolate(sizes, rising, 1.0), 0.0);  // 1 - 1 * 1 = 0
}

TEST(Interpolate, OnePointScalesProportionally) {
  const std::vector<std::int64_t> sizes{4};
  const std::vector<std::int64_t> bytes{400};
  EXPECT_EQ(interpolate_bytes(sizes, bytes, 6.0), 600);
}

TEST(CostModel, StageSumsUsePrefixes) {
  testing::LayerSpec a{1.0, 2.0, 100, 10, 0, 0}, b{0.5, 0.25, 50, 20, 0, 0};
  const Profile p = testing::make_profile({a, b, a}, 8);
  const CostModel model(p);
  const SizeCosts& c = model.at(4);
  EXPECT_DOUBLE_EQ(c.forward_ms_sum(0, 3), 2.5);
  EXPECT_DOUBLE_EQ(c.backward_ms_sum(1, 3), 2.25);
  EXPECT_EQ(c.output_bytes[1], 80);
  EXPECT_EQ(c.stage_input_bytes(2), 80);
  EXPECT_EQ(model.param_bytes(0, 3), 250);
  EXPECT_EQ(&model.at(4), &c);  // cached
}

TEST(SplitBatch, FollowsTensorChunk) {
  using V = std::vector<std::int64_t>;
  EXPECT_EQ(split_batch(8, 4), (V{2, 2, 2, 2}));
  EXPECT_EQ(split_batch(10, 4), (V{3, 3, 3, 1}));
  EXPECT_EQ(split_batch(10, 6), (V{2, 2, 2, 2, 2}));  // torch.chunk gives 5, not 6
  EXPECT_EQ(split_batch(7, 7), (V{1, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(split_batch(5, 1), (V{5}));
  EXPECT_EQ(split_batch(64, 3), (V{22, 22, 20}));
}

}  // namespace
}  // namespace pipetune
