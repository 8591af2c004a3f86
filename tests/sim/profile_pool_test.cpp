// Profiles pooled: each time the median over the profiles that measured it, each spread the
// within and between spreads in quadrature, worked out by hand; what does not pool refused.

#include "sim/profile_pool.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "sim/error.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

// Two layers at sizes 1, 2, 4; every time of profile `k` scaled by `pace` so that each field's
// median is known by hand.
Profile paced_profile(double pace, double spread) {
  Profile p = testing::make_profile(
      {testing::LayerSpec{2.0, 4.0, 64, 8, 8, 0}, testing::LayerSpec{3.0, 5.0, 128, 8, 0, 0}}, 4);
  for (auto& l : p.layers) {
    for (auto& t : l.forward_ms) t *= pace;
    for (auto& t : l.backward_ms) t *= pace;
    l.forward_cold_ms = l.forward_ms;
    for (auto& t : l.forward_cold_ms) t += 0.5 * pace;
    l.forward_ms_spread.assign(l.forward_ms.size(), spread);
    l.backward_ms_spread.assign(l.backward_ms.size(), spread);
  }
  p.device.backward_call_ms = 0.1 * pace;
  return p;
}

// Only the sizes listed, as a profile taken with --micro-batch-sizes.
Profile only_sizes(Profile p, const std::vector<std::size_t>& keep) {
  auto pick = [&](auto& v) {
    auto all = v;
    v.clear();
    for (std::size_t k : keep) v.push_back(all[k]);
  };
  pick(p.micro_batch_sizes);
  pick(p.input_bytes);
  for (auto& l : p.layers) {
    pick(l.forward_ms);
    pick(l.backward_ms);
    pick(l.output_bytes);
    pick(l.saved_bytes);
    pick(l.workspace_bytes);
    pick(l.forward_cold_ms);
    pick(l.forward_ms_spread);
    pick(l.backward_ms_spread);
  }
  return p;
}

// Paces 1.0, 1.3 and 0.9: the median is the 1.0 profile's time; the medians' deviations from it
// are 0, 0.3 t and 0.1 t, so between = 0.1 t, and within = the median spread.
TEST(ProfilePool, EachTimeIsTheMedianAndEachSpreadAddsHowFarTheProfilesStray) {
  const std::vector<Profile> profiles{paced_profile(1.0, 0.02), paced_profile(1.3, 0.05),
                                      paced_profile(0.9, 0.01)};
  const Profile pooled = pool_profiles(profiles, {"a.json", "b.json", "c.json"});
  ASSERT_EQ(pooled.layers.size(), 2u);
  for (std::size_t l = 0; l < 2; ++l) {
    const LayerProfile& one = profiles[0].layers[l];
    for (std::size_t s = 0; s < 3; ++s) {
      EXPECT_DOUBLE_EQ(pooled.layers[l].forward_ms[s], one.forward_ms[s]);
      EXPECT_DOUBLE_EQ(pooled.layers[l].backward_ms[s], one.backward_ms[s]);
      EXPECT_DOUBLE_EQ(pooled.layers[l].forward_cold_ms[s], one.forward_cold_ms[s]);
      EXPECT_NEAR(pooled.layers[l].forward_ms_spread[s], std::hypot(0.02, 0.1 * one.forward_ms[s]),
                  1e-12);
      EXPECT_NEAR(pooled.layers[l].backward_ms_spread[s],
                  std::hypot(0.02, 0.1 * one.backward_ms[s]), 1e-12);
    }
    EXPECT_EQ(pooled.layers[l].saved_bytes, one.saved_bytes);
    EXPECT_EQ(pooled.layers[l].param_bytes, one.param_bytes);
  }
  EXPECT_DOUBLE_EQ(pooled.device.backward_call_ms, 0.1);
}

// Later profiles measured only size 2 (the plans' own): sizes 1 and 4 keep the first profile's
// times and spreads; size 2 pools all three.
TEST(ProfilePool, ASizeOnlyTheFirstProfileMeasuredKeepsItsTimes) {
  const Profile first = paced_profile(1.3, 0.02);
  const std::vector<Profile> profiles{first, only_sizes(paced_profile(1.0, 0.02), {1}),
                                      only_sizes(paced_profile(0.9, 0.02), {1})};
  const Profile pooled = pool_profiles(profiles, {"a", "b", "c"});
  ASSERT_EQ(pooled.micro_batch_sizes, first.micro_batch_sizes);
  const LayerProfile& l = pooled.layers[1];
  EXPECT_DOUBLE_EQ(l.forward_ms[0], first.layers[1].forward_ms[0]);
  EXPECT_DOUBLE_EQ(l.forward_ms[2], first.layers[1].forward_ms[2]);
  EXPECT_DOUBLE_EQ(l.forward_ms_spread[0], 0.02);
  EXPECT_DOUBLE_EQ(l.forward_ms[1], 3.0);  // the 1.0-paced profile's, the middle of three
  EXPECT_NEAR(l.forward_ms_spread[1], std::hypot(0.02, 0.3), 1e-12);  // deviations 0.9, 0, 0.3
}

TEST(ProfilePool, ProfilesThatDoNotPoolAreRefusedNamingTheFileAndField) {
  const Profile first = paced_profile(1.0, 0.0);
  auto error = [&](Profile other) {
    try {
      pool_profiles({first, other}, {"a.json", "b.json"});
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  Profile other_model = first;
  other_model.model = "other";
  EXPECT_NE(error(other_model).find("b.json: \"model\" is other"), std::string::npos)
      << error(other_model);
  Profile fewer_layers = first;
  fewer_layers.layers.pop_back();
  EXPECT_NE(error(fewer_layers).find("b.json: \"layers\""), std::string::npos);
  Profile other_size = first;
  other_size.micro_batch_sizes.back() = 3;
  EXPECT_NE(error(other_size).find("b.json: \"micro_batch_sizes\" has 3"), std::string::npos);
  Profile renamed = first;
  renamed.layers[1].name = "head";
  EXPECT_NE(error(renamed).find("\"layers[1].name\" is head"), std::string::npos);
  EXPECT_THROW(pool_profiles({}, {}), InputError);
}

}  // namespace
}  // namespace pipetune
