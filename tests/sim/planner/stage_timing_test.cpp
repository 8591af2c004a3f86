// The sweep against the event engine: the same iteration time for every schedule, checkpoint
// mode, micro-batch split (with and without a smaller last one) and device speed.

#include "sim/planner/stage_timing.hpp"

#include <gtest/gtest.h>

#include <random>

#include "sim/simulator.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

// A path's length from its counts: each task and copy at its duration.
double path_length(const IterationSweep::PathCounts& path, const std::vector<StageDurations>& d) {
  double length = 0.0;
  for (std::size_t j = 0; j < d.size(); ++j) {
    for (int slot = 0; slot < 2; ++slot) {
      length += path.tasks[j][0 + slot] * d[j].forward[slot] +
                path.tasks[j][2 + slot] * d[j].forward_nograd[slot] +
                path.tasks[j][4 + slot] * d[j].forward[slot] +
                path.tasks[j][6 + slot] * d[j].backward[slot];
      // The link after stage j: activations sent by j, gradients sent by j + 1.
      if (j + 1 < d.size()) {
        length += path.copies[j][slot] * d[j].activation_copy[slot] +
                  path.copies[j][2 + slot] * d[j + 1].gradient_copy[slot];
      }
    }
  }
  return length;
}

TEST(IterationSweep, EqualsTheSimulatorOnRandomInstances) {
  std::mt19937 rng(77);
  int compared = 0, raised = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int layers = 1 + static_cast<int>(rng() % 24);
    const int stages = 1 + static_cast<int>(rng() % std::min(layers, 8));
    const std::int64_t batch = 1 + rng() % 40;
    Profile profile = testing::random_profile(rng, layers, batch);
    std::mt19937 freeze_rng(static_cast<unsigned>(trial));
    testing::maybe_freeze_layers(freeze_rng, profile);  // gradient copies into a stem are empty
    // Every other trial, host launch times that pace some tasks and not others (the sweep's
    // two clocks against the simulator's two passes).
    const bool launches = trial % 2 == 1;
    if (launches) {
      for (auto& l : profile.layers) {
        for (std::size_t k = 0; k < l.forward_ms.size(); ++k) {
          l.forward_launch_ms.push_back(l.forward_ms[k] * (rng() % 30) / 10.0);
          l.backward_launch_ms.push_back(l.backward_ms[k] * (rng() % 30) / 10.0);
          if (trial % 4 == 1) l.forward_nograd_launch_ms.push_back(l.forward_launch_ms[k] * 0.6);
        }
      }
      profile.device.backward_call_ms = (rng() % 3) / 10.0;
    }
    Hardware hw = replicate_device(profile.device, stages);
    hw.link.bandwidth_bytes_per_s = 1e4 * (1 + rng() % 1000);
    hw.link.latency_ms = (rng() % 5) / 10.0;
    hw.launch_overhead_ms = (rng() % 3) / 100.0;
    for (auto& d : hw.devices) d.speed = 0.5 + (rng() % 4) / 2.0;
    if (stages > 2) hw.links.push_back({0, 1, Link{2e4, 0.3}});  // one link unlike the others
    const Simulator simulator(profile, hw);
    const CostModel costs(profile);
    // A random balance.
    const std::vector<int> bounds = testing::random_stage_ends(rng, layers, stages);
    const std::vector<int> balance = testing::balance_of_ends(bounds);
    const int chunks = 1 + static_cast<int>(rng() % batch);
    const auto sizes = split_batch(batch, chunks);
    const SizeCosts& common = costs.at(sizes.front());
    const SizeCosts& last = costs.at(sizes.back());
    std::vector<StageDurations> durations;
    for (int j = 0; j < stages; ++j) {
      durations.push_back(stage_durations(common, last, bounds[j], bounds[j + 1],
                                          hw.devices[j].speed, hw.launch_overhead_ms,
                                          j + 1 < stages ? &hw.link_between(j, j + 1) : nullptr,
                                          j > 0 ? &hw.link_between(j, j - 1) : nullptr));
    }
    for (auto schedule : kSingleStageScheduleKinds) {  // the sweep knows one stage per device
      for (auto checkpoint : kAllCheckpointModes) {
        const Plan plan = testing::make_plan(balance, chunks, checkpoint, schedule);
        SimulationOptions lean;
        lean.record_tasks = false;
        lean.record_memory = false;
        const SimulationResult r = simulator.run(plan, lean);
        const IterationSweep sweep(schedule, checkpoint, stages, static_cast<int>(sizes.size()),
                                   sizes.back() != sizes.front());
        SCOPED_TRACE(describe_plan(plan));
        EXPECT_EQ(sweep.run(durations), r.iteration_ms);
        EXPECT_EQ(sweep.task_count(), r.task_count);
        // Each prefix, with the later stages as their shortest round trip (every forward and
        // backward of one micro-batch, the copies between and its recompute on the last
        // stage), is a lower bound; the whole pipeline is the plan itself.
        const int m = static_cast<int>(sizes.size());
        for (int last = 0; last < stages; ++last) {
          double trip_full = 0.0, trip_last = 0.0;
          for (int k = last; k + 1 < stages; ++k) {
            const auto& d = durations[k];
            const auto& next = durations[k + 1];
            const bool full_nograd = is_checkpointed(checkpoint, 0, m) && m > 1;
            const bool last_nograd = is_checkpointed(checkpoint, m - 1, m);
            const int slot = sizes.back() != sizes.front() ? 1 : 0;
            trip_full += d.activation_copy[0] + d.output_gradient_copy[0] +
                         (full_nograd ? next.forward_nograd[0] : next.forward[0]) +
                         next.backward[0];
            trip_last += d.activation_copy[slot] + d.output_gradient_copy[slot] +
                         (last_nograd ? next.forward_nograd[slot] : next.forward[slot]) +
                         next.backward[slot];
          }
          if (last + 1 < stages) {
            // On the last stage a micro-batch's backward also waits for its recompute there,
            // which comes after its forward in every schedule.
            const auto& end = durations[stages - 1];
            const int slot = sizes.back() != sizes.front() ? 1 : 0;
            if (m > 1 && is_checkpointed(checkpoint, m - 2, m)) trip_full += end.forward[0];
            if (is_checkpointed(checkpoint, m - 1, m)) trip_last += end.forward[slot];
          }
          const double bound = sweep.run_prefix(durations, last, trip_full, trip_last);
          if (last + 1 == stages) {
            EXPECT_EQ(bound, r.iteration_ms);
          } else {
            EXPECT_LE(bound, r.iteration_ms * (1 + 1e-12)) << "stages 0.." << last;
          }
          if (schedule != ScheduleKind::OneFOneB || last + 1 == stages) continue;
          // 1F1B: the later stages' own pacing, at its most (the true last stage; each group
          // of last stages at its busiest stage's steady work), is still a lower bound.
          const auto& end = durations[stages - 1];
          DownstreamPacing pacing;
          for (int slot = 0; slot < 2; ++slot) {
            pacing.last_work[slot] = end.forward[slot] + end.backward[slot];
            pacing.last_work_recomputed[slot] = end.forward_nograd[slot] + pacing.last_work[slot];
          }
          std::vector<SteadyPace> groups;
          auto steady_work = [&](const StageDurations& d) {
            return std::min(d.forward[0], d.forward_nograd[0]) + d.backward[0] +
                   (is_checkpointed(checkpoint, 0, m) ? d.forward[0] : 0.0);
          };
          double busiest = steady_work(end);  // every group holds the last stage
          for (int group = 1; group < stages - 1 - last; ++group) {
            busiest = std::max(busiest, steady_work(durations[stages - 1 - group]));
            // The last group + 1 stages; with equal micro-batches one gap more.
            groups.push_back({busiest, m - 2 - group + (sizes.back() == sizes.front() ? 1 : 0)});
          }
          pacing.steady = groups;
          const double paced = sweep.run_prefix(durations, last, trip_full, trip_last, &pacing);
          EXPECT_LE(paced, r.iteration_ms * (1 + 1e-12)) << "paced, stages 0.." << last;
          EXPECT_GE(paced, bound);
          if (paced > bound * (1 + 1e-9)) ++raised;
        }
        // The longest path it reports: made of the plan's own tasks, as long as the plan (the
        // device's path alone: at most the plan where launches pace it).
        IterationSweep::PathCounts path;
        const double longest = sweep.run_critical_path(durations, path);
        EXPECT_NEAR(path_length(path, durations), longest, 1e-9 * longest);
        if (launches) {
          EXPECT_LE(longest, r.iteration_ms);
        } else {
          EXPECT_EQ(longest, r.iteration_ms);
        }
        // Again on the same sweep, which keeps its record between calls, with the stages'
        // tasks and copies scaled unevenly: the path a fresh sweep reports.
        std::vector<StageDurations> other = durations;
        for (int j = 0; j < stages; ++j) {
          for (int slot = 0; slot < 2; ++slot) {
            other[j].forward[slot] *= 1 + (j % 3);
            other[j].backward[slot] *= 1 + (j % 2);
            other[j].activation_copy[slot] *= 3 - (j % 3);
          }
        }
        IterationSweep::PathCounts again, fresh_path;
        const IterationSweep fresh(schedule, checkpoint, stages, static_cast<int>(sizes.size()),
                                   sizes.back() != sizes.front());
        EXPECT_EQ(sweep.run_critical_path(other, again),
                  fresh.run_critical_path(other, fresh_path));
        EXPECT_EQ(again.tasks, fresh_path.tasks);
        EXPECT_EQ(again.copies, fresh_path.copies);
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 300 * 6);
  EXPECT_GT(raised, 100);  // the pacing is not idle
}

}  // namespace
}  // namespace pipetune
