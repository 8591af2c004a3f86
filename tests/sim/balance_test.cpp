// time_balanced (sim/balance) against a brute force over every contiguous partition, with the
// per-layer work read straight from the profile's tables.

#include "sim/balance.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "sim/cost_model.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

// One iteration's compute of each layer: per micro-batch its forward and backward, and for a
// recomputed micro-batch its forward without autograd (the forward's time when not profiled).
// Every micro-batch size used here is a profiled one, so no interpolation is involved.
std::vector<double> layer_work(const Profile& profile, int chunks, CheckpointMode mode) {
  const std::int64_t size = profile.batch_size / chunks;
  const auto column =
      std::find(profile.micro_batch_sizes.begin(), profile.micro_batch_sizes.end(), size) -
      profile.micro_batch_sizes.begin();
  std::vector<double> work;
  for (const auto& layer : profile.layers) {
    const double nograd = layer.forward_nograd_ms.empty() ? layer.forward_ms[column]
                                                          : layer.forward_nograd_ms[column];
    double w = 0.0;
    for (int i = 0; i < chunks; ++i) {
      const bool recomputed =
          mode == CheckpointMode::Always || (mode == CheckpointMode::ExceptLast && i < chunks - 1);
      w += layer.forward_ms[column] + layer.backward_ms[column] + (recomputed ? nograd : 0.0);
    }
    work.push_back(w);
  }
  return work;
}

double bottleneck(const std::vector<double>& work, const std::vector<int>& balance,
                  const std::vector<double>& speed) {
  double worst = 0.0;
  int layer = 0;
  for (std::size_t s = 0; s < balance.size(); ++s) {
    double sum = 0.0;
    for (int k = 0; k < balance[s]; ++k) sum += work[layer++];
    worst = std::max(worst, sum / speed[s]);
  }
  return worst;
}

// The least bottleneck over every way to cut the layers into `parts` non-empty blocks.
double brute_force(const std::vector<double>& work, int parts, const std::vector<double>& speed) {
  const int n = static_cast<int>(work.size());
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> balance;
  std::function<void(int)> place = [&](int left) {
    if (static_cast<int>(balance.size()) == parts - 1) {
      if (left < 1) return;
      balance.push_back(left);
      best = std::min(best, bottleneck(work, balance, speed));
      balance.pop_back();
      return;
    }
    const int still_to_place = parts - 1 - static_cast<int>(balance.size());
    for (int size = 1; size <= left - still_to_place; ++size) {
      balance.push_back(size);
      place(left - size);
      balance.pop_back();
    }
  };
  place(n);
  return best;
}

TEST(TimeBalanced, ReachesTheBruteForceOptimumOverEveryContiguousPartition) {
  std::mt19937 rng(20);
  const CheckpointMode modes[] = {CheckpointMode::Never, CheckpointMode::ExceptLast,
                                  CheckpointMode::Always};
  for (int trial = 0; trial < 200; ++trial) {
    const int layers = 2 + static_cast<int>(rng() % 11);  // 2..12
    const int stages = 1 + static_cast<int>(rng() % std::min(layers, 5));
    const Profile profile = testing::random_profile(rng, layers, 8);
    const CostModel costs(profile);
    Hardware hardware = replicate_device(profile.device, stages);
    // Each device its own speed: a longer prefix can then be cheaper to balance than a shorter
    // one, which a DP that assumes otherwise gets wrong.
    std::vector<double> speed(stages);
    for (int d = 0; d < stages; ++d) hardware.devices[d].speed = speed[d] = 0.5 + (rng() % 4) * 0.5;
    Plan shape = testing::make_plan({}, 1 << (rng() % 4), modes[rng() % 3]);

    const std::vector<int> balance = time_balanced(costs, hardware, stages, shape);
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << ": " << layers << " layers, " << stages << " stages");
    ASSERT_EQ(static_cast<int>(balance.size()), stages);
    EXPECT_EQ(std::accumulate(balance.begin(), balance.end(), 0), layers);
    for (int b : balance) EXPECT_GE(b, 1);
    const std::vector<double> work = layer_work(profile, shape.chunks, shape.checkpoint);
    const double best = brute_force(work, stages, speed);
    EXPECT_NEAR(bottleneck(work, balance, speed), best, 1e-9 * best);
  }
}

// With launch times a stage's cost is not its layers' sum (each task takes the larger of the
// device's and the host's sums): the balance still has the least bottleneck over every split.
TEST(TimeBalanced, LaunchBoundStagesReachTheBruteForceOptimum) {
  std::mt19937 rng(21);
  for (int trial = 0; trial < 100; ++trial) {
    const int layers = 2 + static_cast<int>(rng() % 9);  // 2..10
    const int stages = 1 + static_cast<int>(rng() % std::min(layers, 4));
    Profile profile = testing::random_profile(rng, layers, 8);
    for (auto& l : profile.layers) {
      l.forward_launch_ms.assign(l.forward_ms.size(), l.forward_ms.front() * (rng() % 30) / 10.0);
      l.backward_launch_ms.assign(l.backward_ms.size(),
                                  l.backward_ms.front() * (rng() % 30) / 10.0);
    }
    profile.device.backward_call_ms = (rng() % 5) / 10.0;
    const CostModel costs(profile);
    Hardware hardware = replicate_device(profile.device, stages);
    for (auto& d : hardware.devices) d.speed = 0.5 + (rng() % 4) * 0.5;
    const Plan shape = testing::make_plan({}, 1 << (rng() % 4), CheckpointMode::ExceptLast);
    const auto sizes = split_batch(profile.batch_size, shape.chunks);
    const int m = static_cast<int>(sizes.size());
    auto stage_cost = [&](int stage, int begin, int end) {
      const double speed = hardware.devices[stage].speed;
      double ms = 0.0;
      for (int i = 0; i < m; ++i) {
        const SizeCosts& c = costs.at(sizes[i]);
        ms += c.forward_task_ms(begin, end, speed) + c.backward_task_ms(begin, end, speed) +
              (is_checkpointed(shape.checkpoint, i, m) ? c.forward_nograd_task_ms(begin, end, speed)
                                                       : 0.0);
      }
      return ms;
    };
    auto bottleneck_of = [&](const std::vector<int>& balance) {
      double worst = 0.0;
      int first = 0;
      for (int s = 0; s < static_cast<int>(balance.size()); ++s) {
        worst = std::max(worst, stage_cost(s, first, first + balance[s]));
        first += balance[s];
      }
      return worst;
    };
    double best = 1e300;
    std::vector<int> balance;
    std::function<void(int)> place = [&](int left) {
      if (static_cast<int>(balance.size()) == stages - 1) {
        balance.push_back(left);
        best = std::min(best, bottleneck_of(balance));
        balance.pop_back();
        return;
      }
      for (int size = 1; size <= left - (stages - 1 - static_cast<int>(balance.size())); ++size) {
        balance.push_back(size);
        place(left - size);
        balance.pop_back();
      }
    };
    place(layers);
    const std::vector<int> chosen = time_balanced(costs, hardware, stages, shape);
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    ASSERT_EQ(static_cast<int>(chosen.size()), stages);
    EXPECT_NEAR(bottleneck_of(chosen), best, 1e-9 * best);
  }
}

TEST(TimeBalanced, FollowsTheDevicesAPlanNames) {
  // Four equal layers; device "b" is three times as fast as "a". Stage 0 on b, stage 1 on a:
  // the fast device takes three layers. Named the other way round, the split mirrors.
  const Profile profile = testing::uniform_profile(4, 1.0, 2.0, 4);
  const CostModel costs(profile);
  Hardware hardware = replicate_device(profile.device, 2);
  hardware.devices[0].name = "a";
  hardware.devices[1].name = "b";
  hardware.devices[1].speed = 3.0;
  Plan shape = testing::make_plan({}, 1, CheckpointMode::Never);
  shape.devices = {"b", "a"};
  EXPECT_EQ(time_balanced(costs, hardware, 2, shape), (std::vector<int>{3, 1}));
  shape.devices = {"a", "b"};
  EXPECT_EQ(time_balanced(costs, hardware, 2, shape), (std::vector<int>{1, 3}));
  shape.devices.clear();  // one stage per device in order: stage 1 on the fast "b"
  EXPECT_EQ(time_balanced(costs, hardware, 2, shape), (std::vector<int>{1, 3}));
}

TEST(TimeBalanced, IsEmptyWithFewerLayersThanStages) {
  const Profile profile = testing::uniform_profile(2, 1.0, 1.0, 2);
  const Hardware hardware = replicate_device(profile.device, 3);
  EXPECT_TRUE(time_balanced(CostModel(profile), hardware, 3,
                            testing::make_plan({}, 1, CheckpointMode::Never))
                  .empty());
}

}  // namespace
}  // namespace pipetune
