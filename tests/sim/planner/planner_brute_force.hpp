#pragma once
// Brute force for the planner's tests: every balance x chunk count x checkpoint mode x schedule
// through the simulator, and the checks the tests make of the planner against it.

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "sim/planner/planner.hpp"
#include "sim/simulator.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune::planner_testing {

inline void for_each_balance(int layers, int stages,
                             const std::function<void(const std::vector<int>&)>& visit) {
  std::vector<int> balance;
  std::function<void(int)> go = [&](int left) {
    const int placed = static_cast<int>(balance.size());
    if (placed == stages - 1) {
      balance.push_back(left);
      visit(balance);
      balance.pop_back();
      return;
    }
    for (int n = 1; n <= left - (stages - 1 - placed); ++n) {
      balance.push_back(n);
      go(left - n);
      balance.pop_back();
    }
  };
  go(layers);
}

struct BruteForce {
  double best_ms = 1e300;
  Plan best_plan;
  // Per (split, checkpoint, schedule): the best time of a fitting plan.
  std::map<std::tuple<std::vector<std::int64_t>, CheckpointMode, ScheduleKind>, double> per_config;
  double leanest_peak = 1e300;
};

// `worst_order`: a plan fits when its worst arrival order's peaks fit (worst_order_memory).
// `runs`, where given: only the plans it accepts (a runtime's), the leanest peak aside.
inline BruteForce brute_force(const Profile& profile, const Hardware& hw, bool worst_order = false,
                              const std::function<bool(const Plan&)>& runs = {}) {
  BruteForce out;
  const Simulator simulator(profile, hw);
  SimulationOptions options;
  options.worst_order_peaks = worst_order;
  auto fits = [&](const SimulationResult& r) {
    if (!worst_order) return r.fits();
    return std::all_of(r.devices.begin(), r.devices.end(), [](const DeviceReport& d) {
      return d.memory_capacity_bytes == 0 || d.worst_order_peak_bytes <= d.memory_capacity_bytes;
    });
  };
  const int stages = static_cast<int>(hw.devices.size());
  for (int chunks = 1; chunks <= profile.batch_size; ++chunks) {
    for (auto checkpoint : kAllCheckpointModes) {
      for (auto schedule : kSingleStageScheduleKinds) {
        for_each_balance(
            static_cast<int>(profile.layer_count()), stages, [&](const std::vector<int>& balance) {
              const Plan plan = testing::make_plan(balance, chunks, checkpoint, schedule);
              const auto r = simulator.run(plan, options);
              out.leanest_peak =
                  std::min(out.leanest_peak, static_cast<double>(r.max_peak_memory_bytes()));
              if (!fits(r) || (runs && !runs(plan))) return;
              auto key = std::make_tuple(r.micro_batch_sizes, checkpoint, schedule);
              auto [it, inserted] = out.per_config.emplace(key, r.iteration_ms);
              if (!inserted) it->second = std::min(it->second, r.iteration_ms);
              if (r.iteration_ms < out.best_ms) out.best_ms = r.iteration_ms, out.best_plan = plan;
            });
      }
    }
  }
  return out;
}

// The planner proved its answer, and it is brute force's best time; false (a failure) where it
// ranked no plan.
inline bool expect_proven_best(const PlanSearchResult& result, const BruteForce& expected) {
  EXPECT_TRUE(result.stats.proven);
  if (result.ranked.empty()) {
    ADD_FAILURE() << "no plan ranked; brute force: " << describe_plan(expected.best_plan);
    return false;
  }
  EXPECT_NEAR(result.ranked.front().iteration_ms, expected.best_ms, 1e-9 * expected.best_ms)
      << "brute force: " << describe_plan(expected.best_plan)
      << ", planner: " << describe_plan(result.ranked.front().plan);
  return true;
}

// Where brute force finds no plan that fits: the planner proved that too and ranked none.
inline bool expect_none_fits(const PlanSearchResult& result, const BruteForce& expected) {
  if (!expected.per_config.empty()) return false;
  EXPECT_TRUE(result.stats.proven);
  EXPECT_TRUE(result.ranked.empty());
  return true;
}

// Every ranked entry is its configuration's best by brute force and fits its devices, and the
// list is sorted.
inline void expect_each_ranked_its_configurations_best(const PlanSearchResult& result,
                                                       const BruteForce& expected,
                                                       const Profile& profile) {
  for (std::size_t k = 0; k < result.ranked.size(); ++k) {
    const auto& c = result.ranked[k];
    const auto key = std::make_tuple(split_batch(profile.batch_size, c.plan.chunks),
                                     c.plan.checkpoint, c.plan.schedule);
    ASSERT_TRUE(expected.per_config.count(key)) << describe_plan(c.plan);
    EXPECT_NEAR(c.iteration_ms, expected.per_config.at(key), 1e-9 * c.iteration_ms)
        << describe_plan(c.plan);
    if (k > 0) {
      EXPECT_LE(result.ranked[k - 1].iteration_ms, c.iteration_ms);
    }
    for (std::size_t d = 0; d < c.peak_memory_bytes.size(); ++d) {
      if (c.memory_capacity_bytes[d] > 0) {
        EXPECT_LE(c.peak_memory_bytes[d], c.memory_capacity_bytes[d]);
      }
    }
  }
}

// Links, task overheads and devices up to 16 times faster than each other, drawn from `rng`.
inline Hardware random_hardware(std::mt19937& rng, const Profile& profile, int stages) {
  Hardware hw = replicate_device(profile.device, stages);
  hw.link.bandwidth_bytes_per_s = 1e5 * (1 + rng() % 100);
  hw.link.latency_ms = (rng() % 5) / 10.0;
  hw.launch_overhead_ms = (rng() % 3) / 100.0;
  for (auto& d : hw.devices) d.speed = 0.25 * static_cast<double>(1 + rng() % 16);
  return hw;
}

// Whether `balance` in the configuration of the planner's `answer` has a layer on every stage,
// fits its devices and is faster than the answer, by the simulator.
inline bool fits_faster(const Simulator& simulator, const PlanCandidate& answer,
                        const std::vector<int>& balance) {
  if (std::any_of(balance.begin(), balance.end(), [](int n) { return n < 1; })) return false;
  Plan plan = answer.plan;
  plan.balance = balance;
  const auto r = simulator.run(plan);
  return r.fits() && r.iteration_ms < answer.iteration_ms * (1 - 1e-12);
}

}  // namespace pipetune::planner_testing
