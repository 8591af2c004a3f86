// The worst arrival order's peak against enumeration, hand-timed orders and the simulator.

#include "sim/order_peak.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "sim/simulator.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

using testing::make_plan;
using testing::random_profile;

// The largest value of `counter` over every set of events closed under "happens before",
// enumerated: event 4k is task k's start, 4k + 1 its mid effect, 4k + 2 its late one, 4k + 3 its
// end; `edges`
// (dependencies and resource order) all go from a lower task to a higher one, so events in
// index order are a linear extension and each ideal is built once.
std::int64_t enumerated_peak(const EventEngine& engine, int counter) {
  const int tasks = static_cast<int>(engine.task_count());
  std::vector<std::vector<int>> before(static_cast<std::size_t>(4 * tasks));
  std::vector<std::int64_t> weight(before.size(), 0);
  for (int k = 0; k < tasks; ++k) {
    for (int step = 1; step < 4; ++step) before[4 * k + step].push_back(4 * k + step - 1);
    const EventEngine::Effects e = engine.effects(k);
    if (e.start_counter == counter) {
      weight[4 * k] += e.start_bytes;
      weight[4 * k + 1] -= e.mid_bytes;
      weight[4 * k + 2] -= e.late_bytes;
    }
    if (e.end_counter == counter) weight[4 * k + 3] -= e.end_bytes;
  }
  for (const auto& [a, b] : engine.edges()) before[4 * b].push_back(4 * a + 3);
  std::vector<char> in(before.size(), 0);
  std::int64_t best = 0;
  auto visit = [&](auto&& self, std::size_t e, std::int64_t sum) -> void {
    if (e == before.size()) {
      best = std::max(best, sum);
      return;
    }
    self(self, e + 1, sum);
    if (std::all_of(before[e].begin(), before[e].end(), [&](int p) { return in[p] != 0; })) {
      in[e] = 1;
      self(self, e + 1, sum + weight[e]);
      in[e] = 0;
    }
  };
  visit(visit, 0, 0);
  return engine.initial(counter) + best;
}

// Random graphs of up to six tasks on up to three resources, effects on two counters.
void build_random_engine(std::mt19937& rng, EventEngine& e) {
  e.clear();
  std::uniform_int_distribution<int> resources(1, 3), tasks(2, 6), bytes(0, 50), coin(0, 1);
  const int r = resources(rng);
  for (int i = 0; i < r; ++i) e.add_resource();
  const int counters[2] = {e.add_counter(bytes(rng)), e.add_counter(0)};
  const int n = tasks(rng);
  for (int k = 0; k < n; ++k) {
    const int task =
        e.add_task(std::uniform_int_distribution<int>(0, r - 1)(rng), 0.5 + 0.1 * bytes(rng));
    for (int before = 0; before < k; ++before) {
      if (bytes(rng) < 12) e.add_dependency(before, task);
    }
    const std::int64_t allocated = bytes(rng);
    const std::int64_t mid = std::min<std::int64_t>(allocated, bytes(rng));
    const std::int64_t late = std::min<std::int64_t>(allocated - mid, bytes(rng));
    e.set_start_effect(task, counters[coin(rng)], allocated);
    e.set_mid_effect(task, 0.3, coin(rng) != 0 ? mid : 0);
    e.set_late_effect(task, 0.6, coin(rng) != 0 ? late : 0);
    e.set_end_effect(task, counters[coin(rng)], coin(rng) != 0 ? bytes(rng) : 0);
  }
}

TEST(WorstOrderPeaks, EqualTheLargestClosedSetOfEventsFoundByEnumeration) {
  std::mt19937 rng(20261126);
  EventEngine e;
  for (int trial = 0; trial < 300; ++trial) {
    build_random_engine(rng, e);
    const std::vector<std::int64_t> peaks = worst_order_peaks(e);
    ASSERT_EQ(peaks.size(), 2u);
    for (int c = 0; c < 2; ++c) ASSERT_EQ(peaks[c], enumerated_peak(e, c)) << "trial " << trial;
  }
}

TEST(WorstOrderPeaks, BoundEveryPeakTheDurationsGive) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> duration(0.01, 10.0);
  EventEngine e;
  for (int trial = 0; trial < 100; ++trial) {
    build_random_engine(rng, e);
    const std::vector<std::int64_t> peaks = worst_order_peaks(e);
    for (int run = 0; run < 20; ++run) {
      for (int k = 0; k < static_cast<int>(e.task_count()); ++k) e.set_duration(k, duration(rng));
      e.run(false);
      for (int c = 0; c < 2; ++c) ASSERT_LE(e.peak(c), peaks[c]) << "trial " << trial;
    }
  }
}

// A sender computes two tensors and copies each to a receiver, which consumes them in turn and
// frees each at its end (10 bytes each). At the durations below the receiver keeps up and holds
// one at a time; had the sender run ahead, both: the bound is 20, and a fast sender reaches it.
TEST(WorstOrderPeaks, SeeTheTensorsASenderThatRunsAheadWouldLand) {
  EventEngine e;
  const int sender = e.add_resource(), link = e.add_resource(), receiver = e.add_resource();
  const int memory = e.add_counter(0);
  int consume_before = -1;
  std::vector<int> produce;
  for (int i = 0; i < 2; ++i) {
    produce.push_back(e.add_task(sender, 5.0));
    const int copy = e.add_task(link, 0.1);
    e.add_dependency(produce.back(), copy);
    e.set_start_effect(copy, memory, 10);
    const int consume = e.add_task(receiver, 1.0);
    e.add_dependency(copy, consume);
    e.set_end_effect(consume, memory, 10);
    if (consume_before >= 0) {
      EXPECT_LT(consume_before, consume);
    }
    consume_before = consume;
  }
  e.run(false);
  EXPECT_EQ(e.peak(memory), 10);
  EXPECT_EQ(worst_order_peaks(e)[memory], 20);
  for (int p : produce) e.set_duration(p, 0.01);
  e.run(false);
  EXPECT_EQ(e.peak(memory), 20);
}

TEST(WorstOrderPeaks, OfOneDeviceAreItsSimulatedPeaks) {
  // One device has one order: its programme's.
  std::mt19937 rng(3);
  const Profile profile = random_profile(rng, 6, 8);
  const Hardware hardware = replicate_device(profile.device, 1);
  const Simulator simulator(profile, hardware);
  SimulationOptions options;
  options.worst_order_peaks = true;
  for (const CheckpointMode mode :
       {CheckpointMode::Never, CheckpointMode::ExceptLast, CheckpointMode::Always}) {
    const SimulationResult r = simulator.run(make_plan({6}, 4, mode, ScheduleKind::GPipe), options);
    ASSERT_EQ(r.devices.size(), 1u);
    EXPECT_EQ(r.devices[0].worst_order_peak_bytes, r.devices[0].peak_memory_bytes);
  }
}

TEST(WorstOrderPeaks, OfAPipelineAreAtLeastItsSimulatedPeaksAndUnchangedByItsSpeeds) {
  std::mt19937 rng(11);
  const Profile profile = random_profile(rng, 8, 16);
  const Hardware fast = replicate_device(profile.device, 4);
  Hardware slow = fast;
  slow.devices[2].speed = 0.3;
  for (const ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
    const Plan plan = make_plan({2, 2, 2, 2}, 8, CheckpointMode::Never, kind);
    SimulationOptions options;
    options.worst_order_peaks = true;
    const SimulationResult a = Simulator(profile, fast).run(plan, options);
    const SimulationResult b = Simulator(profile, slow).run(plan, options);
    for (std::size_t d = 0; d < a.devices.size(); ++d) {
      EXPECT_GE(a.devices[d].worst_order_peak_bytes, a.devices[d].peak_memory_bytes);
      EXPECT_GE(b.devices[d].worst_order_peak_bytes, b.devices[d].peak_memory_bytes);
      EXPECT_EQ(a.devices[d].worst_order_peak_bytes, b.devices[d].worst_order_peak_bytes);
    }
  }
}

// A copy of 60 bytes lands on a device (100 held) beside a task that takes 80, frees 50 of them
// 2 into its 4 and the rest at its end. Simulated, the copy comes first: 100 + 60 + 80 = 240.
// At other times: landing 3 into the task, after its transient, 100 + 30 + 60 = 190 (the
// transient's 180 is lower); after the task, 180; inside the transient of the same task
// stretched to 8 (it then ends at 4), 240 again; at the transient's very end, frees first: 190.
TEST(PeaksAtTimes, ApplyEachTasksEffectsAtTheTimesGiven) {
  EventEngine e;
  const int compute = e.add_resource(), link = e.add_resource();
  const int memory = e.add_counter(100);
  const int copy = e.add_task(link, 1.0);
  e.set_start_effect(copy, memory, 60);
  const int task = e.add_task(compute, 4.0);
  e.set_start_effect(task, memory, 80);
  e.set_mid_effect(task, 2.0, 50);
  e.set_end_effect(task, memory, 30);
  e.add_dependency(copy, task);
  e.run(false);
  using Peaks = std::vector<std::int64_t>;
  EXPECT_EQ(e.peak(memory), 240);
  EXPECT_EQ(peaks_at_times(e, {e.start(copy), e.start(task)}, {e.finish(copy), e.finish(task)}),
            Peaks{240});
  EXPECT_EQ(peaks_at_times(e, {3.0, 0.0}, {3.5, 4.0}), Peaks{190});
  EXPECT_EQ(peaks_at_times(e, {5.0, 0.0}, {5.5, 4.0}), Peaks{180});
  EXPECT_EQ(peaks_at_times(e, {3.0, 0.0}, {3.5, 8.0}), Peaks{240});
  EXPECT_EQ(peaks_at_times(e, {2.0, 0.0}, {2.5, 4.0}), Peaks{190});
}

// The same with two steps down: the task of 4 frees 20 a quarter in and 30 more half-way (at the
// same shares of a stretched task). A copy landing before the first step: 100 + 60 + 80; between
// the steps: + 60; after both: + 30.
TEST(PeaksAtTimes, ALateEffectStepsDownAtItsShareToo) {
  EventEngine e;
  const int compute = e.add_resource(), link = e.add_resource();
  const int memory = e.add_counter(100);
  const int copy = e.add_task(link, 1.0);
  e.set_start_effect(copy, memory, 60);
  const int task = e.add_task(compute, 4.0);
  e.set_start_effect(task, memory, 80);
  e.set_mid_effect(task, 1.0, 20);
  e.set_late_effect(task, 2.0, 30);
  e.set_end_effect(task, memory, 30);
  e.run(false);
  using Peaks = std::vector<std::int64_t>;
  EXPECT_EQ(peaks_at_times(e, {0.5, 0.0}, {0.6, 4.0}), Peaks{240});
  EXPECT_EQ(peaks_at_times(e, {1.5, 0.0}, {1.6, 4.0}), Peaks{220});
  EXPECT_EQ(peaks_at_times(e, {3.0, 0.0}, {3.1, 4.0}), Peaks{190});
  EXPECT_EQ(peaks_at_times(e, {3.0, 0.0}, {3.1, 8.0}), Peaks{220});  // steps at 2 and 4
}

// A task measured to take no time still holds its bytes for that instant, as the engine runs a
// zero-duration task's allocation before its free; a free of another task at that instant comes
// first.
TEST(PeaksAtTimes, AnInstantTaskAllocatesBeforeItFrees) {
  EventEngine e;
  const int a = e.add_resource(), b = e.add_resource();
  const int memory = e.add_counter(100);
  const int instant = e.add_task(a, 1.0);
  e.set_start_effect(instant, memory, 10);
  e.set_end_effect(instant, memory, 10);
  const int other = e.add_task(b, 2.0);
  e.set_start_effect(other, memory, 5);
  e.set_end_effect(other, memory, 5);
  e.run(false);
  using Peaks = std::vector<std::int64_t>;
  EXPECT_EQ(peaks_at_times(e, {1.0, 0.0}, {1.0, 3.0}), Peaks{115});
  EXPECT_EQ(peaks_at_times(e, {3.0, 0.0}, {3.0, 3.0}), Peaks{110});  // the other freed first
}

}  // namespace
}  // namespace pipetune
