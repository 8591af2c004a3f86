// Interpolation across micro-batch sizes, and tensor.chunk's split.

#include "sim/cost_model.hpp"

#include <gtest/gtest.h>

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

// A task takes the longer of the device's time and the host's launches; launches do not get
// faster on a faster device, and I and W launch in the device's proportion of the backward.
TEST(CostModel, LaunchesPaceATaskWhereTheyTakeLongerThanTheDevice) {
  testing::LayerSpec a{1.0, 2.0, 100, 10, 0, 0}, b{0.5, 0.25, 50, 20, 0, 0};
  Profile p = testing::make_profile({a, b, a}, 8);
  const CostModel plain(p);
  EXPECT_DOUBLE_EQ(plain.at(4).forward_task_ms(0, 3, 2.0),
                   1.25);  // no launch times: device / speed
  const double forward_launch[3] = {0.2, 1.0, 0.2}, backward_launch[3] = {0.6, 0.3, 0.3};
  for (int l = 0; l < 3; ++l) {
    p.layers[l].forward_launch_ms.assign(p.micro_batch_sizes.size(), forward_launch[l]);
    p.layers[l].backward_launch_ms.assign(p.micro_batch_sizes.size(), backward_launch[l]);
    p.layers[l].backward_input_ms = p.layers[l].backward_ms;  // W a third, I two thirds
    for (auto& ms : p.layers[l].backward_input_ms) ms *= 2.0 / 3.0;
    p.layers[l].backward_weight_ms = p.layers[l].backward_ms;
    for (auto& ms : p.layers[l].backward_weight_ms) ms /= 3.0;
  }
  const CostModel model(p);
  const SizeCosts& c = model.at(4);
  EXPECT_DOUBLE_EQ(c.forward_ms_sum(0, 3), 2.5);        // the device's sums are unchanged
  EXPECT_DOUBLE_EQ(c.forward_task_ms(0, 3, 1.0), 2.5);  // 2.5 on the device > 1.4 launching
  EXPECT_DOUBLE_EQ(c.forward_task_ms(0, 3, 2.0), 1.4);  // 1.25 on a device twice as fast < 1.4
  EXPECT_DOUBLE_EQ(c.forward_task_ms(1, 2, 1.0), 1.0);  // 0.5 on the device, 1.0 launching
  EXPECT_DOUBLE_EQ(c.forward_nograd_task_ms(1, 2, 1.0), 1.0);  // no nograd launches: the forward's
  EXPECT_DOUBLE_EQ(c.backward_task_ms(0, 3, 4.0), 1.2);        // 4.25 / 4 < 0.6 + 0.3 + 0.3
  EXPECT_DOUBLE_EQ(c.backward_input_task_ms(0, 3, 4.0), 0.8);
  EXPECT_DOUBLE_EQ(c.backward_weight_task_ms(0, 3, 4.0), 0.4);
  // A backward call's own host time, once per backward task and I task, once per layer with
  // parameters in a W task.
  p.device.backward_call_ms = 0.5;
  const CostModel with_call(p);
  const SizeCosts& d = with_call.at(4);
  EXPECT_DOUBLE_EQ(d.backward_task_ms(0, 3, 4.0), 1.7);   // 0.6 + 0.3 + 0.3 + 0.5
  EXPECT_DOUBLE_EQ(d.backward_task_ms(0, 3, 1.0), 4.25);  // the device's still longer
  EXPECT_DOUBLE_EQ(d.backward_input_task_ms(0, 3, 4.0), 1.3);
  EXPECT_DOUBLE_EQ(d.backward_weight_task_ms(0, 3, 4.0),
                   1.9);  // W: a call per layer with parameters
  EXPECT_DOUBLE_EQ(d.backward_weight_task_ms(1, 2, 4.0), 0.6);  // 0.1 + one call
  EXPECT_DOUBLE_EQ(d.forward_task_ms(0, 3, 2.0), 1.4);          // a forward pays no call
  // Without launch times the call is not counted: the device's times are all there is.
  Profile no_launches = testing::make_profile({a, b, a}, 8);
  no_launches.device.backward_call_ms = 0.5;
  const CostModel device_only(no_launches);
  EXPECT_DOUBLE_EQ(device_only.at(4).backward_task_ms(0, 3, 4.0), 4.25 / 4.0);
}

TEST(SplitBatch, FollowsTensorChunk) {
  using V = std::vector<std::int64_t>;
  EXPECT_EQ(split_batch(8, 4), (V{2, 2, 2, 2}));
  EXPECT_EQ(split_batch(10, 4), (V{3, 3, 3, 1}));
  EXPECT_EQ(split_batch(10, 6), (V{2, 2, 2, 2, 2}));  // torch.chunk gives 5, not 6
  EXPECT_EQ(split_batch(7, 7), (V{1, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(split_batch(5, 1), (V{5}));
  EXPECT_EQ(split_batch(64, 3), (V{22, 22, 20}));
  // The schedules' micro-batch count is what torch.chunk makes, not the chunks asked for.
  EXPECT_EQ(micro_batch_count(10, 6), 5);
  EXPECT_EQ(micro_batch_count(64, 3), 3);
}

// A tied tensor is held once by a stage holding any of its layers (Profile::tied): checked on
// every range against a count written out over the range's layers.
TEST(CostModel, ATiedTensorIsHeldOncePerRangeHoldingIt) {
  std::vector<testing::LayerSpec> specs(5);
  const std::int64_t own[] = {1500, 0, 300, 1000, 70};
  for (int k = 0; k < 5; ++k) specs[k].param_bytes = own[k];
  Profile profile = testing::make_profile(specs, 4);
  profile.tied.push_back({"0.weight", {0, 3}, 1000});
  const CostModel model(profile);
  for (int a = 0; a < 5; ++a) {
    for (int b = a + 1; b <= 5; ++b) {
      std::int64_t expected = 0;
      for (int k = a; k < b; ++k) expected += own[k];
      if (a <= 0 && b > 3) expected -= 1000;  // both holders in the range: once
      EXPECT_EQ(model.param_bytes(a, b), expected) << "[" << a << ", " << b << ")";
      EXPECT_LE(model.param_bytes_at_least(a, b), expected) << "[" << a << ", " << b << ")";
    }
  }
  // The lower bound adds over ranges and counts the tie at its first holder.
  EXPECT_EQ(model.param_bytes_at_least(3, 4), 0);
  EXPECT_EQ(model.param_bytes_at_least(0, 1), 1500);
  // A walk that has already met the tie's other holder adds only the layer's own bytes.
  EXPECT_EQ(model.param_bytes_in(3, 0, 3), 0);
  EXPECT_EQ(model.param_bytes_in(3, 1, 3), 1000);
  EXPECT_EQ(model.param_bytes_in(0, 1, 5), 500);
}

}  // namespace
}  // namespace pipetune
