// Iteration times against closed forms, and the timeline against its own dependencies.

#include "sim/simulator.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <stdexcept>

#include "sim/event_engine.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

using testing::make_plan;

// K stages of L identical layers each; forward f and backward b per stage and micro-batch
// whatever its size (the fixture's costs do not depend on size).
struct Uniform {
  int stages;
  int micro_batches;
  double f = 3.0;
  double b = 5.0;
  int layers_per_stage = 2;

  Profile profile() const {
    return testing::uniform_profile(stages * layers_per_stage, f / layers_per_stage,
                                    b / layers_per_stage, micro_batches);
  }
  Plan plan(CheckpointMode mode, ScheduleKind kind = ScheduleKind::GPipe) const {
    return make_plan(std::vector<int>(stages, layers_per_stage), micro_batches, mode, kind);
  }
};

constexpr int kStages[] = {1, 2, 3, 4, 8};
constexpr int kMicroBatches[] = {1, 2, 3, 4, 8, 16};

TEST(Simulator, GPipeUniformIdealIsTheTextbookFormula) {
  for (int k : kStages) {
    for (int m : kMicroBatches) {
      const Uniform u{k, m};
      const Profile profile = u.profile();
      const Hardware hw = replicate_device(profile.device, k);
      const auto r = Simulator(profile, hw).run(u.plan(CheckpointMode::Never));
      // GPipe: (M + K - 1) clock cycles of (f + b); bubble (K - 1) / (M + K - 1).
      EXPECT_DOUBLE_EQ(r.iteration_ms, (m + k - 1) * (u.f + u.b)) << "K=" << k << " M=" << m;
      EXPECT_NEAR(r.bubble_fraction, (k - 1.0) / (m + k - 1.0), 1e-12);
      EXPECT_DOUBLE_EQ(r.throughput_samples_per_s, m / (r.iteration_ms / 1e3));
      for (const auto& d : r.devices) EXPECT_DOUBLE_EQ(d.busy_ms, m * (u.f + u.b));
    }
  }
}

TEST(Simulator, RecomputeCostsOneForwardPerCheckpointedMicroBatch) {
  // Each stage recomputes micro-batch i right before its backward. Upstream stages recompute
  // their last micro-batch while the gradient is still on its way, and from then on every
  // recompute fits in the gap the downstream stage's recompute leaves, so only the last stage's
  // C recomputes lengthen the iteration: T = (M + K - 1)(f + b) + C f, C = M or M - 1.
  for (int k : kStages) {
    for (int m : kMicroBatches) {
      const Uniform u{k, m};
      const Profile profile = u.profile();
      const Hardware hw = replicate_device(profile.device, k);
      const Simulator sim(profile, hw);
      const double base = (m + k - 1) * (u.f + u.b);
      EXPECT_DOUBLE_EQ(sim.run(u.plan(CheckpointMode::Always)).iteration_ms, base + m * u.f)
          << "K=" << k << " M=" << m;
      EXPECT_DOUBLE_EQ(sim.run(u.plan(CheckpointMode::ExceptLast)).iteration_ms,
                       base + (m - 1) * u.f)
          << "K=" << k << " M=" << m;
    }
  }
}

TEST(Simulator, CheckpointedForwardsTakeTheirNoGradTime) {
  // The forwards of recomputed micro-batches run without autograd and take g, the recomputes
  // (with autograd) f. GPipe, always: the forwards fill the pipe in (M + K - 1) g, the last
  // stage then recomputes and runs back every micro-batch, M (f + b), and the last gradient
  // crosses the K - 1 stages before, whose recomputes fit in their waits: (K - 1) b.
  // Except the last: micro-batch M - 1 goes forward with autograd, f on every stage, and is not
  // recomputed: (M - 1) g + K f, then b + (M - 1)(f + b), then (K - 1) b.
  constexpr double g = 1.0;
  for (int k : kStages) {
    for (int m : kMicroBatches) {
      const Uniform u{k, m};
      Profile profile = u.profile();
      for (auto& layer : profile.layers) {
        layer.forward_nograd_ms.assign(profile.micro_batch_sizes.size(), g / u.layers_per_stage);
      }
      const Hardware hw = replicate_device(profile.device, k);  // the simulator keeps a reference
      const Simulator sim(profile, hw);
      EXPECT_DOUBLE_EQ(sim.run(u.plan(CheckpointMode::Always)).iteration_ms,
                       (m + k - 1) * g + m * (u.f + u.b) + (k - 1) * u.b)
          << "K=" << k << " M=" << m;
      EXPECT_DOUBLE_EQ(sim.run(u.plan(CheckpointMode::ExceptLast)).iteration_ms,
                       (m - 1) * g + k * u.f + u.b + (m - 1) * (u.f + u.b) + (k - 1) * u.b)
          << "K=" << k << " M=" << m;
      // Never checkpointed: the no-grad time is never used.
      EXPECT_DOUBLE_EQ(sim.run(u.plan(CheckpointMode::Never)).iteration_ms,
                       (m + k - 1) * (u.f + u.b));
    }
  }
}

TEST(Simulator, OneFOneBTakesAsLongAsGPipeOnUniformStages) {
  for (int k : kStages) {
    for (int m : kMicroBatches) {
      const Uniform u{k, m};
      const Profile profile = u.profile();
      const Hardware hw = replicate_device(profile.device, k);
      const auto r =
          Simulator(profile, hw).run(u.plan(CheckpointMode::Never, ScheduleKind::OneFOneB));
      EXPECT_DOUBLE_EQ(r.iteration_ms, (m + k - 1) * (u.f + u.b)) << "K=" << k << " M=" << m;
    }
  }
}

TEST(Simulator, LaunchOverheadIsPaidByEveryComputeTask) {
  const Uniform u{3, 4};
  const Profile profile = u.profile();
  Hardware hw = replicate_device(profile.device, 3);
  hw.launch_overhead_ms = 0.25;
  const auto r = Simulator(profile, hw).run(u.plan(CheckpointMode::Never));
  EXPECT_DOUBLE_EQ(r.iteration_ms, (4 + 3 - 1) * (u.f + u.b + 2 * 0.25));
}

// Where the host's launches take longer than the device's work (a GPU waiting for small
// kernels), a stage's task takes the launches' time: the textbook formula with f and b each
// the larger of the two, and only the device's part sped up by a faster device.
TEST(Simulator, LaunchBoundTasksTakeTheHostsTime) {
  for (int k : kStages) {
    for (int m : kMicroBatches) {
      const Uniform u{k, m};
      Profile profile = u.profile();
      for (auto& l : profile.layers) {
        l.forward_launch_ms.assign(profile.micro_batch_sizes.size(), 2.0);   // 4 a stage > f = 3
        l.backward_launch_ms.assign(profile.micro_batch_sizes.size(), 1.0);  // 2 a stage < b = 5
      }
      Hardware hw = replicate_device(profile.device, k);
      EXPECT_DOUBLE_EQ(Simulator(profile, hw).run(u.plan(CheckpointMode::Never)).iteration_ms,
                       (m + k - 1) * (4.0 + u.b))
          << "K=" << k << " M=" << m;
      for (auto& d : hw.devices) d.speed = 2.0;
      EXPECT_DOUBLE_EQ(Simulator(profile, hw).run(u.plan(CheckpointMode::Never)).iteration_ms,
                       (m + k - 1) * (4.0 + u.b / 2.0))
          << "K=" << k << " M=" << m;
    }
  }
}

// The host and the device are two clocks: the host launches the next task as soon as it has
// launched the last, without waiting for the device. One stage, four micro-batches, GPipe:
// forwards take the device 2 and the host 1, backwards the device 1 and the host 3. The host
// launches the forwards by 4 while the device runs them until 8, then backward i over
// [4 + 3i, 7 + 3i]; the device runs each at its own pace until it catches up with the host:
// B0 [8, 9], B1 [9, 10], then launch-bound B2 [10, 13] and B3 [13, 16]. Each task alone at the
// larger of its two times would take 4 x 2 + 4 x 3 = 20; the device alone 12.
TEST(Simulator, TheHostRunsAheadOfTheDeviceUntilItsLaunchesAreTheSlower) {
  Profile profile = testing::make_profile({{2.0, 1.0, 0, 0, 0, 0}}, 4);
  for (auto& l : profile.layers) {
    l.forward_launch_ms.assign(profile.micro_batch_sizes.size(), 1.0);
    l.backward_launch_ms.assign(profile.micro_batch_sizes.size(), 3.0);
  }
  const Hardware hw = replicate_device(profile.device, 1);
  const SimulationResult r = Simulator(profile, hw).run(make_plan({1}, 4, CheckpointMode::Never));
  EXPECT_DOUBLE_EQ(r.iteration_ms, 16.0);
  std::vector<std::pair<double, double>> backwards;
  for (const SimTask& t : r.tasks) {
    if (t.kind == TaskKind::Backward) backwards.emplace_back(t.start_ms, t.end_ms);
  }
  std::sort(backwards.begin(), backwards.end());
  const std::vector<std::pair<double, double>> expected{{8, 9}, {9, 10}, {10, 13}, {13, 16}};
  EXPECT_EQ(backwards, expected);
  // The device is busy over its tasks' spans: 4 x 2 + 1 + 1 + 3 + 3.
  ASSERT_EQ(r.devices.size(), 1u);
  EXPECT_DOUBLE_EQ(r.devices[0].busy_ms, 16.0);
}

// Shares of one GPU's SMs (`share_of`) launch their backwards on one thread, autograd's for
// that GPU. GPipe, every stage launch-bound in its backward (the host 6 a stage against the
// device's 5) and launching its forwards as fast as the device runs them (3): the forwards take
// (M + K - 1) x 3 on both clocks, then the K x M backwards' launches follow one another without
// a gap, and each device finishes its backward as its launch ends. Devices of their own: the
// textbook (M + K - 1) x (3 + 6).
TEST(Simulator, SharesOfOneGpuLaunchTheirBackwardsOneAtATime) {
  for (int k : kStages) {
    for (int m : kMicroBatches) {
      const Uniform u{k, m};
      Profile profile = u.profile();
      for (auto& l : profile.layers) {
        l.forward_launch_ms.assign(profile.micro_batch_sizes.size(), 1.5);
        l.backward_launch_ms.assign(profile.micro_batch_sizes.size(), 3.0);
      }
      Hardware hw = replicate_device(profile.device, k);
      EXPECT_DOUBLE_EQ(Simulator(profile, hw).run(u.plan(CheckpointMode::Never)).iteration_ms,
                       (m + k - 1) * (3.0 + 6.0))
          << "K=" << k << " M=" << m;
      for (auto& d : hw.devices) d.share_of = "cuda:0";
      EXPECT_DOUBLE_EQ(Simulator(profile, hw).run(u.plan(CheckpointMode::Never)).iteration_ms,
                       (m + k - 1) * 3.0 + k * m * 6.0)
          << "K=" << k << " M=" << m;
      // 1F1B: no two backwards' launches at once, wherever they fall.
      const SimulationResult r =
          Simulator(profile, hw).run(u.plan(CheckpointMode::Never, ScheduleKind::OneFOneB));
      std::vector<std::pair<double, double>> launches;
      for (const SimTask& t : r.tasks) {
        if (t.kind == TaskKind::Backward) launches.emplace_back(t.launch_start_ms, t.launch_end_ms);
      }
      std::sort(launches.begin(), launches.end());
      ASSERT_EQ(launches.size(), static_cast<std::size_t>(k * m));
      for (std::size_t i = 1; i < launches.size(); ++i)
        EXPECT_LE(launches[i - 1].second, launches[i].first + 1e-9) << "K=" << k << " M=" << m;
      EXPECT_GE(r.iteration_ms, k * m * 6.0);
    }
  }
}

// The copies a profile on a share stands for are shares of the first GPU, as the executor's
// `--sm-partitions` makes them; a whole device's copies are devices of their own.
TEST(Simulator, AProfileOnAShareStandsForSharesOfOneGpu) {
  ProfileDevice share{"cuda", "H200 (66 of 132 SMs: 1 of 2 shares)", 0};
  share.sm_shares = 2;
  const Hardware shares = replicate_device(share, 2);
  ASSERT_EQ(shares.devices.size(), 2u);
  for (const auto& d : shares.devices) EXPECT_EQ(d.share_of, "cuda:0");
  for (int whole : {0, 1}) {  // the whole GPU: devices of their own
    share.sm_shares = whole;
    for (const auto& d : replicate_device(share, 2).devices) EXPECT_EQ(d.share_of, "");
  }
}

// The planner's host bound (docs/planner.md), against the simulator on every balance: a
// stage's thread launches its whole programme one task after another, after micro-batch 0's
// forward was launched through the stages before it, and the backward that ends its programme
// (GPipe: micro-batch 0's, 1F1B: the last one's) is then launched back through them, so no
// plan's iteration is shorter than that sum on any stage.
TEST(Simulator, NoStageLaunchesItsProgrammeFasterThanItsHostAllows) {
  std::mt19937 rng(5);
  int tight = 0, compared = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int layers = 3 + static_cast<int>(rng() % 6);
    const int stages = 2 + static_cast<int>(rng() % 2);
    const std::int64_t batch = 2 + rng() % 7;
    Profile profile = testing::random_profile(rng, layers, batch);
    for (auto& l : profile.layers) {
      l.forward_launch_ms.assign(l.forward_ms.size(), l.forward_ms.back() * (rng() % 20) / 10.0);
      l.backward_launch_ms.assign(l.forward_ms.size(), l.backward_ms.back() * (rng() % 20) / 10.0);
      l.forward_nograd_launch_ms.assign(l.forward_ms.size(), l.forward_launch_ms[0] * 0.5);
    }
    profile.device.backward_call_ms = (rng() % 3) / 10.0;
    Hardware hw = replicate_device(profile.device, stages);
    hw.launch_overhead_ms = (rng() % 2) * 0.05;
    hw.link.latency_ms = 0.1;
    const Simulator simulator(profile, hw);
    const CostModel& costs = simulator.costs();
    const double o = hw.launch_overhead_ms;
    SimulationOptions no_records;
    no_records.record_tasks = no_records.record_memory = false;
    for (int chunks : {1, 2, static_cast<int>(batch)}) {
      const auto sizes = split_batch(batch, chunks);
      const int m = static_cast<int>(sizes.size());
      for (auto schedule : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
        for (auto mode : kAllCheckpointModes) {
          // Every balance of `stages` non-empty stages.
          std::vector<int> first(stages + 1, 0);
          std::function<void(int)> place = [&](int j) {
            if (j == stages) {
              if (first[stages] != layers) return;
              std::vector<int> balance;
              for (int k = 0; k < stages; ++k) balance.push_back(first[k + 1] - first[k]);
              const double simulated =
                  simulator.run(make_plan(balance, chunks, mode, schedule), no_records)
                      .iteration_ms;
              double arrive = 0.0, drain = 0.0, bound = 0.0;
              for (int k = 0; k < stages; ++k) {
                const int a = first[k], b = first[k + 1];
                double busy = 0.0;
                for (int i = 0; i < m; ++i) {
                  const SizeCosts& c = costs.at(sizes[i]);
                  const bool recomputed = is_checkpointed(mode, i, m);
                  busy +=
                      (recomputed ? c.forward_nograd_launch_ms(a, b) + c.forward_launch_ms(a, b) + o
                                  : c.forward_launch_ms(a, b)) +
                      c.backward_launch_ms(a, b) + 2 * o;
                }
                bound = std::max(bound, arrive + busy + drain);
                const SizeCosts& first_size = costs.at(sizes.front());
                const SizeCosts& drained =
                    costs.at(schedule == ScheduleKind::GPipe ? sizes.front() : sizes.back());
                arrive += (is_checkpointed(mode, 0, m) ? first_size.forward_nograd_launch_ms(a, b)
                                                       : first_size.forward_launch_ms(a, b)) +
                          o;
                drain += drained.backward_launch_ms(a, b) + o;
              }
              EXPECT_LE(bound, simulated * (1 + 1e-12))
                  << describe_plan(make_plan(balance, chunks, mode, schedule));
              tight += bound > 0.98 * simulated;
              ++compared;
              return;
            }
            for (int b = first[j] + 1; b <= layers - (stages - 1 - j); ++b) {
              first[j + 1] = b;
              place(j + 1);
            }
          };
          place(0);
        }
      }
    }
  }
  EXPECT_GT(compared, 1000);
  EXPECT_GT(tight, compared / 20);  // the bound is reached (to 2 %) on launch-bound plans
}

TEST(Simulator, CopiesAddTwoLinkCrossingsPerBoundary) {
  // Copies overlap compute, so only the first forward and the last backward wait for them:
  // T = (M + K - 1)(f + b) + 2 (K - 1) c, while c <= min(f, b).
  for (int k : {2, 3, 5}) {
    for (int m : {1, 4, 9}) {
      const Uniform u{k, m};
      const Profile profile = u.profile();
      Hardware hw = replicate_device(profile.device, k);
      hw.link.latency_ms = 0.5;
      const auto r = Simulator(profile, hw).run(u.plan(CheckpointMode::Never));
      EXPECT_DOUBLE_EQ(r.iteration_ms, (m + k - 1) * (u.f + u.b) + 2 * (k - 1) * 0.5)
          << "K=" << k << " M=" << m;
    }
  }
}

TEST(Simulator, BandwidthCostsBytesOverBandwidth) {
  testing::LayerSpec layer{1.0, 1.0, 0, 1000, 0, 0};  // 1000 bytes per sample out
  const Profile profile = testing::make_profile({layer, layer}, 4);
  Hardware hw = replicate_device(profile.device, 2);
  hw.link.bandwidth_bytes_per_s = 1e6;  // 1000 bytes take 1 ms
  const auto r = Simulator(profile, hw).run(make_plan({1, 1}, 1, CheckpointMode::Never));
  // One micro-batch of 4 samples: 4000 bytes = 4 ms each way. F 1 + 4 + F 1 + B 1 + 4 + B 1.
  EXPECT_DOUBLE_EQ(r.iteration_ms, 12.0);
}

TEST(Simulator, FasterDeviceTakesLess) {
  const Uniform u{2, 4};
  const Profile profile = u.profile();
  Hardware hw = replicate_device(profile.device, 2);
  hw.devices[0].speed = 2.0;
  const auto r = Simulator(profile, hw).run(u.plan(CheckpointMode::Never));
  EXPECT_DOUBLE_EQ(r.devices[0].busy_ms, 4 * (u.f + u.b) / 2);
  EXPECT_DOUBLE_EQ(r.devices[1].busy_ms, 4 * (u.f + u.b));
}

TEST(Simulator, StagesSharingOneDeviceSerialize) {
  // Everything on one device: never idle, so the iteration is the sum of all work.
  for (auto kind : kSingleStageScheduleKinds) {
    for (auto mode : kAllCheckpointModes) {
      const Uniform u{4, 6};
      const Profile profile = u.profile();
      const Hardware hw = replicate_device(profile.device, 1);
      Plan plan = u.plan(mode, kind);
      plan.devices.assign(4, "cpu:0");
      const auto r = Simulator(profile, hw).run(plan);
      const int recomputed = mode == CheckpointMode::Always       ? 6
                             : mode == CheckpointMode::ExceptLast ? 5
                                                                  : 0;
      EXPECT_DOUBLE_EQ(r.iteration_ms, 4 * (6 * (u.f + u.b) + recomputed * u.f));
      ASSERT_EQ(r.devices.size(), 1u);
      EXPECT_EQ(r.devices[0].stages, (std::vector<int>{0, 1, 2, 3}));
      EXPECT_NEAR(r.bubble_fraction, 0.0, 1e-12);
    }
  }
}

TEST(Simulator, UnevenMicroBatchesFollowTensorChunk) {
  // Costs proportional to the micro-batch size: one stage takes N (alpha + beta) whatever M.
  Profile profile = testing::uniform_profile(1, 1.0, 1.0, 10);
  for (std::size_t k = 0; k < profile.micro_batch_sizes.size(); ++k) {
    const double s = static_cast<double>(profile.micro_batch_sizes[k]);
    profile.layers[0].forward_ms[k] = 0.5 * s;
    profile.layers[0].backward_ms[k] = 1.5 * s;
  }
  const Hardware hw = replicate_device(profile.device, 1);
  const auto r = Simulator(profile, hw).run(make_plan({1}, 4, CheckpointMode::Never));
  EXPECT_EQ(r.micro_batch_sizes, (std::vector<std::int64_t>{3, 3, 3, 1}));
  EXPECT_DOUBLE_EQ(r.iteration_ms, 10 * 2.0);
}

// One Simulator reused across plans of different shapes gives what a fresh one gives: the
// cached task graph is rebuilt whenever the shape changes and refilled otherwise.
TEST(Simulator, ReuseAcrossPlansMatchesFreshSimulators) {
  testing::LayerSpec a{1.0, 2.0, 1000, 100, 50, 10}, b{0.5, 3.0, 10, 300, 20, 0};
  const Profile profile = testing::make_profile({a, b, a, b, a, b}, 12, 7);
  Hardware hw = replicate_device(profile.device, 3);
  hw.link.bandwidth_bytes_per_s = 2e5;
  const Simulator reused(profile, hw);
  const std::vector<Plan> plans{
      make_plan({2, 2, 2}, 4, CheckpointMode::Never),
      make_plan({1, 3, 2}, 4, CheckpointMode::Never),  // same shape, other balance
      make_plan({1, 3, 2}, 5, CheckpointMode::Always, ScheduleKind::OneFOneB),
      make_plan({3, 3}, 12, CheckpointMode::ExceptLast),
      make_plan({2, 2, 2}, 4, CheckpointMode::Never),  // back to the first shape
  };
  for (const Plan& plan : plans) {
    const auto mine = reused.run(plan);
    const auto fresh = Simulator(profile, hw).run(plan);
    EXPECT_EQ(mine.iteration_ms, fresh.iteration_ms) << describe_plan(plan);
    ASSERT_EQ(mine.devices.size(), fresh.devices.size());
    for (std::size_t d = 0; d < mine.devices.size(); ++d) {
      EXPECT_EQ(mine.devices[d].peak_memory_bytes, fresh.devices[d].peak_memory_bytes);
    }
    ASSERT_EQ(mine.tasks.size(), fresh.tasks.size());
    for (std::size_t t = 0; t < mine.tasks.size(); ++t) {
      EXPECT_EQ(mine.tasks[t].start_ms, fresh.tasks[t].start_ms);
    }
  }
}

// On random pipelines: every task starts after what it depends on, nothing overlaps on a
// stream, and each stream runs exactly its device programme.
TEST(Simulator, TimelineRespectsDependenciesAndStreams) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    const int layers = 2 + static_cast<int>(rng() % 7);
    std::vector<testing::LayerSpec> specs(layers);
    for (auto& s : specs) {
      s.forward_ms = 0.1 + (rng() % 100) / 10.0;
      s.backward_ms = 0.1 + (rng() % 100) / 10.0;
      s.output_per_sample = 100 * (rng() % 50);
      s.saved_per_sample = 10 * (rng() % 50);
    }
    const Profile profile = testing::make_profile(specs, 1 + rng() % 16);
    const int stages = 1 + static_cast<int>(rng() % std::min(layers, 4));
    const int devices = 1 + static_cast<int>(rng() % stages);
    Hardware hw = replicate_device(profile.device, devices);
    hw.link.bandwidth_bytes_per_s = 1e5 + rng() % 1000000;
    hw.link.latency_ms = (rng() % 10) / 10.0;
    Plan plan =
        make_plan(std::vector<int>(stages, 1), 1 + static_cast<int>(rng() % profile.batch_size),
                  kAllCheckpointModes[rng() % 3], kAllScheduleKinds[rng() % 2]);
    plan.balance.back() += layers - stages;
    for (int s = 0; s < stages; ++s) plan.devices.push_back(fmt::format("cpu:{}", rng() % devices));
    check_plan(plan, profile, hw, "random");
    SimulationOptions options;
    options.record_edges = true;
    const auto r = Simulator(profile, hw).run(plan, options);

    double last_end = 0;
    for (const auto& [before, after] : r.edges) {
      EXPECT_LE(r.tasks[before].end_ms, r.tasks[after].start_ms + 1e-9)
          << r.tasks[before].label() << " -> " << r.tasks[after].label();
    }
    std::map<std::pair<int, int>, std::vector<const SimTask*>> streams;
    for (const auto& t : r.tasks) {
      streams[{t.device, is_compute(t.kind) ? -1 : t.peer}].push_back(&t);
      last_end = std::max(last_end, t.end_ms);
    }
    for (auto& [key, tasks] : streams) {
      for (std::size_t k = 1; k < tasks.size(); ++k) {
        EXPECT_LE(tasks[k - 1]->end_ms, tasks[k]->start_ms + 1e-9);
      }
    }
    EXPECT_DOUBLE_EQ(r.iteration_ms, last_end);
    const auto sizes = split_batch(profile.batch_size, plan.chunks);
    const Schedule schedule =
        make_schedule(plan.schedule, stages, static_cast<int>(sizes.size()), plan.checkpoint);
    const auto programs = device_programs(schedule, stage_devices(plan, hw), devices);
    for (int d = 0; d < devices; ++d) {
      std::vector<std::string> ran, expected;
      for (const SimTask* t : streams[{d, -1}]) ran.push_back(t->label());
      for (const Action& a : programs[d]) expected.push_back(to_string(a));
      EXPECT_EQ(ran, expected);
    }
  }
}

// Receives posted early (the transport between processes): every device holds its first
// receive's buffer from the step's start, one activation or gradient (the same size here, as
// each layer's output is), and the step ends where it ends without them, every buffer consumed.
// Hand-made: 3 one-layer stages on 3 devices; device 0 receives gradients, 2 activations, 1 both.
TEST(Simulator, PostedReceivesHoldEachReceiversFirstBufferFromTheStepsStart) {
  testing::LayerSpec layer{1.0, 2.0, 4096, 100, 300, 0};
  const Profile profile = testing::make_profile({layer, layer, layer}, 4, 100);
  Hardware plain = replicate_device(profile.device, 3);
  plain.link.bandwidth_bytes_per_s = 1e6;
  Hardware posted = plain;
  posted.posted_receives = true;
  const std::int64_t tensor = 100 * 2;  // output bytes per sample x micro-batch size
  for (const ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
    const Plan plan = make_plan({1, 1, 1}, 2, CheckpointMode::Never, kind);
    const SimulationResult a = Simulator(profile, plain).run(plan);
    const SimulationResult b = Simulator(profile, posted).run(plan);
    ASSERT_EQ(a.devices.size(), 3u);
    EXPECT_EQ(a.iteration_ms, b.iteration_ms);
    for (std::size_t d = 0; d < 3; ++d) {
      const int receivers = d == 1 ? 2 : 1;  // the middle device hears from both sides
      EXPECT_EQ(b.devices[d].memory.front().value - a.devices[d].memory.front().value,
                receivers * tensor)
          << "device " << d;
      EXPECT_EQ(b.devices[d].memory.back().value, a.devices[d].memory.back().value)
          << "device " << d;
      EXPECT_GE(b.devices[d].peak_memory_bytes, a.devices[d].peak_memory_bytes);
    }
  }
}

// torch's zero-bubble runtime skips stage_backward_input on the first stage (its input needs no
// gradient) and runs that stage's whole backward at W. Four one-layer stages on two devices
// (interleaved zero bubble, 2 micro-batches), every layer f = 1, backward 2 measured as I 1.5 and
// W 1 (split costs more than whole), a task's overhead 0.1: on torch stage 0's I takes only the
// overhead and its W the whole backward, 2.1; every other task is the executor's.
TEST(Simulator, TorchsFirstStageRunsItsWholeBackwardAtW) {
  const testing::LayerSpec layer{1.0, 2.0, 0, 0, 0, 0};
  Profile profile = testing::make_profile({layer, layer, layer, layer}, 2);
  for (auto& l : profile.layers) {
    l.backward_input_ms.assign(l.backward_ms.size(), 1.5);
    l.backward_weight_ms.assign(l.backward_ms.size(), 1.0);
  }
  Hardware executor = replicate_device(profile.device, 2);
  executor.launch_overhead_ms = 0.1;
  Hardware torch = executor;
  torch.runtime = Runtime::TorchPipelining;
  Plan plan = make_plan({1, 1, 1, 1}, 2, CheckpointMode::Never, ScheduleKind::InterleavedZB);
  plan.stages_per_device = 2;
  const SimulationResult ours = Simulator(profile, executor).run(plan);
  const SimulationResult theirs = Simulator(profile, torch).run(plan);
  auto durations = [](const SimulationResult& r, int stage, TaskKind kind) {
    std::vector<double> out;
    for (const SimTask& t : r.tasks)
      if (t.stage == stage && t.kind == kind) out.push_back(t.duration_ms());
    return out;
  };
  for (int i = 0; i < 2; ++i) {
    EXPECT_NEAR(durations(ours, 0, TaskKind::InputGrad)[i], 1.6, 1e-12);
    EXPECT_NEAR(durations(ours, 0, TaskKind::WeightGrad)[i], 1.1, 1e-12);
    EXPECT_NEAR(durations(theirs, 0, TaskKind::InputGrad)[i], 0.1, 1e-12);
    EXPECT_NEAR(durations(theirs, 0, TaskKind::WeightGrad)[i], 2.1, 1e-12);
  }
  EXPECT_EQ(durations(ours, 0, TaskKind::InputGrad).size(), 2u);
  EXPECT_EQ(durations(theirs, 0, TaskKind::WeightGrad).size(), 2u);
  for (int stage = 1; stage < 4; ++stage) {
    for (TaskKind kind : {TaskKind::Forward, TaskKind::InputGrad, TaskKind::WeightGrad}) {
      EXPECT_EQ(durations(theirs, stage, kind), durations(ours, stage, kind)) << stage;
      EXPECT_EQ(durations(theirs, stage, kind).size(), 2u);
    }
  }
  // Device 0 is busy 0.5 less per micro-batch on torch: (1.6 + 1.1) - (0.1 + 2.1).
  EXPECT_NEAR(ours.devices[0].busy_ms - theirs.devices[0].busy_ms, 1.0, 1e-9);
  EXPECT_NEAR(ours.devices[1].busy_ms, theirs.devices[1].busy_ms, 1e-9);
  // The step ends with stage 0's I and W of the last micro-batch, after its gradient arrived
  // at the same time on both: 2.7 on the executor, 2.2 on torch.
  EXPECT_NEAR(ours.iteration_ms - theirs.iteration_ms, 0.5, 1e-9);
}

// The event engine's one pass (sim/event_engine.hpp) predicts exactly what processing events
// predicts: every schedule, checkpoint mode, memory flag, tie, co-run, cold caches, launch
// pacing, spreads, torch's runtime, posted receives and shares of one GPU (which take the
// events' way), compared bit for bit on every number a prediction holds.
TEST(Simulator, OnePassAndEventsPredictTheSameBitForBit) {
  std::mt19937 rng(1203);
  const ScheduleKind kinds[] = {
      ScheduleKind::GPipe,         ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B,
      ScheduleKind::InterleavedZB, ScheduleKind::ZBV,      ScheduleKind::LoopedBFS,
      ScheduleKind::DualPipeV};
  const CheckpointMode modes[] = {CheckpointMode::Never, CheckpointMode::ExceptLast,
                                  CheckpointMode::Always};
  int compared = 0, in_one_pass = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const ScheduleKind kind = kinds[trial % 7];
    const int devices = 1 + static_cast<int>(rng() % 3);
    const int per_device =
        fixed_stages_per_device(kind).value_or(is_multi_stage(kind) ? 1 + rng() % 2 : 1);
    const int stages = devices * per_device;
    const int layers = stages + static_cast<int>(rng() % 4);
    const std::int64_t batch = 1 + static_cast<std::int64_t>(rng() % 8);
    Profile profile = testing::random_profile(rng, layers, batch);
    testing::vary_memory_flags(rng, profile);
    testing::maybe_tie_layers(rng, profile);
    SimulationOptions options;
    options.record_edges = true;
    switch (rng() % 5) {
      case 0:  // beside co-runners
        profile.co_runners = 1;
        for (auto& l : profile.layers) {
          for (double ms : l.forward_ms) l.forward_corun_ms.push_back(ms * 1.4);
          for (double ms : l.backward_ms) l.backward_corun_ms.push_back(ms * 1.2);
        }
        break;
      case 1:  // cold caches
        profile.device.cache_bytes = 1 + static_cast<std::int64_t>(rng() % 8192);
        for (auto& l : profile.layers) {
          for (double ms : l.forward_ms) l.forward_cold_ms.push_back(ms * 1.5);
          for (double ms : l.backward_ms) l.backward_cold_ms.push_back(ms * 1.3);
        }
        break;
      case 2:  // a host that launches, now and then slower than the device runs
        for (auto& l : profile.layers) {
          l.forward_launch_ms.assign(l.forward_ms.size(),
                                     l.forward_ms.front() * (rng() % 20) / 10.0);
          l.backward_launch_ms.assign(l.backward_ms.size(),
                                      l.backward_ms.front() * (rng() % 20) / 10.0);
        }
        break;
      case 3:  // spreads, the step run slow
        for (auto& l : profile.layers) {
          for (double ms : l.forward_ms) l.forward_ms_spread.push_back(0.1 * ms);
          for (double ms : l.backward_ms) l.backward_ms_spread.push_back(0.1 * ms);
        }
        options.spread_z = 1.28;
        break;
      default:
        break;
    }
    Hardware hardware = replicate_device(profile.device, devices);
    if (rng() % 4 == 0) hardware.runtime = Runtime::TorchPipelining;
    if (rng() % 4 == 0) hardware.posted_receives = true;
    if (rng() % 6 == 0) {
      for (auto& d : hardware.devices) d.share_of = "cuda:0";
    }
    std::vector<int> balance(stages, 1);
    for (int extra = layers - stages; extra > 0; --extra) ++balance[rng() % stages];
    Plan plan = make_plan(balance, 1 + static_cast<int>(rng() % batch), modes[rng() % 3], kind);
    plan.stages_per_device = per_device;
    try {
      check_plan(plan, profile, hardware, "plan");
    } catch (const std::exception&) {
      continue;  // a plan the schedule refuses
    }
    const std::string what = describe_plan(plan);
    EventEngine::always_process_events(true);
    SimulationResult want;
    try {
      want = Simulator(profile, hardware).run(plan, options);
    } catch (const std::exception&) {
      EventEngine::always_process_events(false);
      continue;  // e.g. fewer micro-batches than the schedule needs
    }
    EventEngine::always_process_events(false);
    const std::uint64_t one_pass_before = EventEngine::runs_in_one_pass();
    const SimulationResult got = Simulator(profile, hardware).run(plan, options);
    ++compared;
    in_one_pass += EventEngine::runs_in_one_pass() > one_pass_before ? 1 : 0;
    ASSERT_EQ(got.iteration_ms, want.iteration_ms) << what;
    EXPECT_EQ(got.bubble_fraction, want.bubble_fraction) << what;
    ASSERT_EQ(got.devices.size(), want.devices.size());
    for (std::size_t d = 0; d < want.devices.size(); ++d) {
      const DeviceReport &a = got.devices[d], &b = want.devices[d];
      EXPECT_EQ(a.busy_ms, b.busy_ms) << what;
      EXPECT_EQ(a.peak_memory_bytes, b.peak_memory_bytes) << what << " device " << d;
      EXPECT_EQ(a.peak_time_ms, b.peak_time_ms) << what << " device " << d;
      ASSERT_EQ(a.memory.size(), b.memory.size()) << what << " device " << d;
      for (std::size_t k = 0; k < b.memory.size(); ++k) {
        EXPECT_EQ(a.memory[k].time, b.memory[k].time) << what;
        EXPECT_EQ(a.memory[k].value, b.memory[k].value) << what;
      }
    }
    ASSERT_EQ(got.tasks.size(), want.tasks.size());
    for (std::size_t k = 0; k < want.tasks.size(); ++k) {
      EXPECT_EQ(got.tasks[k].start_ms, want.tasks[k].start_ms) << what;
      EXPECT_EQ(got.tasks[k].end_ms, want.tasks[k].end_ms) << what;
      EXPECT_EQ(got.tasks[k].launch_start_ms, want.tasks[k].launch_start_ms) << what;
    }
    EXPECT_EQ(got.edges, want.edges) << what;
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(compared, 250);
  // Most predictions took the one pass (shares of one GPU and posted receives do not).
  EXPECT_GT(in_one_pass, compared / 2);
}

// A simulator keeps each stage's memory walk between runs (a search's plans share most of their
// stages): a run after many others gives exactly what a fresh simulator gives for that plan.
TEST(Simulator, ARunAfterManyOthersEqualsAFreshSimulatorsRun) {
  std::mt19937 rng(11);
  int compared = 0;
  for (int trial = 0; trial < 12; ++trial) {
    const int layers = 8 + static_cast<int>(rng() % 24);
    const std::int64_t batch = 4 + static_cast<std::int64_t>(rng() % 13);
    const Profile profile = testing::random_profile(rng, layers, batch);
    const Hardware hw = replicate_device(profile.device, 2);
    const Simulator reused(profile, hw);
    for (int k = 0; k < 40; ++k) {
      const ScheduleKind kind = kAllScheduleKinds[rng() % std::size(kAllScheduleKinds)];
      const int v = is_multi_stage(kind) ? 2 : 1;
      Plan plan =
          make_plan(testing::balance_of_ends(testing::random_stage_ends(rng, layers, 2 * v)),
                    1 + static_cast<int>(rng() % batch),
                    kAllCheckpointModes[rng() % std::size(kAllCheckpointModes)], kind);
      plan.stages_per_device = v;
      try {
        check_plan(plan, profile, hw, "plan");
      } catch (const std::exception&) {
        continue;  // a micro-batch count the schedule refuses
      }
      const Simulator fresh(profile, hw);
      const SimulationResult want = fresh.run(plan), got = reused.run(plan);
      ASSERT_EQ(got.iteration_ms, want.iteration_ms) << plan_to_json(plan);
      ASSERT_EQ(got.devices.size(), want.devices.size());
      for (std::size_t d = 0; d < want.devices.size(); ++d) {
        EXPECT_EQ(got.devices[d].peak_memory_bytes, want.devices[d].peak_memory_bytes);
        EXPECT_EQ(got.devices[d].peak_time_ms, want.devices[d].peak_time_ms);
        ASSERT_EQ(got.devices[d].memory.size(), want.devices[d].memory.size());
        for (std::size_t i = 0; i < want.devices[d].memory.size(); ++i)
          EXPECT_EQ(got.devices[d].memory[i].value, want.devices[d].memory[i].value);
      }
      ++compared;
    }
  }
  EXPECT_GT(compared, 200);
}

}  // namespace
}  // namespace pipetune
