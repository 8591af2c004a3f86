// The planner's multi-stage schedules (sim/planner/multi_stage_root.cpp and
// multi_stage_search.cpp): against brute force, their bounds below every plan, their
// answers under budgets and caps.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <random>

#include "bench/synthetic_profile.hpp"
#include "sim/planner/multi_stage_peak_bound.hpp"
#include "sim/planner/planner.hpp"
#include "sim/planner/root_programme.hpp"
#include "sim/schedule.hpp"
#include "sim/simulator.hpp"
#include "tests/sim/fixtures.hpp"
#include "tests/sim/planner/planner_brute_force.hpp"

namespace pipetune {
namespace {

// torch's runtime, whose first stage does its whole split backward at W, on a profile whose
// backward halves cost more than the whole: the executor's pricing of that stage would then
// put the bounds above torch's plans.
void on_torch(Hardware& hw, Profile& profile) {
  hw.runtime = Runtime::TorchPipelining;
  testing::split_backward_dearer(profile);
}

using namespace planner_testing;

// The checks that bite on the multi-stage relaxed roots run with each form of their programme
// (root_programme.hpp): these instances are too small for the planner to choose the primal.
class MultiStageRootForms : public ::testing::TestWithParam<RootForm> {
 protected:
  void SetUp() override { set_root_form(GetParam()); }
  void TearDown() override { set_root_form(RootForm::Cheaper); }
};
INSTANTIATE_TEST_SUITE_P(Planner, MultiStageRootForms,
                         ::testing::Values(RootForm::Dual, RootForm::Primal),
                         [](const ::testing::TestParamInfo<RootForm>& info) {
                           return info.param == RootForm::Dual ? "Dual" : "Primal";
                         });

// With every schedule, a batch that makes many configurations and memory caps (whose bounds
// make the cheap pass long), the cheap pass defers the multi-stage configurations' first plans
// to their slices once it has spent half the budget:
// the answer is still a plan the simulator times the same, no configuration left open has a
// bound below the reported one, and the deferred configurations that got a slice have a plan.
// (On 4 devices the cheap pass closes all but 69 of the 686 multi-stage configurations, most by
// the memory relaxation, and ends before half the budget; on 8 it closes 216 of 710, and
// defers.)
TEST(Planner, MultiStageFirstPlansDeferredPastHalfTheBudgetStillAnswer) {
  const Profile profile = bench::lognormal_profile(300, 1024);
  Hardware hw = replicate_device(profile.device, 8);
  hw.link.bandwidth_bytes_per_s = 2e10;
  bench::cap_at_parameter_share(hw, profile, 2.5);
  PlannerOptions options;
  options.top = 1;
  options.schedules.assign(std::begin(kAllScheduleKinds), std::end(kAllScheduleKinds));
  options.search_budget = 2'000'000;
  const auto result = find_best_plans(profile, hw, options);
  ASSERT_FALSE(result.ranked.empty());
  const PlanCandidate& best = result.ranked.front();
  EXPECT_EQ(Simulator(profile, hw).run(best.plan).iteration_ms, best.iteration_ms);
  EXPECT_LE(result.stats.lower_bound_ms, best.iteration_ms);
  int deferred = 0;
  for (const ConfigurationStats& c : result.stats.per_configuration) {
    if (!c.closed) {
      EXPECT_GE(c.lower_bound_ms, result.stats.lower_bound_ms);
    }
    const bool multi = is_multi_stage(c.schedule);
    if (multi && c.evaluated && !c.closed && c.slices == 0 && c.nodes == 0) ++deferred;
    if (multi && c.slices > 0 && !c.closed) {
      EXPECT_GT(c.nodes, 0u);
    }
  }
  EXPECT_GT(deferred, 0);  // the deferral happened
}

// The multi-stage local search ends where no move of one stage end (by up to four layers) and
// no layer moved between two stages further apart (the stages between them shifting by one) is
// faster, by the simulator. One configuration per instance and budgets that leave most of them
// unproven, so that the answer is the local search's. (With one-end moves alone, three of these
// answers have faster plans a layer between distant stages away.)
TEST(Planner, MultiStageAnswerIsNoSlowerThanThePlansAroundIt) {
  std::mt19937 rng(41);
  const ScheduleKind kinds[] = {ScheduleKind::Interleaved1F1B, ScheduleKind::InterleavedZB,
                                ScheduleKind::ZBV, ScheduleKind::LoopedBFS,
                                ScheduleKind::DualPipeV};
  int unproven = 0;
  for (int trial = 0; trial < 10; ++trial) {
    const ScheduleKind kind = kinds[trial % std::size(kinds)];
    const Profile profile = bench::lognormal_profile(60 + static_cast<int>(rng() % 60), 64,
                                                     static_cast<unsigned>(rng()));
    Hardware hw = replicate_device(profile.device, 4);
    hw.link.bandwidth_bytes_per_s = 1e9 * (1 + static_cast<double>(rng() % 20));
    PlannerOptions options;
    options.top = 1;
    options.search_budget = 400'000;
    options.schedules = {kind};
    options.checkpoints = {static_cast<CheckpointMode>(rng() % 3)};
    options.chunks = {8};
    const auto result = find_best_plans(profile, hw, options);
    ASSERT_FALSE(result.ranked.empty());
    if (result.stats.proven) continue;  // nothing is faster anywhere
    ++unproven;
    const PlanCandidate& answer = result.ranked.front();
    const Simulator simulator(profile, hw);
    const std::vector<int>& balance = answer.plan.balance;
    const int stages = static_cast<int>(balance.size());
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ", " << to_string(kind));
    for (int i = 0; i + 1 < stages; ++i) {
      for (int j = i + 1; j < stages; ++j) {
        for (int d = -4; d <= 4; ++d) {
          if (d == 0 || (j > i + 1 && std::abs(d) > 1)) continue;
          std::vector<int> moved = balance;
          moved[i] += d;
          moved[j] -= d;
          EXPECT_FALSE(fits_faster(simulator, answer, moved))
              << "stages " << i << " and " << j << ", " << d;
        }
      }
    }
  }
  EXPECT_GE(unproven, 5);
}

// Issue 18: the multi-stage schedules, v = 2 on 2 devices (4 stages), against brute force over
// every balance through the simulator. The configuration's root bound never exceeds any
// balance's simulated time, the answer is the optimum when it says proven (the 35 balances of 8
// layers fit the budget), and with a budget too small to enumerate them it is never below the
// optimum and its bound never above.
TEST_P(MultiStageRootForms, MultiStageSchedulesAgainstBruteForce) {
  std::mt19937 rng(18);
  const auto& kMulti = kMultiStageScheduleKinds;
  int proven = 0, checked = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const int layers = 4 + static_cast<int>(rng() % 5);  // 4..8
    const std::int64_t batch = 1 + rng() % 4;
    Profile profile = testing::random_profile(rng, layers, batch);
    Hardware hw = replicate_device(profile.device, 2);
    hw.link.bandwidth_bytes_per_s = 1e5 * (1 + rng() % 100);
    hw.link.latency_ms = (rng() % 5) / 10.0;
    hw.launch_overhead_ms = (rng() % 3) / 100.0;
    for (auto& d : hw.devices) d.speed = 0.5 + (rng() % 4) / 2.0;
    if (trial % 2) on_torch(hw, profile);
    const Simulator simulator(profile, hw);
    for (ScheduleKind kind : kMulti) {
      const int chunks = 1 + static_cast<int>(rng() % batch);
      const CheckpointMode checkpoint = kAllCheckpointModes[rng() % 3];
      const int m = static_cast<int>(split_batch(batch, chunks).size());
      if (schedule_refusal(kind, 2, 2, m)) continue;
      double optimum = 1e300, slowest = 0.0;
      for_each_balance(layers, 4, [&](const std::vector<int>& balance) {
        Plan plan = testing::make_plan(balance, chunks, checkpoint, kind);
        plan.stages_per_device = 2;
        const auto r = simulator.run(plan);
        optimum = std::min(optimum, r.iteration_ms);
        slowest = std::max(slowest, r.iteration_ms);
      });
      PlannerOptions options;
      options.top = 1;
      options.chunks = {chunks};
      options.checkpoints = {checkpoint};
      options.schedules = {kind};
      SCOPED_TRACE(::testing::Message()
                   << "trial " << trial << ": " << layers << " layers, x" << chunks << " "
                   << to_string(checkpoint) << " " << to_string(kind));
      const PlanSearchResult full = find_best_plans(profile, hw, options);
      ASSERT_EQ(full.stats.per_configuration.size(), 1u);
      const ConfigurationStats& config = full.stats.per_configuration.front();
      EXPECT_EQ(config.stages_per_device, 2);
      EXPECT_LE(config.lower_bound_ms, optimum * (1 + 1e-12));
      ASSERT_FALSE(full.ranked.empty());
      const double answer = full.ranked.front().iteration_ms;
      EXPECT_GE(answer, optimum * (1 - 1e-12));
      if (full.stats.proven) {
        ++proven;
        EXPECT_NEAR(answer, optimum, 1e-9 * optimum);
      }
      EXPECT_LE(full.stats.lower_bound_ms, optimum * (1 + 1e-12));
      // The answer is a plan the simulator times the same.
      EXPECT_EQ(simulator.run(full.ranked.front().plan).iteration_ms, answer);

      options.search_budget = 1;  // the cheap pass and nothing else
      const PlanSearchResult cut = find_best_plans(profile, hw, options);
      ASSERT_FALSE(cut.ranked.empty());
      EXPECT_GE(cut.ranked.front().iteration_ms, optimum * (1 - 1e-12));
      EXPECT_LE(cut.stats.lower_bound_ms, optimum * (1 + 1e-12));
      if (!cut.stats.proven) {
        EXPECT_LT(cut.stats.lower_bound_ms, cut.stats.best_ms);
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 60);
  EXPECT_EQ(proven, checked);  // 35 balances at most: always enumerated
}

// The same under memory caps, each between the least and the largest peak the balances need
// (or below all of them): the answer is the fastest balance that fits, proven, and no plan
// when none does. The memory bounds prune balances and rule configurations out
// (sim/planner/multi_stage_peak_bound.hpp): one that is not a bound would drop the fastest fitting
// balance here, also where the devices are shares of one GPU, whose memory is one.
TEST_P(MultiStageRootForms, MultiStageSchedulesUnderCapsAgainstBruteForce) {
  std::mt19937 rng(19);
  const auto& kMulti = kMultiStageScheduleKinds;
  int checked = 0, none_fit = 0, some_refused = 0;
  for (int trial = 0; trial < 30; ++trial) {
    const int layers = 4 + static_cast<int>(rng() % 5);  // 4..8
    const std::int64_t batch = 1 + rng() % 4;
    Profile profile = testing::random_profile(rng, layers, batch);
    for (auto& l : profile.layers) {
      if (rng() % 4 == 0) l.keeps_input = false;
      if (rng() % 4 == 0) l.output_aliases_input = true;
    }
    testing::modify_some_inputs_in_place(profile);
    std::mt19937 tie_rng(static_cast<unsigned>(trial));
    testing::maybe_tie_layers(tie_rng, profile);
    testing::maybe_freeze_layers(tie_rng, profile);
    Hardware hw = replicate_device(profile.device, 2);
    hw.launch_overhead_ms = (rng() % 3) / 100.0;
    for (auto& d : hw.devices) d.speed = 0.5 + (rng() % 4) / 2.0;
    // Every third: the two devices are shares of one GPU, their memory one (each one's peak).
    if (trial % 3 == 2) {
      for (auto& d : hw.devices) d.share_of = "cuda:0";
    }
    const double factor = static_cast<double>(rng() % 3);
    for (ScheduleKind kind : kMulti) {
      const int chunks = 1 + static_cast<int>(rng() % batch);
      const CheckpointMode checkpoint = kAllCheckpointModes[rng() % 3];
      const int m = static_cast<int>(split_batch(batch, chunks).size());
      if (schedule_refusal(kind, 2, 2, m)) continue;
      std::vector<std::pair<std::int64_t, double>> runs;  // (largest peak, time) per balance
      const Simulator uncapped(profile, hw);
      for_each_balance(layers, 4, [&](const std::vector<int>& balance) {
        Plan plan = testing::make_plan(balance, chunks, checkpoint, kind);
        plan.stages_per_device = 2;
        plan.optimizer_state_factor = factor;
        const auto r = uncapped.run(plan);
        std::int64_t peak = 0;
        for (const auto& d : r.devices) peak = std::max(peak, d.peak_memory_bytes);
        runs.emplace_back(peak, r.iteration_ms);
      });
      std::vector<std::int64_t> peaks;
      for (const auto& [peak, time] : runs) peaks.push_back(peak);
      std::sort(peaks.begin(), peaks.end());
      const std::int64_t cap = rng() % 5 == 0 ? peaks.front() - 1 : peaks[rng() % peaks.size()];
      double optimum = 1e300;
      for (const auto& [peak, time] : runs)
        if (peak <= cap) optimum = std::min(optimum, time);
      Hardware capped = hw;
      for (auto& d : capped.devices) d.memory_bytes = cap;
      PlannerOptions options;
      options.top = 1;
      options.chunks = {chunks};
      options.checkpoints = {checkpoint};
      options.schedules = {kind};
      options.optimizer_state_factor = factor;
      SCOPED_TRACE(::testing::Message()
                   << "trial " << trial << ": " << layers << " layers, x" << chunks << " "
                   << to_string(checkpoint) << " " << to_string(kind) << ", cap " << cap);
      const PlanSearchResult full = find_best_plans(profile, capped, options);
      ASSERT_TRUE(full.stats.proven);
      if (optimum == 1e300) {
        EXPECT_TRUE(full.ranked.empty());
        ++none_fit;
      } else {
        ASSERT_FALSE(full.ranked.empty());
        EXPECT_NEAR(full.ranked.front().iteration_ms, optimum, 1e-9 * optimum);
        some_refused += peaks.back() > cap ? 1 : 0;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 80);
  EXPECT_GT(none_fit, 10);
  EXPECT_GT(some_refused, 30);
}

// The relaxed root of the multi-stage configurations (docs/planner.md) against their optimum by
// brute force, on models with enough layers that a continuous share of the work is close to a
// real balance: never above it, and within 3 % of it on many. Every layer's backward costs
// twice its forward here, as in most models: the relaxed root bounds each task by the least
// ratio of its cost to a layer's work, so layers of very unlike ratios (random_profile's) keep
// it valid but far below (the other tests check it there).
TEST_P(MultiStageRootForms, MultiStageRelaxedRootStaysBelowTheOptimum) {
  std::mt19937 rng(1819);
  const auto& kMulti = kMultiStageScheduleKinds;
  int near = 0, checked = 0;
  for (int trial = 0; trial < 30; ++trial) {
    const int layers = 12 + static_cast<int>(rng() % 5);  // 12..16
    const std::int64_t batch = 2 + rng() % 7;
    Profile profile = testing::random_profile(rng, layers, batch);
    for (auto& l : profile.layers) {
      l.forward_nograd_ms.clear();
      for (std::size_t k = 0; k < l.forward_ms.size(); ++k) l.backward_ms[k] = 2 * l.forward_ms[k];
    }
    Hardware hw = replicate_device(profile.device, 2);
    hw.link.bandwidth_bytes_per_s = 1e6 * (1 + rng() % 100);
    hw.link.latency_ms = (rng() % 3) / 100.0;
    hw.launch_overhead_ms = (rng() % 3) / 100.0;
    for (auto& d : hw.devices) d.speed = 0.5 + (rng() % 4) / 2.0;
    if (trial % 10 >= 5) on_torch(hw, profile);  // every schedule, on both runtimes
    const Simulator simulator(profile, hw);
    const ScheduleKind kind = kMulti[trial % std::size(kMulti)];
    const int chunks = 1 + static_cast<int>(rng() % batch);
    const CheckpointMode checkpoint = kAllCheckpointModes[rng() % 3];
    const int m = static_cast<int>(split_batch(batch, chunks).size());
    if (schedule_refusal(kind, 2, 2, m)) continue;
    double optimum = 1e300;
    for_each_balance(layers, 4, [&](const std::vector<int>& balance) {
      Plan plan = testing::make_plan(balance, chunks, checkpoint, kind);
      plan.stages_per_device = 2;
      optimum = std::min(optimum, simulator.run(plan).iteration_ms);
    });
    PlannerOptions options;
    options.top = 1;
    options.chunks = {chunks};
    options.checkpoints = {checkpoint};
    options.schedules = {kind};
    options.search_budget = 0;
    const PlanSearchResult result = find_best_plans(profile, hw, options);
    ASSERT_EQ(result.stats.per_configuration.size(), 1u);
    const double root = result.stats.per_configuration.front().lower_bound_ms;
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << ": " << layers << " layers, x" << chunks << " "
                 << to_string(checkpoint) << " " << to_string(kind));
    EXPECT_LE(root, optimum * (1 + 1e-12));
    if (root > 0.97 * optimum) ++near;
    ++checked;
  }
  EXPECT_GT(checked, 20);
  EXPECT_GT(near, checked / 4);  // close enough to the optima for the check to bite
}

// At scale the rounds decide the root: 1,000 layers on 32 stages, where 40 rounds of one path
// each from the solve's own shares stopped at 1186 ms, 4.9 % below the best plan the search
// finds (1247.552 ms); from equal-time shares with two paths a round, within 1.3 %.
TEST(Planner, MultiStageRelaxedRootAtScale) {
  const Profile profile = bench::synthetic_profile(1000, 256);
  Hardware hw = replicate_device(profile.device, 16);
  bench::set_synthetic_links(hw);
  PlannerOptions options;
  options.top = 1;
  options.chunks = {16};
  options.checkpoints = {CheckpointMode::Never};
  options.schedules = {ScheduleKind::InterleavedZB};
  const PlanSearchResult result = find_best_plans(profile, hw, options);
  ASSERT_EQ(result.stats.per_configuration.size(), 1u);
  const double root = result.stats.per_configuration.front().lower_bound_ms;
  ASSERT_GT(result.stats.best_ms, 0.0);
  EXPECT_LE(root, result.stats.best_ms);
  EXPECT_GT(root, 0.98 * result.stats.best_ms);
}

// Under a memory cap the multi-stage configurations decide the answer and its gap: bench's
// lognormal 1,000 layers on 16 devices (20 GB/s), each capped at 2.5 x its share of the
// parameters, every schedule, the default budget. Their first plans did not fit (the min-max
// partition of time and the relaxed shares ignore the caps) and their roots were cut short
// (40 rounds of a few hundred configurations): 1971.172 ms at a 31.6 % gap until 2026-11-27;
// with starts chosen by the memory bound and the relaxed root's rows, stabilised rounds and the
// time rows with the caps, 1777.460 ms at 4.2 %. The answer fits its caps in the simulator.
TEST(Planner, CappedEveryScheduleAtScaleEndsNearItsBound) {
  const Profile profile = bench::lognormal_profile(1000, 256);
  Hardware hw = replicate_device(profile.device, 16);
  hw.link.bandwidth_bytes_per_s = 2e10;
  bench::cap_at_parameter_share(hw, profile, 2.5);
  PlannerOptions options;
  options.top = 1;
  options.schedules.assign(std::begin(kAllScheduleKinds), std::end(kAllScheduleKinds));
  const PlanSearchResult result = find_best_plans(profile, hw, options);
  ASSERT_FALSE(result.ranked.empty());
  const Simulator simulator(profile, hw);
  const SimulationResult run = simulator.run(result.ranked.front().plan);
  EXPECT_TRUE(run.fits());
  EXPECT_DOUBLE_EQ(run.iteration_ms, result.stats.best_ms);
  EXPECT_LE(result.stats.lower_bound_ms, result.stats.best_ms);
  EXPECT_LT(result.stats.gap(), 0.06);
}

// A random problem drawn as bench/planner_at_scale.py draws them, at a test's size: lognormal
// forward costs, backwards twice or 1-10 times their forward, random activation, saved and
// parameter sizes, devices of unequal speeds in some, caps at 1.5-4 times the parameters' share.
std::pair<Profile, Hardware> random_problem(std::mt19937& rng, int layers, int devices) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const double sigmas[] = {0.2, 0.6, 1.0, 1.5};
  std::lognormal_distribution<double> cost(0.0, sigmas[rng() % 4]);
  Profile p;
  p.model = "random";
  p.device = {"cpu", "synthetic", 0};
  p.dtype = "float32";
  p.batch_size = std::int64_t{16} << (rng() % 4);
  for (std::int64_t s = 1; s < p.batch_size; s *= 2) p.micro_batch_sizes.push_back(s);
  p.micro_batch_sizes.push_back(p.batch_size);
  for (auto s : p.micro_batch_sizes) p.input_bytes.push_back(4096 * s);
  const double exponent = 0.6 + 0.4 * unit(rng);
  std::int64_t params = 0;
  for (int l = 0; l < layers; ++l) {
    LayerProfile layer;
    layer.name = std::to_string(l);
    const double forward = cost(rng);
    const double ratio = rng() % 3 == 2 ? 1.0 + 9.0 * unit(rng) : 2.0;
    const double output = 0.1 + 2.9 * unit(rng), saved = 4.0 * unit(rng);
    layer.param_bytes = static_cast<std::int64_t>((0.1 + 7.9 * unit(rng)) * (1 << 20));
    params += layer.param_bytes;
    for (auto s : p.micro_batch_sizes) {
      const double x = static_cast<double>(s);
      layer.forward_ms.push_back(forward * (0.02 + 0.01 * std::pow(x, exponent)));
      layer.backward_ms.push_back(ratio * layer.forward_ms.back());
      layer.output_bytes.push_back(static_cast<std::int64_t>(16384 * output * x));
      layer.saved_bytes.push_back(static_cast<std::int64_t>(32768 * saved * x));
      layer.workspace_bytes.push_back(static_cast<std::int64_t>(8192 * x));
    }
    p.layers.push_back(std::move(layer));
  }
  Hardware hw = replicate_device(p.device, devices);
  const double caps[] = {0.0, 0.0, 1.5, 2.5, 4.0};
  const double cap = caps[rng() % 5];
  const bool unequal = rng() % 5 < 2;
  const double speeds[] = {0.5, 0.75, 1.0, 1.5, 2.0};
  for (auto& d : hw.devices) {
    d.memory_bytes = static_cast<std::int64_t>(cap * static_cast<double>(params) / devices);
    if (unequal) d.speed = speeds[rng() % 5];
  }
  const double bandwidths[] = {1e9, 1e10, 1e11}, latencies[] = {0.0, 0.01, 0.1};
  hw.link.bandwidth_bytes_per_s = bandwidths[rng() % 3];
  hw.link.latency_ms = latencies[rng() % 3];
  return {std::move(p), std::move(hw)};
}

// Searching every schedule searches a superset of GPipe's and 1F1B's plans, so its answer must
// never be slower than theirs alone at the same budget; they are searched first, exactly as alone,
// and the result says what they ended with. It was slower on 3 of 26 answered
// `bench/planner_at_scale.py` instances (400 layers on 8 capped unequal devices: 911.4 ms with
// every schedule, 790.8 proven with GPipe and 1F1B), where the multi-stage configurations'
// weak bounds drew the budget from GPipe's and 1F1B's.
TEST(Planner, EveryScheduleIsNeverSlowerThanGPipeAnd1F1BAlone) {
  std::mt19937 rng(6060);
  int both_answered = 0, faster = 0;
  for (int trial = 0; trial < 12; ++trial) {
    const int layers = 20 + static_cast<int>(rng() % 100);
    const int devices = 4 << (rng() % 3);
    auto [profile, hw] = random_problem(rng, layers, devices);
    PlannerOptions alone = single_stage_planner_options();
    alone.top = 1;
    alone.search_budget = 1'000'000;
    PlannerOptions every = alone;
    every.schedules.assign(std::begin(kAllScheduleKinds), std::end(kAllScheduleKinds));
    const PlanSearchResult a = find_best_plans(profile, hw, alone);
    const PlanSearchResult e = find_best_plans(profile, hw, every);
    SCOPED_TRACE(fmt::format("trial {}: {} layers on {} devices", trial, layers, devices));
    EXPECT_FALSE(a.one_stage);  // one family: nothing searched first
    // The one-stage search ran first exactly as alone: the same answer, bound and proof.
    ASSERT_TRUE(e.one_stage);
    EXPECT_EQ(e.one_stage->best.has_value(), !a.ranked.empty());
    if (a.ranked.empty()) {
      EXPECT_EQ(e.one_stage->proven, a.none_fits_proven);
      continue;
    }
    EXPECT_EQ(e.one_stage->lower_bound_ms, a.stats.lower_bound_ms);
    EXPECT_EQ(e.one_stage->proven, a.stats.proven);
    EXPECT_EQ(e.one_stage->best->iteration_ms, a.stats.best_ms);
    EXPECT_EQ(e.one_stage->best->plan.balance, a.ranked.front().plan.balance);
    ASSERT_FALSE(e.ranked.empty());
    ++both_answered;
    EXPECT_LE(e.stats.best_ms, a.stats.best_ms);
    if (e.stats.best_ms < a.stats.best_ms) ++faster;
    EXPECT_DOUBLE_EQ(Simulator(profile, hw).run(e.ranked.front().plan).iteration_ms,
                     e.stats.best_ms);
    EXPECT_LE(e.stats.lower_bound_ms, e.stats.best_ms);
  }
  EXPECT_GE(both_answered, 6);
  EXPECT_GE(faster, 3);  // the multi-stage schedules do win some
}

// The multi-stage bound against random plans on random instances: never above a plan's
// simulated time, whatever the schedule, stages per device, speeds and checkpointing.
TEST(Planner, MultiStageBoundIsBelowEveryPlan) {
  std::mt19937 rng(1818);
  const auto& kMulti = kMultiStageScheduleKinds;
  int near = 0, tight = 0, checked = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int devices = 2 + static_cast<int>(rng() % 3);  // 2..4
    const int layers = 3 * devices + static_cast<int>(rng() % 20);
    const std::int64_t batch = 1 + rng() % 8;
    Profile profile = testing::random_profile(rng, layers, batch);
    std::mt19937 freeze_rng(static_cast<unsigned>(trial));
    testing::maybe_freeze_layers(freeze_rng, profile);  // gradient copies into a stem are empty
    Hardware hw = replicate_device(profile.device, devices);
    hw.link.bandwidth_bytes_per_s = 1e5 * (1 + rng() % 100);
    hw.link.latency_ms = (rng() % 5) / 10.0;
    hw.launch_overhead_ms = (rng() % 3) / 100.0;
    for (auto& d : hw.devices) d.speed = 0.25 * static_cast<double>(1 + rng() % 8);
    if (trial % 10 >= 5) on_torch(hw, profile);  // every schedule, on both runtimes
    const Simulator simulator(profile, hw);
    const ScheduleKind kind = kMulti[trial % std::size(kMulti)];
    const int v = fixed_stages_per_device(kind).value_or(2 + static_cast<int>(rng() % 2));
    const int chunks = 1 + static_cast<int>(rng() % batch);
    const CheckpointMode checkpoint = kAllCheckpointModes[rng() % 3];
    const int m = static_cast<int>(split_batch(batch, chunks).size());
    if (schedule_refusal(kind, devices, v, m)) continue;
    PlannerOptions options;
    options.top = 1;
    options.chunks = {chunks};
    options.checkpoints = {checkpoint};
    options.schedules = {kind};
    options.stages_per_device = {v};
    options.search_budget = 0;
    const PlanSearchResult result = find_best_plans(profile, hw, options);
    ASSERT_EQ(result.stats.per_configuration.size(), 1u);
    const double bound = result.stats.per_configuration.front().lower_bound_ms;
    for (int sample = 0; sample < 25; ++sample) {
      // A random balance of v x devices non-empty stages.
      const int stages = v * devices;
      std::vector<int> cuts(static_cast<std::size_t>(layers - 1));
      std::iota(cuts.begin(), cuts.end(), 1);
      std::shuffle(cuts.begin(), cuts.end(), rng);
      cuts.resize(static_cast<std::size_t>(stages - 1));
      std::sort(cuts.begin(), cuts.end());
      cuts.push_back(layers);
      std::vector<int> balance;
      for (int k = 0, at = 0; k < stages; at = cuts[k++]) balance.push_back(cuts[k] - at);
      Plan plan = testing::make_plan(balance, chunks, checkpoint, kind);
      plan.stages_per_device = v;
      const double time = simulator.run(plan).iteration_ms;
      SCOPED_TRACE(::testing::Message() << "trial " << trial << " " << describe_plan(plan));
      EXPECT_LE(bound, time * (1 + 1e-12));
      if (bound > 0.5 * time) ++near;
      // The bound of this very balance, the one the enumeration prunes with.
      const double balance_bound = multi_stage_balance_bound(profile, hw, plan);
      EXPECT_LE(balance_bound, time * (1 + 1e-12));
      if (balance_bound > 0.95 * time) ++tight;
      ++checked;
    }
  }
  EXPECT_GT(checked, 600);
  EXPECT_GT(near, 100);  // the bound is not trivially small
  EXPECT_GT(tight, 20);  // x 1.05 it would exceed these plans' times (34 of them)
}

// Micro-batch 0's copies in the balance-free bound, by hand: equal layers whose outputs take c
// ms over the link, on 2 devices with 2 stages each (interleaved: devices 0, 1, 0, 1), so its
// round trip crosses 3 boundaries twice: the bound is at least L (f + b) + 6 c, and no plan is
// faster. A third of the bound before the copies were counted; here most of it.
TEST(Planner, MultiStageBoundCountsMicroBatchZerosCopies) {
  const int layers = 12;
  const Profile profile = testing::make_profile(
      std::vector<testing::LayerSpec>(layers, {0.1, 0.2, 1000, 20000, 100, 0}), 4);
  Hardware hw = replicate_device(profile.device, 2);
  hw.link.bandwidth_bytes_per_s = 1e7;
  hw.link.latency_ms = 0.5;
  const double c = hw.link.transfer_ms(20000.0 * 2);  // a micro-batch of 2 samples
  const Simulator simulator(profile, hw);
  for (ScheduleKind kind : {ScheduleKind::Interleaved1F1B, ScheduleKind::ZBV}) {
    SCOPED_TRACE(to_string(kind));
    Plan plan = testing::make_plan({3, 3, 3, 3}, 2, CheckpointMode::Never, kind);
    plan.stages_per_device = 2;
    // Interleaved: devices 0, 1, 0, 1, three crossings; ZBV's V: 0, 1, 1, 0, two.
    const int crossings = kind == ScheduleKind::ZBV ? 2 : 3;
    const double bound = multi_stage_configuration_bound(profile, hw, plan);
    // ZBV's way back is the backward's I half, of a cost the profile does not fix here.
    const double least_round_trip = layers * (kind == ScheduleKind::ZBV ? 0.1 : 0.1 + 0.2);
    EXPECT_GE(bound, least_round_trip + 2 * crossings * c - 1e-9);
    double optimum = 1e300;
    for_each_balance(layers, 4, [&](const std::vector<int>& balance) {
      plan.balance = balance;
      optimum = std::min(optimum, simulator.run(plan).iteration_ms);
    });
    EXPECT_LE(bound, optimum * (1 + 1e-12));
    EXPECT_GT(2 * crossings * c, 0.4 * optimum);  // the copies are much of the time here
  }
}

// Four micro-batches of one sample through four interleaved stages on two devices, over a slow
// link. The link from device 0 to device 1 carries every activation across boundaries 0 and 2
// and every gradient across boundary 1, one after another: twelve copies, four at each of three
// distinct outputs, so at least 12 x 0.5 ms + 4 x (1 + 20 + 50) bytes x 10 ms = 2846 ms,
// whatever the balance. The relaxed root's paths along that link count three distinct outputs
// once the search is over (with a budget of none, at once); at the least output each, as
// before 2026-11-29, the root was 1447 ms (micro-batch 0's round trip).
TEST_P(MultiStageRootForms, MultiStageRelaxedRootCopiesCrossDistinctBoundaries) {
  std::vector<testing::LayerSpec> specs(8);
  const std::int64_t outputs[] = {100, 1, 100, 50, 100, 20, 100, 100};
  for (int k = 0; k < 8; ++k) specs[k].output_per_sample = outputs[k];
  const Profile profile = testing::make_profile(specs, 4);
  Hardware hw = replicate_device(profile.device, 2);
  hw.link.bandwidth_bytes_per_s = 100.0;  // 10 ms a byte
  hw.link.latency_ms = 0.5;
  const Simulator simulator(profile, hw);
  Plan plan =
      testing::make_plan({2, 2, 2, 2}, 4, CheckpointMode::Never, ScheduleKind::Interleaved1F1B);
  plan.stages_per_device = 2;
  double optimum = 1e300;
  for_each_balance(8, 4, [&](const std::vector<int>& balance) {
    plan.balance = balance;
    optimum = std::min(optimum, simulator.run(plan).iteration_ms);
  });
  PlannerOptions options;
  options.top = 1;
  options.chunks = {4};
  options.checkpoints = {CheckpointMode::Never};
  options.schedules = {ScheduleKind::Interleaved1F1B};
  options.search_budget = 0;
  const PlanSearchResult result = find_best_plans(profile, hw, options);
  ASSERT_EQ(result.stats.per_configuration.size(), 1u);
  const double root = result.stats.per_configuration.front().lower_bound_ms;
  EXPECT_LE(root, optimum * (1 + 1e-12));
  EXPECT_GE(root, 12 * 0.5 + 4 * (1 + 20 + 50) * 10.0 - 1e-9);
}

// The relaxed root's rows, as the planner hands them to MultiStagePeakBound::may_fit() under
// caps: at every balance of small random instances no row is above the simulated time (each a
// path of the schedule's task graph, or a device's busy time, at least ratios), and the largest
// is near it on many, so that the caps and the rows together prove something (759 balances,
// 536 within 10 %; rows 5 % higher exceed 299 of them).
TEST_P(MultiStageRootForms, MultiStageTimeRowsStayBelowEverySimulatedBalance) {
  std::mt19937 rng(1820);
  const auto& kMulti = kMultiStageScheduleKinds;
  int checked = 0, near = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int devices = 2 + static_cast<int>(rng() % 2);
    const ScheduleKind kind = kMulti[trial % std::size(kMulti)];
    const int v = fixed_stages_per_device(kind).value_or(2);
    const int layers = v * devices + static_cast<int>(rng() % 5);
    const std::int64_t batch = 1 + rng() % 6;
    Profile profile = testing::random_profile(rng, layers, batch);
    Hardware hw = replicate_device(profile.device, devices);
    hw.link.bandwidth_bytes_per_s = 1e5 * (1 + rng() % 100);
    hw.link.latency_ms = (rng() % 5) / 10.0;
    hw.launch_overhead_ms = (rng() % 3) / 100.0;
    for (auto& d : hw.devices) d.speed = 0.25 * static_cast<double>(1 + rng() % 8);
    if (trial % 10 >= 5) on_torch(hw, profile);  // every schedule, on both runtimes
    const int chunks = 1 + static_cast<int>(rng() % batch);
    const CheckpointMode checkpoint = kAllCheckpointModes[rng() % 3];
    if (schedule_refusal(kind, devices, v, static_cast<int>(split_batch(batch, chunks).size())))
      continue;
    const Simulator simulator(profile, hw);
    std::vector<int> balance(static_cast<std::size_t>(v * devices), 1);
    balance.back() = layers - (v * devices - 1);
    Plan plan = testing::make_plan(balance, chunks, checkpoint, kind);
    plan.stages_per_device = v;
    const StageWorkRows rows = multi_stage_time_rows(profile, hw, plan);
    ASSERT_FALSE(rows.constant.empty());
    ASSERT_EQ(rows.slope.front().size(), static_cast<std::size_t>(rows.classes * v * devices));
    // Every balance: the first stages' sizes counted up like an odometer.
    while (true) {
      plan.balance = balance;
      const double time = simulator.run(plan).iteration_ms;
      const std::vector<double> values = rows.values(balance);
      const double top = *std::max_element(values.begin(), values.end());
      SCOPED_TRACE(::testing::Message() << "trial " << trial << " " << describe_plan(plan));
      EXPECT_LE(top, time * (1 + 1e-9));
      if (top > 0.9 * time) ++near;
      ++checked;
      int t = static_cast<int>(balance.size()) - 2;
      while (t >= 0 && balance.back() == 1) {
        balance.back() += balance[t] - 1;
        balance[t] = 1;
        --t;
      }
      if (t < 0) break;
      ++balance[t];
      --balance.back();
    }
  }
  EXPECT_GT(checked, 500);
  EXPECT_GT(near, checked / 5);
}

// The multi-stage balance bound by hand: looped BFS, one micro-batch, four one-layer stages on
// two devices (stages 0 and 2 on cpu:0, 1 and 3 on cpu:1). cpu:1 cannot start before stage 0's
// forward (head), works F1 + F3 + B3 + B1, and its last action, B1, leaves stage 0's backward
// (tail): 1 + 66 + 10 = 77. cpu:0 works F0 + F2 + B2 + B0 = 44 from the start and ends with B0.
// The run itself is the whole chain, 110.
TEST(Planner, MultiStageBalanceBoundByHand) {
  std::vector<testing::LayerSpec> layers{{1, 10}, {2, 20}, {3, 30}, {4, 40}};
  const Profile profile = testing::make_profile(layers, 1);
  Hardware hw = replicate_device(profile.device, 2);
  hw.launch_overhead_ms = 0.0;
  Plan plan = testing::make_plan({1, 1, 1, 1}, 1, CheckpointMode::Never, ScheduleKind::LoopedBFS);
  plan.stages_per_device = 2;
  EXPECT_NEAR(multi_stage_balance_bound(profile, hw, plan), 77.0, 1e-9);
  EXPECT_NEAR(Simulator(profile, hw).run(plan).iteration_ms, 110.0, 1e-9);
  // cpu:1 twice as fast: its work halves, the head and tail on cpu:0 do not.
  hw.devices[1].speed = 2.0;
  EXPECT_NEAR(multi_stage_balance_bound(profile, hw, plan), 1 + 33 + 10, 1e-9);
  // A task's overhead: every stage's forward and backward on the device, and one per stage the
  // head and the tail pass.
  hw.devices[1].speed = 1.0;
  hw.launch_overhead_ms = 0.5;
  EXPECT_NEAR(multi_stage_balance_bound(profile, hw, plan), 77.0 + 4 * 0.5 + 0.5 + 0.5, 1e-9);
}

// The same with copies: links of 2 ms latency and 1 MB/s, layer 0's output 1,000 bytes and the
// others' 500. cpu:1's head and tail each cross the boundary after stage 0 (2 + 1 ms), so its
// bound is 1 + 3 + 66 + 3 + 10 = 83; the run is the chain with every boundary crossed both ways,
// 110 + 2 x (3 + 2.5 + 2.5) = 126.
TEST(Planner, MultiStageBalanceBoundByHandWithCopies) {
  std::vector<testing::LayerSpec> layers{
      {1, 10, 0, 1000}, {2, 20, 0, 500}, {3, 30, 0, 500}, {4, 40, 0, 500}};
  const Profile profile = testing::make_profile(layers, 1);
  Hardware hw = replicate_device(profile.device, 2);
  hw.launch_overhead_ms = 0.0;
  hw.link = Link{1e6, 2.0};
  Plan plan = testing::make_plan({1, 1, 1, 1}, 1, CheckpointMode::Never, ScheduleKind::LoopedBFS);
  plan.stages_per_device = 2;
  EXPECT_NEAR(multi_stage_balance_bound(profile, hw, plan), 83.0, 1e-9);
  EXPECT_NEAR(Simulator(profile, hw).run(plan).iteration_ms, 126.0, 1e-9);
}

}  // namespace
}  // namespace pipetune
