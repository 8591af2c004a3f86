// The task graph's longest path against the event engine: the same iteration time for every
// schedule (one and several stages per device), checkpoint mode, micro-batch split (with and
// without a smaller last one), device speed, link, calibration and runtime.

#include "sim/planner/graph_sweep.hpp"

#include <gtest/gtest.h>

#include <random>
#include <stdexcept>

#include "sim/simulator.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

TEST(GraphSweep, EqualsTheSimulatorOnRandomInstances) {
  std::mt19937 rng(2026);
  int compared = 0, multi_stage = 0, split_backward = 0, calibrated_runs = 0, torch_runs = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const ScheduleKind kind = kAllScheduleKinds[rng() % std::size(kAllScheduleKinds)];
    const int devices = 1 + static_cast<int>(rng() % 5);
    const int v = is_multi_stage(kind)
                      ? fixed_stages_per_device(kind).value_or(2 + static_cast<int>(rng() % 2))
                      : 1;
    const int stages = devices * v;
    const int layers = stages + static_cast<int>(rng() % 20);
    const std::int64_t batch = 1 + rng() % 40;
    Profile profile = testing::random_profile(rng, layers, batch);
    std::mt19937 freeze_rng(static_cast<unsigned>(trial));
    testing::maybe_freeze_layers(freeze_rng, profile);  // gradient copies into a stem are empty
    // Half the profiles measure the backward's two halves (I and W) apart.
    if (rng() % 2) {
      for (auto& l : profile.layers) {
        for (double ms : l.backward_ms) {
          const double input = ms * (0.2 + (rng() % 7) / 10.0);
          l.backward_input_ms.push_back(input);
          l.backward_weight_ms.push_back(ms - input);
        }
      }
    }
    Hardware hw = replicate_device(profile.device, devices);
    hw.link.bandwidth_bytes_per_s = 1e4 * (1 + rng() % 1000);
    hw.link.latency_ms = (rng() % 5) / 10.0;
    hw.launch_overhead_ms = (rng() % 3) / 100.0;
    for (auto& d : hw.devices) d.speed = 0.5 + (rng() % 4) / 2.0;
    if (devices > 2) hw.links.push_back({0, 1, Link{2e4, 0.3}});  // one link unlike the others
    // torch's runtime: its first stage's I is empty and its W the whole backward.
    if (trial % 3 == 1) {
      hw.runtime = Runtime::TorchPipelining;
      if (rng() % 2) testing::split_backward_dearer(profile);
      ++torch_runs;
    }
    if (trial % 5 == 0) {
      hw.calibration.compute_scale = {{1, 1.0}, {devices, 1.0 + (rng() % 5) / 10.0}};
      hw.calibration.task_overhead_ms = (rng() % 4) / 100.0;
      if (rng() % 2) hw.calibration.copy = Link{5e4, 0.2};
      ++calibrated_runs;
    }
    const int chunks = 1 + static_cast<int>(rng() % batch);
    const auto sizes = split_batch(batch, chunks);
    const auto checkpoint = static_cast<CheckpointMode>(rng() % 3);
    Schedule schedule;
    try {
      schedule = make_schedule(kind, stages, static_cast<int>(sizes.size()), checkpoint, v);
    } catch (const std::invalid_argument&) {
      continue;  // a shape the schedule refuses (too few micro-batches)
    }
    const Simulator simulator(profile, hw);
    const CostModel costs(profile);
    GraphSweep sweep(costs, hw, schedule, schedule.stage_rank, sizes);
    for (int rep = 0; rep < 3; ++rep) {
      Plan plan = testing::make_plan(
          testing::balance_of_ends(testing::random_stage_ends(rng, layers, stages)), chunks,
          checkpoint, kind);
      plan.stages_per_device = v;
      SimulationOptions lean;
      lean.record_tasks = false;
      lean.record_memory = false;
      const double simulated = simulator.run(plan, lean).iteration_ms;
      // The same additions in the same order: equal, not merely close.
      EXPECT_EQ(sweep.run(plan.balance), simulated)
          << to_string(kind) << " x" << chunks << " " << to_string(checkpoint) << " on " << devices
          << " devices, trial " << trial;
      ++compared;
    }
    multi_stage += v > 1;
    split_backward += !profile.layers[0].backward_input_ms.empty();
  }
  EXPECT_GT(compared, 900);
  EXPECT_GT(multi_stage, 150);
  EXPECT_GT(split_backward, 100);
  EXPECT_GT(calibrated_runs, 50);
  EXPECT_GT(torch_runs, 100);
}

TEST(GraphSweep, IsExactOnlyWhereNothingPacesTheTasks) {
  std::mt19937 rng(5);
  Profile profile = testing::random_profile(rng, 6, 8);
  EXPECT_TRUE(GraphSweep::exact_for(profile));
  Profile launched = profile;
  for (auto& l : launched.layers) {
    l.forward_launch_ms = l.forward_ms;
    l.backward_launch_ms = l.backward_ms;
  }
  EXPECT_FALSE(GraphSweep::exact_for(launched));
  Profile corun = profile;
  corun.co_runners = 1;
  EXPECT_FALSE(GraphSweep::exact_for(corun));
  Profile waits = profile;  // what a wait costs depends on the timeline
  waits.device.after_idle = {{1.0, 0.2}};
  EXPECT_FALSE(GraphSweep::exact_for(waits));
}

TEST(GraphSweep, RefusesABalanceOfAnotherShape) {
  std::mt19937 rng(6);
  const Profile profile = testing::random_profile(rng, 8, 8);
  const Hardware hw = replicate_device(profile.device, 2);
  const CostModel costs(profile);
  const auto sizes = split_batch(8, 4);
  const Schedule schedule =
      make_schedule(ScheduleKind::Interleaved1F1B, 4, 4, CheckpointMode::Never, 2);
  GraphSweep sweep(costs, hw, schedule, schedule.stage_rank, sizes);
  EXPECT_THROW(sweep.run({4, 4}), std::invalid_argument);
  EXPECT_THROW(GraphSweep(costs, hw, schedule, schedule.stage_rank, split_batch(8, 2)),
               std::invalid_argument);
}

}  // namespace
}  // namespace pipetune
