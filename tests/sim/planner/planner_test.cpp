// The planner against brute force: every balance x chunk count x checkpoint mode x schedule
// through the simulator; its budget, its answers at scale and under memory caps. The root bounds
// are in planner_relaxed_root_test.cpp, the multi-stage schedules in planner_multi_stage_test.cpp.

#include "sim/planner/planner.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <random>

#include "bench/synthetic_profile.hpp"
#include "sim/schedule.hpp"
#include "sim/simulator.hpp"
#include "tests/sim/fixtures.hpp"
#include "tests/sim/planner/planner_brute_force.hpp"

namespace pipetune {
namespace {

using namespace planner_testing;

TEST(Planner, EqualsBruteForceOnRandomInstances) {
  std::mt19937 rng(2024);
  int with_caps = 0, infeasible = 0;
  for (int trial = 0; trial < 48; ++trial) {
    const int layers = 2 + static_cast<int>(rng() % 13);                   // 2..14
    const int stages = 1 + static_cast<int>(rng() % std::min(layers, 4));  // 1..4
    const std::int64_t batch = 1 + rng() % 8;
    Profile profile = testing::random_profile(rng, layers, batch);
    if (trial % 3 == 2) {
      // Layers that keep or alias storages, and measured backward peaks: the memory bound's
      // terms that a plain profile leaves at their defaults (own generator, so that the other
      // trials stay as they were).
      std::mt19937 flags(static_cast<unsigned>(trial));
      for (auto& l : profile.layers) {
        l.keeps_input = flags() % 3 != 0;
        l.keeps_output = flags() % 3 == 0;
        l.output_aliases_input = flags() % 4 == 0;
        for (std::size_t k = 0; k < profile.micro_batch_sizes.size() && trial % 4 == 3; ++k) {
          l.backward_peak_bytes.push_back(static_cast<std::int64_t>(flags() % 20000));
          l.backward_accumulate_peak_bytes.push_back(static_cast<std::int64_t>(flags() % 20000));
        }
      }
      testing::modify_some_inputs_in_place(profile);
    }
    Hardware hw = replicate_device(profile.device, stages);
    hw.link.bandwidth_bytes_per_s = 1e5 * (1 + rng() % 100);
    hw.link.latency_ms = (rng() % 5) / 10.0;
    hw.launch_overhead_ms = (rng() % 3) / 100.0;
    for (auto& d : hw.devices) d.speed = 0.5 + (rng() % 4) / 2.0;
    if (trial % 2 == 1) {
      // Caps that bind: between the leanest and the largest peaks of the unconstrained plans.
      const BruteForce free = brute_force(profile, hw);
      const std::int64_t cap =
          static_cast<std::int64_t>(free.leanest_peak * (1.0 + (rng() % 40) / 100.0));
      for (auto& d : hw.devices) d.memory_bytes = cap;
      ++with_caps;
    }
    const BruteForce expected = brute_force(profile, hw);
    PlannerOptions options = single_stage_planner_options();
    options.top = 100;  // every configuration, so each one's best can be checked
    const PlanSearchResult result = find_best_plans(profile, hw, options);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": " << layers << " layers, "
                                      << stages << " stages, batch " << batch);
    EXPECT_TRUE(result.stats.proven);
    if (expected.per_config.empty()) {
      ++infeasible;
      EXPECT_TRUE(result.ranked.empty());
      EXPECT_TRUE(result.none_fits_proven);
      ASSERT_TRUE(result.leanest);
      EXPECT_DOUBLE_EQ(static_cast<double>(result.leanest->max_peak_memory_bytes()),
                       expected.leanest_peak);
      continue;
    }
    ASSERT_FALSE(result.ranked.empty());
    EXPECT_NEAR(result.ranked.front().iteration_ms, expected.best_ms, 1e-9 * expected.best_ms)
        << "brute force: " << describe_plan(expected.best_plan)
        << ", planner: " << describe_plan(result.ranked.front().plan);
    expect_each_ranked_its_configurations_best(result, expected, profile);
  }
  EXPECT_GT(with_caps, 10);
}

// Caps a few per cent above the leanest plan's peak, with three or four stages: the same layers
// make a stage of very different peaks at different places in the pipeline (1F1B's first stage
// holds a micro-batch per stage in flight, its last one), and each configuration's best must
// still be brute force's.
TEST(Planner, TightCapsEqualBruteForcePerConfiguration) {
  std::mt19937 rng(77);
  int compared = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int layers = 6 + static_cast<int>(rng() % 5);  // 6..10
    const int stages = 3 + static_cast<int>(rng() % 2);  // 3..4
    const std::int64_t batch = 4 + rng() % 5;
    Profile profile = testing::random_profile(rng, layers, batch);
    std::mt19937 tie_rng(static_cast<unsigned>(trial));
    testing::maybe_tie_layers(tie_rng, profile);
    testing::maybe_freeze_layers(tie_rng, profile);
    Hardware hw = replicate_device(profile.device, stages);
    hw.link.bandwidth_bytes_per_s = 1e6;
    const BruteForce free = brute_force(profile, hw);
    const auto cap = static_cast<std::int64_t>(free.leanest_peak * (1.0 + (rng() % 10) / 100.0));
    for (auto& d : hw.devices) d.memory_bytes = cap;
    const BruteForce expected = brute_force(profile, hw);
    PlannerOptions options = single_stage_planner_options();
    options.top = 100;
    const PlanSearchResult result = find_best_plans(profile, hw, options);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": " << layers << " layers, "
                                      << stages << " stages, batch " << batch);
    EXPECT_TRUE(result.stats.proven);
    expect_each_ranked_its_configurations_best(result, expected, profile);
    compared += static_cast<int>(result.ranked.size());
  }
  EXPECT_GT(compared, 100);
}

// With worst_order_memory a plan fits only if no arrival order can take a device over its cap:
// the planner's best is the brute force's over those plans, and the rule changes answers.
TEST(Planner, WorstOrderMemoryEqualsBruteForceOverPlansThatFitInEveryOrder) {
  std::mt19937 rng(1126);
  int changed = 0;
  for (int trial = 0; trial < 16; ++trial) {
    const int layers = 3 + static_cast<int>(rng() % 8);                        // 3..10
    const int stages = 2 + static_cast<int>(rng() % std::min(layers - 1, 3));  // 2..4
    const std::int64_t batch = 2 + rng() % 6;
    const Profile profile = testing::random_profile(rng, layers, batch);
    Hardware hw = replicate_device(profile.device, stages);
    hw.link.bandwidth_bytes_per_s = 1e5 * (1 + rng() % 100);
    for (auto& d : hw.devices) d.speed = 0.5 + (rng() % 4) / 2.0;
    const BruteForce free = brute_force(profile, hw);
    const auto cap = static_cast<std::int64_t>(free.leanest_peak * (1.05 + (rng() % 30) / 100.0));
    for (auto& d : hw.devices) d.memory_bytes = cap;
    const BruteForce predicted = brute_force(profile, hw);
    const BruteForce expected = brute_force(profile, hw, true);
    PlannerOptions options = single_stage_planner_options();
    options.worst_order_memory = true;
    const PlanSearchResult result = find_best_plans(profile, hw, options);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": " << layers << " layers, "
                                      << stages << " stages, batch " << batch);
    if (expect_none_fits(result, expected) || !expect_proven_best(result, expected)) continue;
    const PlanCandidate& best = result.ranked.front();
    ASSERT_EQ(best.worst_order_peak_bytes.size(), best.peak_memory_bytes.size());
    for (std::size_t d = 0; d < best.peak_memory_bytes.size(); ++d) {
      EXPECT_GE(best.worst_order_peak_bytes[d], best.peak_memory_bytes[d]);
      EXPECT_LE(best.worst_order_peak_bytes[d], cap);
    }
    if (predicted.best_ms < expected.best_ms) ++changed;
  }
  EXPECT_GE(changed, 2);
}

TEST(Planner, EqualsBruteForceWithDevicesOfVeryDifferentSpeeds) {
  // Speeds 16:1 apart: a slow device may have to take a heavy layer, so the least bottleneck of
  // the later stages need not fall as they get fewer layers. A search that assumes it does
  // prunes the optimum away.
  std::mt19937 rng(31);
  for (int trial = 0; trial < 400; ++trial) {
    const int layers = 3 + static_cast<int>(rng() % 8);                        // 3..10
    const int stages = 2 + static_cast<int>(rng() % std::min(layers - 1, 4));  // 2..5
    const std::int64_t batch = 1 + rng() % 2;
    const Profile profile = testing::random_profile(rng, layers, batch);
    Hardware hw = replicate_device(profile.device, stages);
    hw.link.bandwidth_bytes_per_s = 1e5 * (1 + rng() % 100);
    hw.link.latency_ms = (rng() % 5) / 10.0;
    for (auto& d : hw.devices) d.speed = 0.25 * static_cast<double>(1 + rng() % 16);
    const BruteForce expected = brute_force(profile, hw);
    const PlanSearchResult result = find_best_plans(profile, hw, single_stage_planner_options());
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": " << layers << " layers, "
                                      << stages << " stages, batch " << batch);
    expect_proven_best(result, expected);
    if (result.ranked.empty()) continue;
  }
}

// Host launch times that pace some stages' tasks and not others (LayerProfile::
// forward_launch_ms): about a layer's own device time, so that a stage's pace depends on which
// layers it holds. The planner's bounds take the device's times alone; a task's launches can
// only lengthen it, so they must stay bounds and the search must still find the optimum.
// The planner's 100 best plans: the proven best is the brute force's, and every ranked plan is
// the brute force's best of its configuration.
PlanSearchResult plan_against(const Profile& profile, const Hardware& hw,
                              const BruteForce& expected) {
  PlannerOptions options = single_stage_planner_options();
  options.top = 100;
  PlanSearchResult result = find_best_plans(profile, hw, options);
  expect_proven_best(result, expected);
  for (const auto& c : result.ranked) {
    const auto key = std::make_tuple(split_batch(profile.batch_size, c.plan.chunks),
                                     c.plan.checkpoint, c.plan.schedule);
    EXPECT_TRUE(expected.per_config.count(key)) << describe_plan(c.plan);
    if (expected.per_config.count(key)) {
      EXPECT_NEAR(c.iteration_ms, expected.per_config.at(key), 1e-9 * c.iteration_ms)
          << describe_plan(c.plan);
    }
  }
  return result;
}

// `backward_floor`: the least backward launch time, in the layer's backward device times.
Profile launch_bound_profile(std::mt19937& rng, int layers, std::int64_t batch, int trial,
                             double backward_floor = 0.2) {
  Profile profile = testing::random_profile(rng, layers, batch);
  for (auto& l : profile.layers) {
    // Launches do not grow with the micro-batch: one figure per layer.
    const double forward = l.forward_ms.front() * (0.2 + (rng() % 30) / 10.0);
    const double backward = l.backward_ms.front() * (backward_floor + (rng() % 30) / 10.0);
    l.forward_launch_ms.assign(l.forward_ms.size(), forward);
    l.backward_launch_ms.assign(l.backward_ms.size(), backward);
    if (trial % 2) l.forward_nograd_launch_ms.assign(l.forward_ms.size(), forward * 0.7);
  }
  if (trial % 3 == 0) profile.device.backward_call_ms = profile.layers[0].backward_ms.front() * 0.3;
  return profile;
}

TEST(Planner, LaunchBoundProfilesAgainstBruteForce) {
  std::mt19937 rng(77);
  int paced = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int layers = 2 + static_cast<int>(rng() % 11);                   // 2..12
    const int stages = 1 + static_cast<int>(rng() % std::min(layers, 4));  // 1..4
    const std::int64_t batch = 1 + rng() % 6;
    const Profile profile = launch_bound_profile(rng, layers, batch, trial);
    Hardware hw = random_hardware(rng, profile, stages);
    const BruteForce expected = brute_force(profile, hw);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": " << layers << " layers, "
                                      << stages << " stages, batch " << batch);
    const PlanSearchResult result = plan_against(profile, hw, expected);
    if (result.ranked.empty()) continue;
    for (const ConfigurationStats& c : result.stats.per_configuration) {
      const auto key =
          std::make_tuple(split_batch(profile.batch_size, c.chunks), c.checkpoint, c.schedule);
      if (expected.per_config.count(key)) {
        EXPECT_LE(c.lower_bound_ms, expected.per_config.at(key) * (1 + 1e-12));
      }
    }
    // The launches must matter: the best plan predicted without them is faster.
    Profile device_only = profile;
    for (auto& l : device_only.layers) {
      l.forward_launch_ms.clear();
      l.backward_launch_ms.clear();
      l.forward_nograd_launch_ms.clear();
    }
    if (brute_force(device_only, hw).best_ms < expected.best_ms * (1 - 1e-9)) ++paced;
  }
  EXPECT_GT(paced, 45);
}

// Stages on shares of one GPU launch their backwards on one thread (HardwareDevice::share_of),
// which the planner's sweep does not model: its time is then only a lower bound on the
// simulator's (a lock can only delay a task), so a leaf becomes the best by its simulated time
// alone, and the answer must still be the brute-force optimum.
TEST(Planner, SharesOfOneGpuAgainstBruteForce) {
  std::mt19937 rng(78);
  int slower = 0, configs = 0;
  for (int trial = 0; trial < 30; ++trial) {
    const int layers = 3 + static_cast<int>(rng() % 8);                        // 3..10
    const int stages = 2 + static_cast<int>(rng() % std::min(layers - 1, 3));  // 2..4
    const std::int64_t batch = 2 + rng() % 5;
    const Profile profile = launch_bound_profile(rng, layers, batch, trial, 2.0);
    Hardware hw = random_hardware(rng, profile, stages);
    const BruteForce apart = brute_force(profile, hw);
    for (auto& d : hw.devices) d.share_of = "cuda:0";
    const BruteForce expected = brute_force(profile, hw);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": " << layers << " layers, "
                                      << stages << " stages, batch " << batch);
    plan_against(profile, hw, expected);
    for (const auto& [key, ms] : expected.per_config) {
      const auto it = apart.per_config.find(key);
      ++configs;
      slower += it != apart.per_config.end() && it->second < ms * (1 - 1e-9);
    }
  }
  // The shared thread matters: in many configurations (rarely at the optimum, which launch-bound
  // profiles put at one micro-batch, whose backwards never overlap).
  EXPECT_GT(slower, configs / 4) << slower << " of " << configs;
}

// Shares of one GPU hold their tensors in one memory, each share's peak the GPU's, against the
// GPU's capacity: the planner's memory bounds must stay below that joint peak (a stage there
// receives the sender's tensor itself), and its answer is still the brute-force optimum. Caps
// just above the leanest plan's joint peak rule out plans whose stages would each fit apart.
TEST(Planner, SharesOfOneGpuUnderACapAgainstBruteForce) {
  std::mt19937 rng(1129);
  int fewer = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const int layers = 3 + static_cast<int>(rng() % 6);                        // 3..8
    const int stages = 2 + static_cast<int>(rng() % std::min(layers - 1, 2));  // 2..3
    const std::int64_t batch = 2 + rng() % 5;
    Profile profile = testing::random_profile(rng, layers, batch);
    testing::vary_memory_flags(rng, profile);
    Hardware apart = random_hardware(rng, profile, stages);
    Hardware shares = apart;
    for (auto& d : shares.devices) d.share_of = "cuda:0";
    const auto cap = static_cast<std::int64_t>(brute_force(profile, shares).leanest_peak *
                                               (1.0 + (rng() % 30) / 100.0));
    for (Hardware* hw : {&apart, &shares}) {
      for (auto& d : hw->devices) d.memory_bytes = cap;
    }
    const BruteForce expected = brute_force(profile, shares);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": " << layers << " layers, "
                                      << stages << " stages, batch " << batch);
    plan_against(profile, shares, expected);
    fewer += expected.per_config.size() < brute_force(profile, apart).per_config.size();
  }
  EXPECT_GT(fewer, 12);
}

// torchgpipe's balancer is not optimal (docs/references.md). With many micro-batches the iteration
// is (total + (M - 1) x the slowest stage) per pass, so the best plan has the least bottleneck.
std::vector<int> best_balance(const std::vector<double>& costs, int devices) {
  std::vector<testing::LayerSpec> specs;
  for (double c : costs) specs.push_back({c, 2 * c, 0, 0, 0, 0});
  const Profile profile = testing::make_profile(specs, 32);
  PlannerOptions options = single_stage_planner_options();
  options.chunks = {32};
  options.checkpoints = {CheckpointMode::Never};
  options.schedules = {ScheduleKind::GPipe};
  const auto result = find_best_plans(profile, replicate_device(profile.device, devices), options);
  return result.ranked.at(0).plan.balance;
}

double bottleneck(const std::vector<double>& costs, const std::vector<int>& balance) {
  double worst = 0;
  std::size_t at = 0;
  for (int n : balance) {
    double sum = 0;
    for (int k = 0; k < n; ++k) sum += costs[at++];
    worst = std::max(worst, sum);
  }
  return worst;
}

TEST(Planner, TorchgpipeBalancingCases) {
  const std::vector<double> rising{1, 2, 3, 4, 5, 6};
  EXPECT_EQ(bottleneck(rising, best_balance(rising, 2)), 11);
  const std::vector<double> flat(8, 5);
  EXPECT_EQ(bottleneck(flat, best_balance(flat, 3)), 15);  // torchgpipe: [2,2,4], 20
  const std::vector<double> heavy_first{10, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(bottleneck(heavy_first, best_balance(heavy_first, 2)), 10);  // torchgpipe: 13
  const std::vector<double> pairs{12, 12, 20, 20};
  const auto b = best_balance(pairs, 3);
  EXPECT_TRUE(std::all_of(b.begin(), b.end(), [](int n) { return n >= 1; }));
  EXPECT_EQ(bottleneck(pairs, b), 24);
}

TEST(Planner, MemoryCapExcludesTheFastestPlan) {
  std::mt19937 rng(5);
  const Profile profile = testing::random_profile(rng, 8, 8);
  Hardware hw = replicate_device(profile.device, 3);
  const auto free = find_best_plans(profile, hw, single_stage_planner_options());
  ASSERT_FALSE(free.ranked.empty());
  const auto& fastest = free.ranked.front();
  // One byte less than the fastest plan needs on its fullest device.
  for (auto& d : hw.devices) d.memory_bytes = fastest.max_peak_memory_bytes() - 1;
  const auto capped = find_best_plans(profile, hw, single_stage_planner_options());
  const BruteForce expected = brute_force(profile, hw);
  ASSERT_FALSE(capped.ranked.empty());
  EXPECT_NE(capped.ranked.front().plan, fastest.plan);
  EXPECT_GE(capped.ranked.front().iteration_ms, fastest.iteration_ms);
  EXPECT_NEAR(capped.ranked.front().iteration_ms, expected.best_ms, 1e-9 * expected.best_ms);
  EXPECT_LE(capped.ranked.front().max_peak_memory_bytes(), hw.devices[0].memory_bytes);
}

TEST(Planner, NothingFitsReportsTheLeanestPlan) {
  std::mt19937 rng(9);
  const Profile profile = testing::random_profile(rng, 6, 4);
  Hardware hw = replicate_device(profile.device, 2);
  for (auto& d : hw.devices) d.memory_bytes = 1000;  // far too little
  const auto result = find_best_plans(profile, hw, single_stage_planner_options());
  EXPECT_TRUE(result.ranked.empty());
  EXPECT_TRUE(result.none_fits_proven);
  ASSERT_TRUE(result.leanest);
  const BruteForce expected = brute_force(profile, hw);
  EXPECT_EQ(static_cast<double>(result.leanest->max_peak_memory_bytes()), expected.leanest_peak);
  // With that much memory per device, the leanest plan fits.
  for (auto& d : hw.devices) d.memory_bytes = result.leanest->max_peak_memory_bytes();
  EXPECT_TRUE(Simulator(profile, hw).run(result.leanest->plan).fits());
}

// A large model under a cap can spend the whole budget in the cheap pass, every configuration
// ruled out by its memory bounds and none simulated: the search for the leanest plan then has
// no step left, and it reported no plan at all. Each checkpoint mode and schedule's
// memory-balanced plan is now simulated whatever the budget.
TEST(Planner, NothingFitsAndNoBudgetLeftStillReportsALeanPlan) {
  std::mt19937 rng(31);
  double worst = 0.0;
  for (int trial = 0; trial < 12; ++trial) {
    const int layers = 6 + static_cast<int>(rng() % 6);  // 6..11
    const int stages = 2 + static_cast<int>(rng() % 2);  // 2..3
    const Profile profile = testing::random_profile(rng, layers, 2 + rng() % 7);
    Hardware hw = replicate_device(profile.device, stages);
    for (auto& d : hw.devices) d.memory_bytes = 1000;  // far too little
    PlannerOptions options = single_stage_planner_options();
    options.search_budget = 1;
    const auto result = find_best_plans(profile, hw, options);
    EXPECT_TRUE(result.ranked.empty());
    EXPECT_TRUE(result.none_fits_proven);  // the memory bounds rule every configuration out
    ASSERT_TRUE(result.leanest);
    EXPECT_FALSE(result.leanest_proven);
    // Its peaks are the simulator's, and no plan is leaner than brute force's leanest.
    const auto simulated = Simulator(profile, hw).run(result.leanest->plan);
    EXPECT_EQ(result.leanest->max_peak_memory_bytes(), simulated.max_peak_memory_bytes());
    const BruteForce expected = brute_force(profile, hw);
    const double ratio =
        static_cast<double>(result.leanest->max_peak_memory_bytes()) / expected.leanest_peak;
    EXPECT_GE(ratio, 1.0);
    worst = std::max(worst, ratio);
  }
  // A seed, not a proof (leanest_proven is false): 1.23 times the optimum at worst on these 12
  // instances when written.
  EXPECT_LE(worst, 1.5);
}

// A budget too small to find a fitting plan is not a proof that none fits: the result says
// which it is (the report's "no plan fits" against "none found before the budget ran out"), and
// a leanest plan that fits after all is the answer. Shares of one GPU under a cap, where the
// cheap pass's first plans (each stage within its share of the cap) often miss what fits.
TEST(Planner, ABudgetEndingBeforeAFitIsNotAProofThatNoneFits) {
  std::mt19937 rng(3);
  int unfound = 0, none_fit = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int layers = 4 + static_cast<int>(rng() % 6);  // 4..9
    const int stages = 2 + static_cast<int>(rng() % 3);  // 2..4
    Profile profile = testing::random_profile(rng, layers, 1 + rng() % 8);
    for (auto& l : profile.layers) {
      l.keeps_input = rng() % 3 != 0;
      l.output_aliases_input = rng() % 4 == 0;
    }
    testing::modify_some_inputs_in_place(profile);
    Hardware hw = random_hardware(rng, profile, stages);
    for (auto& d : hw.devices) d.share_of = "cuda:0";
    const BruteForce free = brute_force(profile, hw);
    const auto cap = static_cast<std::int64_t>(free.leanest_peak * (0.95 + (rng() % 60) / 100.0));
    for (auto& d : hw.devices) d.memory_bytes = cap;
    const BruteForce expected = brute_force(profile, hw);
    const bool some_fit = !expected.per_config.empty();
    none_fit += some_fit ? 0 : 1;
    for (std::uint64_t budget : {std::uint64_t{1}, PlannerOptions{}.search_budget}) {
      PlannerOptions options = single_stage_planner_options();
      options.search_budget = budget;
      const PlanSearchResult result = find_best_plans(profile, hw, options);
      SCOPED_TRACE(::testing::Message() << "trial " << trial << ", budget " << budget);
      if (!result.ranked.empty()) {
        EXPECT_FALSE(result.none_fits_proven);
        EXPECT_GE(result.ranked.front().iteration_ms, expected.best_ms * (1 - 1e-12));
        EXPECT_TRUE(Simulator(profile, hw).run(result.ranked.front().plan).fits());
        continue;
      }
      // Proven only where true; with the default budget, always proven on these small models.
      if (result.none_fits_proven) {
        EXPECT_FALSE(some_fit);
      }
      if (budget == PlannerOptions{}.search_budget) {
        EXPECT_EQ(result.none_fits_proven, !some_fit);
      }
      if (some_fit) {
        ++unfound;
        EXPECT_FALSE(result.stats.proven);
      }
      // A leanest plan that fits would have been the answer.
      if (result.leanest) {
        EXPECT_FALSE(Simulator(profile, hw).run(result.leanest->plan).fits());
      }
    }
  }
  EXPECT_GT(none_fit, 0);
  // 1 of the 60 instances when written: the budget of one step ends with the cheap pass, whose
  // first plans hold each stage within its share of the GPU's memory. Should the cheap pass
  // learn to find these, other instances are needed here.
  EXPECT_GT(unfound, 0);
  RecordProperty("unfound", unfound);
}

TEST(Planner, UniformLayersAreSolvedWithoutSearching) {
  // The bounds are tight for uniform stages: the first incumbent is proven optimal at once.
  const Profile profile = testing::uniform_profile(64, 1.0, 2.0, 32);
  PlannerOptions options = single_stage_planner_options();
  options.top = 1;
  const auto result = find_best_plans(profile, replicate_device(profile.device, 8), options);
  ASSERT_FALSE(result.ranked.empty());
  EXPECT_EQ(result.ranked.front().plan.balance, std::vector<int>(8, 8));
  EXPECT_LT(result.stats.simulations, 200u);
  EXPECT_TRUE(result.stats.proven);
}

// The case of issue 15: bench's 1,000-layer synthetic profile on 16 devices, every chunk count,
// checkpoint mode and schedule. [62,63,63,63,63,62,63,63,62,63,62,63,62,62,62,62] x26 never 1f1b
// simulates to 1924.672409 ms (the previous planner answered 1924.903749 ms, not proven); the
// search must reach it or better and prove that nothing beats it.
TEST(Planner, ThousandLayersOnSixteenDevicesIsProven) {
  const Profile profile = bench::synthetic_profile(1000, 256);
  Hardware hw = replicate_device(profile.device, 16);
  bench::set_synthetic_links(hw);
  PlannerOptions options = single_stage_planner_options();
  options.top = 1;
  options.search_budget = 100'000'000;
  const auto result = find_best_plans(profile, hw, options);
  ASSERT_FALSE(result.ranked.empty());
  EXPECT_TRUE(result.stats.proven);
  EXPECT_LE(result.ranked.front().iteration_ms, 1924.672409);
  // The simulator agrees with the time the sweep gave the search.
  const auto simulated = Simulator(profile, hw).run(result.ranked.front().plan);
  EXPECT_EQ(simulated.iteration_ms, result.ranked.front().iteration_ms);
}

// The planner with GPipe and 1F1B within `budget` steps: its answer proven, no slower than
// `known`, and timed as the simulator times it.
void expect_proven_no_slower_than(const Profile& profile, const Hardware& hw, const Plan& known,
                                  std::uint64_t budget) {
  const double known_ms = Simulator(profile, hw).run(known).iteration_ms;
  PlannerOptions options = single_stage_planner_options();
  options.top = 1;
  options.schedules = {ScheduleKind::GPipe, ScheduleKind::OneFOneB};
  options.search_budget = budget;
  const auto result = find_best_plans(profile, hw, options);
  ASSERT_FALSE(result.ranked.empty());
  EXPECT_TRUE(result.stats.proven);
  EXPECT_LE(result.ranked.front().iteration_ms, known_ms);
  EXPECT_EQ(Simulator(profile, hw).run(result.ranked.front().plan).iteration_ms,
            result.ranked.front().iteration_ms);
}

// Issue 15's lognormal case: bench's 1,000-layer lognormal profile on 16 devices at 20 GB/s, GPipe
// and 1F1B. [64,52,61,68,68,59,63,58,65,65,58,71,61,67,64,56] x26 never 1f1b is eight stage ends
// of one or two layers from the plan the moves of polish() stop at (1967.553 ms): the search
// around the best plan must reach it or better, and the search prove it, within 2 M steps: 0.7 M
// with 1F1B's prefix sweeps paced by the later stages, 9.8 M with idle round trips (21 M when the
// optimum was found late).
TEST(Planner, LognormalThousandLayersOnSixteenDevicesIsProven) {
  const Profile profile = bench::lognormal_profile(1000, 256);
  Hardware hw = replicate_device(profile.device, 16);
  hw.link.bandwidth_bytes_per_s = 2e10;
  const Plan known =
      testing::make_plan({64, 52, 61, 68, 68, 59, 63, 58, 65, 65, 58, 71, 61, 67, 64, 56}, 26,
                         CheckpointMode::Never, ScheduleKind::OneFOneB);
  expect_proven_no_slower_than(profile, hw, known, 2'000'000);
}

// Issue 15's unequal devices: bench's 1,000-layer synthetic profile on 16 devices of speeds 1.5,
// 1, 0.75 and 1 repeated, GPipe and 1F1B, in the default budget. Its optimum,
// [94,64,49,64,95,65,46,63,96,64,1,61,91,58,29,60] x26 never 1f1b (a stage of one layer on a
// slow device), lies a layer or two from the relaxed root's plan at several ends at once and far
// from the polished plans (1811.6 ms): the search from the left came upon it after 14.3 M
// steps of a 15.1 M-step proof, and the default budget ended at a 0.40 % gap. The search around
// the relaxed root's plan finds a plan near it in 0.11 M steps; the search must then reach it or
// better and prove it.
TEST(Planner, UnequalDevicesThousandLayersAreProvenInTheDefaultBudget) {
  const Profile profile = bench::synthetic_profile(1000, 256);
  Hardware hw = replicate_device(profile.device, 16);
  bench::set_unequal_speeds(hw);
  bench::set_synthetic_links(hw);
  const Plan known =
      testing::make_plan({94, 64, 49, 64, 95, 65, 46, 63, 96, 64, 1, 61, 91, 58, 29, 60}, 26,
                         CheckpointMode::Never, ScheduleKind::OneFOneB);
  expect_proven_no_slower_than(profile, hw, known, PlannerOptions{}.search_budget);
}

// The search around a plan (single_stage_best_around(): the search itself within a window of
// stage ends, each stage's ends tried from the centre's outwards, the centre the plan to beat
// where it fits, as in the planner) against brute force over every balance in the window: random
// instances with devices of very different speeds, task overheads, links and, in every other trial,
// a memory cap. Its answer lies in the window, fits, is timed as the simulator times it, and no
// fitting plan of the window is faster by the margin.
TEST(Planner, SearchAroundAPlanFindsTheFastestPlanOfItsWindow) {
  std::mt19937 rng(3131);
  constexpr int kTrials = 120;
  int moved = 0, none = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    const int layers = 6 + static_cast<int>(rng() % 15);  // 6..20
    const int stages = 2 + static_cast<int>(rng() % 3);   // 2..4
    const std::int64_t batch = 1 + rng() % 6;
    const Profile profile = testing::random_profile(rng, layers, batch);
    Hardware hw = random_hardware(rng, profile, stages);
    if (trial % 2 == 1) {
      const BruteForce free = brute_force(profile, hw);
      const auto cap = static_cast<std::int64_t>(free.leanest_peak * (1.0 + (rng() % 40) / 100.0));
      for (auto& d : hw.devices) d.memory_bytes = cap;
    }
    const Simulator simulator(profile, hw);
    const int radius = 1 + static_cast<int>(rng() % 4);
    const std::vector<int> centre =
        testing::balance_of_ends(testing::random_stage_ends(rng, layers, stages));
    const int chunks = 1 + static_cast<int>(rng() % batch);
    const CheckpointMode checkpoint = kAllCheckpointModes[rng() % 3];
    const ScheduleKind schedule = kSingleStageScheduleKinds[rng() % 2];
    const Plan plan = testing::make_plan(centre, chunks, checkpoint, schedule);
    auto within = [&](const std::vector<int>& balance) {
      for (int k = 0, end = 0, centre_end = 0; k + 1 < stages; ++k) {
        end += balance[k];
        centre_end += centre[k];
        if (std::abs(end - centre_end) > radius) return false;
      }
      return true;
    };
    double fastest = 0.0;
    int in_window = 0;
    for_each_balance(layers, stages, [&](const std::vector<int>& balance) {
      if (!within(balance)) return;
      ++in_window;
      Plan other = plan;
      other.balance = balance;
      const SimulationResult r = simulator.run(other);
      if (r.fits() && (fastest == 0.0 || r.iteration_ms < fastest)) fastest = r.iteration_ms;
    });
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << ", " << layers << " layers, " << stages
                 << " stages, radius " << radius << ", " << describe_plan(plan));
    const PlanCandidate found = single_stage_best_around(profile, hw, plan, radius);
    if (fastest == 0.0) {
      EXPECT_EQ(found.iteration_ms, 0.0);
      ++none;
      continue;
    }
    ASSERT_GT(found.iteration_ms, 0.0);
    EXPECT_TRUE(within(found.plan.balance));
    const SimulationResult r = simulator.run(found.plan);
    EXPECT_TRUE(r.fits());
    EXPECT_EQ(r.iteration_ms, found.iteration_ms);
    EXPECT_GE(fastest, found.iteration_ms * (1 - 2e-4) * (1 - 1e-12));
    if (found.plan.balance != centre && in_window > 4) ++moved;
  }
  // The windows bite: most answers are not the centre, and under some caps nothing fits.
  EXPECT_GT(moved, kTrials / 2);
  EXPECT_GT(none, 0);
}

// Equal blocks with costs linear in the micro-batch size and free copies, at the scale
// (1,024 layers, so that 16 equal stages of 64 exist): with M equal micro-batches of B / M
// samples both schedules take (M + K - 1)(B / M)(f + b) per stage, least at M = B, i.e.
// (B + K - 1)(f + b) with f, b one sample's costs; the planner must find it among every chunk
// count, checkpoint mode and schedule, and prove it.
TEST(Planner, EqualBlocksAtScaleReachTheKnownOptimum) {
  const int layers = 1024, stages = 16;
  const std::int64_t batch = 32;
  std::vector<testing::LayerSpec> specs(layers, testing::LayerSpec{0.01, 0.02, 0, 0, 0, 0});
  Profile profile = testing::make_profile(specs, batch);
  for (auto& l : profile.layers) {
    for (std::size_t k = 0; k < profile.micro_batch_sizes.size(); ++k) {
      l.forward_ms[k] *= static_cast<double>(profile.micro_batch_sizes[k]);
      l.backward_ms[k] *= static_cast<double>(profile.micro_batch_sizes[k]);
    }
  }
  PlannerOptions options = single_stage_planner_options();
  options.top = 1;
  const auto result = find_best_plans(profile, replicate_device(profile.device, stages), options);
  ASSERT_FALSE(result.ranked.empty());
  EXPECT_TRUE(result.stats.proven);
  // Per stage and sample: 64 layers x (0.01 + 0.02) ms.
  const double per_stage = 64 * 0.03;
  EXPECT_NEAR(result.ranked.front().iteration_ms, (batch + stages - 1) * per_stage, 1e-9);
  EXPECT_EQ(result.ranked.front().plan.balance, std::vector<int>(stages, 64));
}

// Issue 15: the budget is shared between the configurations. With less budget than the first
// configuration alone needs, every configuration still gets its root bound and first plan, the
// answer is no worse than any configuration's first plan (each found alone with no budget), and
// the bound stays below the optimum proven with a large budget.
TEST(Planner, SmallBudgetStillVisitsEveryConfiguration) {
  // Large enough that more than one configuration needs a search (the relaxed root closes
  // every other configuration of smaller cases before any search).
  const Profile profile = bench::lognormal_profile(100, 16);
  Hardware hw = replicate_device(profile.device, 8);
  hw.link.bandwidth_bytes_per_s = 2e10;
  PlannerOptions options = single_stage_planner_options();
  options.top = 1;
  options.search_budget = 100'000'000;
  const auto full = find_best_plans(profile, hw, options);
  ASSERT_TRUE(full.stats.proven);
  ASSERT_FALSE(full.ranked.empty());
  const double optimum = full.ranked.front().iteration_ms;

  // What the first configuration (the least balance-free bound) needs on its own.
  const ConfigurationStats& first = full.stats.per_configuration.front();
  PlannerOptions alone = options;
  alone.chunks = {first.chunks};
  alone.checkpoints = {first.checkpoint};
  alone.schedules = {first.schedule};
  const auto first_alone = find_best_plans(profile, hw, alone);
  ASSERT_TRUE(first_alone.stats.proven);
  const std::uint64_t needed = first_alone.stats.steps;
  ASSERT_GT(needed, 1000u);

  options.search_budget = needed / 2;
  const auto split = find_best_plans(profile, hw, options);
  ASSERT_FALSE(split.ranked.empty());
  const double answer = split.ranked.front().iteration_ms;
  EXPECT_GE(answer, optimum * (1 - 1e-12));
  EXPECT_LE(split.stats.lower_bound_ms, optimum * (1 + 1e-12));
  EXPECT_EQ(split.stats.per_configuration.size(), split.stats.configurations);

  std::size_t sliced = 0;
  for (const ConfigurationStats& c : split.stats.per_configuration) {
    SCOPED_TRACE(::testing::Message() << "x" << c.chunks << " " << to_string(c.checkpoint) << " "
                                      << to_string(c.schedule));
    // Skipped only when its balance-free bound already loses to the answer.
    if (!c.evaluated) {
      EXPECT_GE(c.lower_bound_ms, answer);
    }
    // Left open only with a bound that the answer's gap accounts for.
    if (!c.closed) {
      EXPECT_GE(c.lower_bound_ms, split.stats.lower_bound_ms);
    }
    if (c.slices > 0) ++sliced;
    // Its first plan, alone and without budget: the answer is at least as fast.
    PlannerOptions root_only = single_stage_planner_options();
    root_only.top = 1;
    root_only.chunks = {c.chunks};
    root_only.checkpoints = {c.checkpoint};
    root_only.schedules = {c.schedule};
    root_only.search_budget = 0;
    const auto incumbent = find_best_plans(profile, hw, root_only);
    if (!incumbent.ranked.empty()) {
      EXPECT_LE(answer, incumbent.ranked.front().iteration_ms);
    }
  }
  // The first configuration did not take the whole budget: others were searched too.
  EXPECT_GT(sliced, 1u);
}

// Where the budget ends before the proof, the answer is still no slower than any plan a few
// layers away from it (the search polishes its best plans): every move of one stage end by up
// to four layers, and of two adjacent ends by up to three each, simulated here, is slower or
// does not fit. Memory caps make the search's own order reach such plans late.
TEST(Planner, UnprovenAnswerIsNoSlowerThanThePlansAroundIt) {
  for (const bool capped : {true, false}) {
    SCOPED_TRACE(capped ? "capped" : "uncapped");
    const Profile profile = bench::lognormal_profile(300, 64);
    Hardware hw = replicate_device(profile.device, 16);
    hw.link.bandwidth_bytes_per_s = 2e10;
    if (capped) {
      bench::cap_at_parameter_share(hw, profile, 2.5);
    }
    PlannerOptions options = single_stage_planner_options();
    options.top = 1;
    // Short of both proofs (the uncapped one takes 0.97 M steps since the prefix programmes),
    // with enough for the capped one's polish.
    options.search_budget = capped ? 2'000'000 : 500'000;
    const auto result = find_best_plans(profile, hw, options);
    ASSERT_FALSE(result.ranked.empty());
    ASSERT_FALSE(result.stats.proven);  // else nothing is faster anywhere
    const PlanCandidate& answer = result.ranked.front();
    const Simulator simulator(profile, hw);
    const std::vector<int>& balance = answer.plan.balance;
    const int stages = static_cast<int>(balance.size());
    for (int k = 0; k + 1 < stages; ++k) {
      for (int d = -4; d <= 4; ++d) {
        std::vector<int> moved = balance;
        moved[k] += d;
        moved[k + 1] -= d;
        EXPECT_FALSE(d != 0 && fits_faster(simulator, answer, moved))
            << "end " << k << " moved by " << d;
        for (int e = -3; e <= 3 && k + 2 < stages; ++e) {
          std::vector<int> pair = moved;
          pair[k + 1] += e;
          pair[k + 2] -= e;
          EXPECT_FALSE(std::abs(d) < 4 && e != 0 && fits_faster(simulator, answer, pair))
              << "ends " << k << ", " << k + 1 << " moved by " << d << ", " << e;
        }
      }
    }
  }
}

// Under memory caps the fastest shares of the work often overflow a device by a few layers, and
// the plans balanced for the caps alone are far slower. Independent of the planner's search: the
// uncapped answer, walked by the simulator to a fitting plan (moves of one stage end by up to
// four layers or of two adjacent ones by up to three, each lowering the excess over the caps,
// then the time once it fits). The capped answer must be at least as fast as that plan. (Without
// repair(): 5.6 % slower.)
TEST(Planner, CappedAnswerIsNoSlowerThanTheUncappedAnswerMadeToFit) {
  const Profile profile = bench::lognormal_profile(400, 64);
  Hardware hw = replicate_device(profile.device, 12);
  hw.link.bandwidth_bytes_per_s = 2e10;
  PlannerOptions options = single_stage_planner_options();
  options.top = 1;
  options.search_budget = 2'000'000;
  // Every micro-batch recomputed, so that the cap rules out few balances but the fastest.
  options.checkpoints = {CheckpointMode::Always};
  const auto uncapped = find_best_plans(profile, hw, options);
  ASSERT_FALSE(uncapped.ranked.empty());
  std::int64_t params = 0;
  for (const auto& l : profile.layers) params += l.param_bytes;
  for (auto& d : hw.devices) d.memory_bytes = static_cast<std::int64_t>(2.5 * params / 12);
  const auto capped = find_best_plans(profile, hw, options);
  ASSERT_FALSE(capped.ranked.empty());

  const Simulator simulator(profile, hw);
  auto score = [&](const Plan& plan) {
    if (std::any_of(plan.balance.begin(), plan.balance.end(), [](int n) { return n < 1; }))
      return std::pair{1e300, 1e300};
    const auto r = simulator.run(plan);
    double excess = 0;
    for (const auto& d : r.devices)
      excess += static_cast<double>(
          std::max<std::int64_t>(0, d.peak_memory_bytes - d.memory_capacity_bytes));
    return std::pair{excess, r.iteration_ms};
  };
  Plan plan = uncapped.ranked.front().plan;
  auto best = score(plan);
  ASSERT_GT(best.first, 0) << "the cap must rule out the uncapped answer";
  for (bool improved = true; improved;) {
    improved = false;
    for (int k = 0; k + 1 < plan.stages(); ++k) {
      for (int d = -4; d <= 4; ++d) {
        Plan moved = plan;
        moved.balance[k] += d;
        moved.balance[k + 1] -= d;
        const auto s = score(moved);
        if (d != 0 && s < best) best = s, plan = moved, improved = true;
        for (int e = -3; e <= 3 && k + 2 < plan.stages() && std::abs(d) < 4; ++e) {
          Plan pair = moved;
          pair.balance[k + 1] += e;
          pair.balance[k + 2] -= e;
          const auto t = score(pair);
          if (e != 0 && t < best) best = t, plan = pair, improved = true;
        }
      }
    }
  }
  ASSERT_EQ(best.first, 0) << "no fitting plan found from "
                           << describe_plan(uncapped.ranked.front().plan);
  EXPECT_LE(capped.ranked.front().iteration_ms, best.second * (1 + 1e-12))
      << "made to fit: " << describe_plan(plan) << " " << best.second
      << " ms; planner: " << describe_plan(capped.ranked.front().plan);
}

// A calibrated hardware file plans as the same hardware with the calibration folded into its
// durations (calibrated()), and the answer's time is the simulator's on the calibrated file.
TEST(Planner, PlansWithTheCalibratedDurations) {
  testing::LayerSpec a{1.0, 2.0, 1000, 400, 50, 0}, b{0.5, 1.5, 500, 4000, 10, 0};
  const Profile profile = testing::make_profile({a, b, a, b}, 8, 10);
  Hardware hardware = replicate_device(profile.device, 2);
  hardware.link.bandwidth_bytes_per_s = 1e6;
  hardware.link.latency_ms = 0.1;
  hardware.calibration.compute_scale[2] = 2.0;
  hardware.calibration.task_overhead_ms = 0.25;
  PlannerOptions options = single_stage_planner_options();
  options.chunks = {1, 2, 4};
  const PlanSearchResult with = find_best_plans(profile, hardware, options);
  const PlanSearchResult applied = find_best_plans(profile, calibrated(hardware, 2), options);
  ASSERT_FALSE(with.ranked.empty());
  EXPECT_EQ(with.ranked[0].plan, applied.ranked[0].plan);
  EXPECT_DOUBLE_EQ(with.ranked[0].iteration_ms, applied.ranked[0].iteration_ms);
  EXPECT_NEAR(with.ranked[0].iteration_ms,
              Simulator(profile, hardware).run(with.ranked[0].plan).iteration_ms, 1e-9);
}

// A model that cannot train on micro-batches under 2 or 3 samples (batch norm over one value per
// channel): the planner's answer is brute force's best over the chunk counts whose every
// micro-batch holds that many, and no plan it ranks splits the batch finer.
TEST(Planner, NoMicroBatchUnderTheFewestSamplesTheModelTrainsOn) {
  std::mt19937 rng(77);
  int narrowed = 0;
  for (int trial = 0; trial < 16; ++trial) {
    const int layers = 2 + static_cast<int>(rng() % 7);
    const int stages = 1 + static_cast<int>(rng() % std::min(layers, 3));
    const std::int64_t batch = 4 + rng() % 7;  // 4..10
    Profile profile = testing::random_profile(rng, layers, batch);
    profile.min_micro_batch = 2 + static_cast<std::int64_t>(rng() % 2);
    Hardware hw = replicate_device(profile.device, stages);
    hw.link.bandwidth_bytes_per_s = 1e5 * (1 + rng() % 100);
    const auto trains = [&](const Plan& plan) { return splits_trainably(profile, plan.chunks); };
    const BruteForce expected = brute_force(profile, hw, false, trains);
    Profile anything = profile;
    anything.min_micro_batch = 1;
    narrowed += brute_force(anything, hw).best_ms < expected.best_ms;
    PlannerOptions options = single_stage_planner_options();
    options.top = 100;
    const PlanSearchResult result = find_best_plans(profile, hw, options);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": batch " << batch << ", at least "
                                      << profile.min_micro_batch);
    ASSERT_FALSE(result.ranked.empty());
    EXPECT_NEAR(result.ranked.front().iteration_ms, expected.best_ms, 1e-9 * expected.best_ms)
        << "brute force: " << describe_plan(expected.best_plan)
        << ", planner: " << describe_plan(result.ranked.front().plan);
    for (const auto& c : result.ranked) EXPECT_TRUE(trains(c.plan)) << describe_plan(c.plan);
  }
  EXPECT_GT(narrowed, 0);  // in some trials the fastest plan of all splits finer: the rule bites
}

}  // namespace
}  // namespace pipetune
