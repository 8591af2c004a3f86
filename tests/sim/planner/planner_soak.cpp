// A soak of the planner against brute force: random instances drawn from a seed, wider than the
// unit tests' fixed ones (layers that keep or alias storages, measured backward peaks, shares
// of one GPU, caps equal or uneven, the worst arrival order, 2 or 3 stages per device, every
// schedule at once), each planned with the default budget, a budget of one step (the cheap pass
// alone) and a small one. Whatever the budget: the answer fits and is no faster than brute
// force's best, the lower bound no higher, an empty answer is called proven only where nothing
// fits; with the default budget every instance is proven and equals brute force.
//
//   build/tests/sim/planner/pipetune_planner_soak                        # ctest runs this: seed 1
//   PIPETUNE_SOAK_SEEDS=1-100 PIPETUNE_SOAK_TRIALS=40 build/tests/sim/planner/pipetune_planner_soak
//
// A failure names its seed and trial, so that it can be run again alone.

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "sim/planner/planner.hpp"
#include "sim/schedule.hpp"
#include "sim/simulator.hpp"
#include "tests/sim/fixtures.hpp"
#include "tests/sim/planner/planner_brute_force.hpp"

namespace pipetune {
namespace {

using namespace planner_testing;

const std::uint64_t kDefaultBudget = PlannerOptions{}.search_budget;
const std::uint64_t kBudgets[] = {kDefaultBudget, 1, 400};

// "A-B" or "A": the seeds to run.
std::vector<unsigned> seeds() {
  const char* text = std::getenv("PIPETUNE_SOAK_SEEDS");
  const std::string s = text ? text : "1";
  const auto dash = s.find('-');
  const unsigned first = static_cast<unsigned>(std::stoul(s.substr(0, dash)));
  const unsigned last =
      dash == std::string::npos ? first : static_cast<unsigned>(std::stoul(s.substr(dash + 1)));
  std::vector<unsigned> out;
  for (unsigned k = first; k <= last; ++k) out.push_back(k);
  if (out.empty()) ADD_FAILURE() << "PIPETUNE_SOAK_SEEDS: expected A or A-B with A <= B, got " << s;
  return out;
}

int trials() {
  const char* text = std::getenv("PIPETUNE_SOAK_TRIALS");
  const int n = text ? std::atoi(text) : 24;
  if (n < 1) ADD_FAILURE() << "PIPETUNE_SOAK_TRIALS: expected a positive count, got " << text;
  return n;
}

// What layers keep of their input and output, and measured backward peaks, on some profiles.
void vary_layers(std::mt19937& rng, Profile& profile) {
  const unsigned kind = rng() % 3;
  for (auto& l : profile.layers) {
    if (kind == 1) {
      l.keeps_input = rng() % 3 != 0;
      l.keeps_output = rng() % 3 == 0;
      l.output_aliases_input = rng() % 4 == 0;
      if (&l == &profile.layers.back()) testing::modify_some_inputs_in_place(profile);
    }
    if (kind == 2) {
      for (std::size_t k = 0; k < profile.micro_batch_sizes.size(); ++k) {
        l.backward_peak_bytes.push_back(static_cast<std::int64_t>(rng() % 20000));
        l.backward_accumulate_peak_bytes.push_back(static_cast<std::int64_t>(rng() % 20000));
      }
    }
  }
}

// Devices of speeds up to 16 apart (random_hardware()); a quarter of the time, shares of one GPU.
Hardware soak_hardware(std::mt19937& rng, const Profile& profile, int devices) {
  Hardware hw = random_hardware(rng, profile, devices);
  if (rng() % 4 == 0) {
    for (auto& d : hw.devices) d.share_of = "cuda:0";
  }
  return hw;
}

// The checks every answer must pass, whatever the budget, against `optimum` (the fastest
// fitting plan, infinite when none fits).
void expect_sound(const PlanSearchResult& result, double optimum, std::uint64_t budget,
                  const Simulator& simulator, bool worst_order) {
  SCOPED_TRACE(::testing::Message() << "budget " << budget);
  const bool some_fit = optimum < 1e300;
  if (result.none_fits_proven) {
    EXPECT_FALSE(some_fit);
  }
  if (!some_fit) {
    EXPECT_TRUE(result.ranked.empty());
    if (budget == kDefaultBudget) {
      EXPECT_TRUE(result.none_fits_proven);
    }
    return;
  }
  EXPECT_LE(result.stats.lower_bound_ms, optimum * (1 + 1e-9));
  if (result.ranked.empty()) {
    EXPECT_FALSE(result.stats.proven);
    EXPECT_NE(budget, kDefaultBudget);
    return;
  }
  const PlanCandidate& best = result.ranked.front();
  EXPECT_GE(best.iteration_ms, optimum * (1 - 1e-12));
  SimulationOptions options;
  options.worst_order_peaks = worst_order;
  const SimulationResult r = simulator.run(best.plan, options);
  EXPECT_EQ(r.iteration_ms, best.iteration_ms);
  for (const DeviceReport& d : r.devices) {
    if (d.memory_capacity_bytes == 0) continue;
    EXPECT_LE(d.peak_memory_bytes, d.memory_capacity_bytes) << describe_plan(best.plan);
    if (worst_order) {
      EXPECT_LE(d.worst_order_peak_bytes, d.memory_capacity_bytes);
    }
  }
  if (result.stats.proven) {
    EXPECT_NEAR(best.iteration_ms, optimum, 1e-9 * optimum) << describe_plan(best.plan);
  } else {
    EXPECT_NE(budget, kDefaultBudget) << "unproven with the default budget";
  }
}

// One stage per device (GPipe and 1F1B): every balance, chunk count and checkpoint mode.
TEST(PlannerSoak, SingleStageSchedules) {
  for (unsigned seed : seeds()) {
    std::mt19937 rng(seed);
    for (int trial = 0; trial < trials(); ++trial) {
      const int layers = 2 + static_cast<int>(rng() % 11);                   // 2..12
      const int stages = 1 + static_cast<int>(rng() % std::min(layers, 5));  // 1..5
      Profile profile = testing::random_profile(rng, layers, 1 + rng() % 8);
      vary_layers(rng, profile);
      Hardware hw = soak_hardware(rng, profile, stages);
      const bool capped = rng() % 2 == 1;
      const bool worst_order = capped && rng() % 4 == 0;
      if (capped) {
        const double leanest = brute_force(profile, hw).leanest_peak;
        const double cap = leanest * (1.0 + (rng() % 60) / 100.0);
        const bool uneven = rng() % 3 == 0;
        for (auto& d : hw.devices)
          d.memory_bytes =
              static_cast<std::int64_t>(uneven ? cap * (0.8 + (rng() % 40) / 100.0) : cap);
      }
      const BruteForce expected = brute_force(profile, hw, worst_order);
      SCOPED_TRACE(::testing::Message()
                   << "seed " << seed << ", trial " << trial << ": " << layers << " layers, "
                   << stages << " devices, batch " << profile.batch_size
                   << (capped ? ", capped" : "") << (worst_order ? ", worst order" : "")
                   << (hw.devices[0].share_of.empty() ? "" : ", shares of one GPU"));
      const Simulator simulator(profile, hw);
      for (std::uint64_t budget : kBudgets) {
        PlannerOptions options = single_stage_planner_options();
        options.top = 100;
        options.search_budget = budget;
        options.worst_order_memory = worst_order;
        const PlanSearchResult result = find_best_plans(profile, hw, options);
        expect_sound(result, expected.per_config.empty() ? 1e300 : expected.best_ms, budget,
                     simulator, worst_order);
        if (budget == kDefaultBudget && !expected.per_config.empty())
          expect_each_ranked_its_configurations_best(result, expected, profile);
      }
    }
  }
}

// Every schedule at once on 2 or 3 devices, multi-stage ones with 2 stages per device (3 for
// the interleaved ones on some), under a cap on half the instances: the search shares its
// budget and thresholds between single- and multi-stage configurations.
TEST(PlannerSoak, EverySchedule) {
  for (unsigned seed : seeds()) {
    std::mt19937 rng(seed + 100000);
    for (int trial = 0; trial < trials(); ++trial) {
      const int devices = 2 + static_cast<int>(rng() % 2);
      const int v = devices == 2 && rng() % 3 == 0 ? 3 : 2;
      const int layers = v * devices + static_cast<int>(rng() % 3);
      Profile profile = testing::random_profile(rng, layers, 1 + rng() % 4);
      vary_layers(rng, profile);
      Hardware hw = soak_hardware(rng, profile, devices);
      const bool worst_order = rng() % 3 == 0;
      SimulationOptions simulation;
      simulation.worst_order_peaks = worst_order;
      const Simulator uncapped(profile, hw);
      struct Run {
        std::int64_t peak;
        double ms;
      };
      std::vector<Run> runs;
      for (int chunks = 1; chunks <= profile.batch_size; ++chunks) {
        const int m = static_cast<int>(split_batch(profile.batch_size, chunks).size());
        for (auto checkpoint : kAllCheckpointModes) {
          for (auto kind : kAllScheduleKinds) {
            const int per = !is_multi_stage(kind)                                          ? 1
                            : kind == ScheduleKind::ZBV || kind == ScheduleKind::DualPipeV ? 2
                                                                                           : v;
            if (per > 1 && schedule_refusal(kind, devices, per, m)) continue;
            if (layers < per * devices) continue;
            for_each_balance(layers, per * devices, [&](const std::vector<int>& balance) {
              Plan plan = testing::make_plan(balance, chunks, checkpoint, kind);
              plan.stages_per_device = per;
              const SimulationResult r = uncapped.run(plan, simulation);
              std::int64_t peak = 0;
              for (const auto& d : r.devices)
                peak = std::max({peak, d.peak_memory_bytes,
                                 worst_order ? d.worst_order_peak_bytes : std::int64_t{0}});
              runs.push_back({peak, r.iteration_ms});
            });
          }
        }
      }
      std::vector<std::int64_t> peaks;
      for (const Run& r : runs) peaks.push_back(r.peak);
      std::sort(peaks.begin(), peaks.end());
      const bool capped = rng() % 2 == 1;
      // A fifth of the caps below every plan's peak: nothing fits.
      const std::int64_t cap = !capped          ? 0
                               : rng() % 5 == 0 ? peaks.front() - 1
                                                : peaks[rng() % peaks.size()];
      double optimum = 1e300;
      for (const Run& r : runs)
        if (!capped || r.peak <= cap) optimum = std::min(optimum, r.ms);
      for (auto& d : hw.devices) d.memory_bytes = cap;
      SCOPED_TRACE(::testing::Message()
                   << "seed " << seed << ", trial " << trial << ": " << layers << " layers, "
                   << devices << " devices, v " << v << ", batch " << profile.batch_size << ", cap "
                   << cap << (worst_order ? ", worst order" : "")
                   << (hw.devices[0].share_of.empty() ? "" : ", shares of one GPU"));
      const Simulator simulator(profile, hw);
      for (std::uint64_t budget : kBudgets) {
        PlannerOptions options = single_stage_planner_options();
        options.top = 3;
        options.schedules.assign(std::begin(kAllScheduleKinds), std::end(kAllScheduleKinds));
        options.stages_per_device = {v};
        options.search_budget = budget;
        options.worst_order_memory = worst_order;
        expect_sound(find_best_plans(profile, hw, options), optimum, budget, simulator,
                     worst_order);
      }
    }
  }
}

}  // namespace
}  // namespace pipetune
