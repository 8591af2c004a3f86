// The schedule IR against torchgpipe's clock cycles and the PipeDream-flush (1F1B) rules.

#include "sim/schedule.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace pipetune {
namespace {

using Cells = std::vector<std::vector<std::pair<int, int>>>;

TEST(ClockCycles, MatchesTorchgpipe) {
  // Expected values from torchgpipe's test_clock_cycles (docs/references.md).
  EXPECT_EQ(clock_cycles(1, 1), (Cells{{{0, 0}}}));
  EXPECT_EQ(clock_cycles(1, 3), (Cells{{{0, 0}}, {{0, 1}}, {{0, 2}}}));
  EXPECT_EQ(clock_cycles(3, 1), (Cells{{{0, 0}}, {{1, 0}}, {{2, 0}}}));
  EXPECT_EQ(
      clock_cycles(3, 3),
      (Cells{{{0, 0}}, {{1, 0}, {0, 1}}, {{2, 0}, {1, 1}, {0, 2}}, {{2, 1}, {1, 2}}, {{2, 2}}}));
  EXPECT_EQ(clock_cycles(4, 2),
            (Cells{{{0, 0}}, {{1, 0}, {0, 1}}, {{2, 0}, {1, 1}}, {{3, 0}, {2, 1}}, {{3, 1}}}));
}

std::vector<Action> forwards(const std::vector<Action>& actions) {
  std::vector<Action> out;
  std::copy_if(actions.begin(), actions.end(), std::back_inserter(out),
               [](const Action& a) { return a.kind == ActionKind::Forward; });
  return out;
}

// For each (m, n) of docs/references.md: the forwards of the whole programme, in order, are the
// clock cycles flattened; on each stage, micro-batch i runs at clock i + j.
TEST(GPipe, ForwardOrderEqualsClockCycles) {
  for (auto [m, n] : std::vector<std::pair<int, int>>{{1, 1}, {1, 3}, {3, 1}, {3, 3}, {4, 2}}) {
    const Schedule s = make_schedule(ScheduleKind::GPipe, n, m, CheckpointMode::Never);
    std::vector<Action> expected;
    for (const auto& cells : clock_cycles(m, n)) {
      for (auto [micro_batch, stage] : cells)
        expected.push_back({ActionKind::Forward, stage, micro_batch});
    }
    EXPECT_EQ(forwards(program_order(s)), expected) << "m=" << m << " n=" << n;
  }
}

TEST(GPipe, BackwardInReverseMicroBatchOrder) {
  const Schedule s = make_schedule(ScheduleKind::GPipe, 3, 4, CheckpointMode::Never);
  for (int stage = 0; stage < 3; ++stage) {
    const auto& a = s.per_stage[stage];
    ASSERT_EQ(a.size(), 8u);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(a[i], (Action{ActionKind::Forward, stage, i}));
      EXPECT_EQ(a[4 + i], (Action{ActionKind::Backward, stage, 3 - i}));
    }
  }
}

TEST(GPipe, RecomputeRightBeforeItsBackwardForCheckpointedMicroBatches) {
  // except_last with 4 micro-batches: 0, 1, 2 recomputed, 3 not (torchgpipe's checkpoint_stop).
  const Schedule s = make_schedule(ScheduleKind::GPipe, 2, 4, CheckpointMode::ExceptLast);
  std::vector<std::string> text;
  for (const Action& a : s.per_stage[1]) text.push_back(to_string(a));
  EXPECT_EQ(text, (std::vector<std::string>{"1F0", "1F1", "1F2", "1F3", "1B3", "1R2", "1B2", "1R1",
                                            "1B1", "1R0", "1B0"}));
  const Schedule always = make_schedule(ScheduleKind::GPipe, 1, 2, CheckpointMode::Always);
  EXPECT_EQ(always.per_stage[0].size(), 6u);
  const Schedule one = make_schedule(ScheduleKind::GPipe, 1, 1, CheckpointMode::ExceptLast);
  EXPECT_EQ(one.per_stage[0].size(), 2u);  // a single micro-batch is the last: no recompute
}

TEST(IsCheckpointed, TorchgpipeCheckpointStop) {
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(is_checkpointed(CheckpointMode::Always, i, 5));
    EXPECT_EQ(is_checkpointed(CheckpointMode::ExceptLast, i, 5), i < 4);
    EXPECT_FALSE(is_checkpointed(CheckpointMode::Never, i, 5));
  }
}

TEST(OneFOneB, StageOrdersByHand) {
  // 3 stages, 4 micro-batches: stage s warms up with min(M, K - s) forwards.
  const Schedule s = make_schedule(ScheduleKind::OneFOneB, 3, 4, CheckpointMode::Never);
  auto text = [&](int stage) {
    std::string out;
    for (const Action& a : s.per_stage[stage]) out += to_string(a) + " ";
    return out;
  };
  EXPECT_EQ(text(0), "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3 ");
  EXPECT_EQ(text(1), "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3 ");
  EXPECT_EQ(text(2), "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3 ");
}

// Micro-batches whose forward ran and whose backward has not: what a stage holds.
int most_in_flight(const std::vector<Action>& actions) {
  int now = 0, most = 0;
  for (const Action& a : actions) {
    if (a.kind == ActionKind::Forward) most = std::max(most, ++now);
    if (a.kind == ActionKind::Backward) --now;
  }
  return most;
}

TEST(OneFOneB, AtMostKMinusSInFlight) {
  for (int k : {1, 2, 4, 8}) {
    for (int m : {1, 3, 8, 32}) {
      const Schedule one = make_schedule(ScheduleKind::OneFOneB, k, m, CheckpointMode::Never);
      const Schedule gpipe = make_schedule(ScheduleKind::GPipe, k, m, CheckpointMode::Never);
      for (int s = 0; s < k; ++s) {
        EXPECT_EQ(most_in_flight(one.per_stage[s]), std::min(m, k - s));
        EXPECT_EQ(most_in_flight(gpipe.per_stage[s]), m);
      }
    }
  }
}

// Every (kind, stage, micro-batch) appears once, and the programme order respects each
// dependency: a forward after the previous stage's forward, a backward (B or I) after the next
// stage's and after its own forward/recompute, a W after its I. Every kind, with the stages per
// device it takes.
TEST(ProgramOrder, IsATopologicalOrderOfEverySchedule) {
  for (auto kind : kAllScheduleKinds) {
    const int v = fixed_stages_per_device(kind).value_or(3);
    for (auto mode : kAllCheckpointModes) {
      for (int ranks : {1, 2, 3, 5}) {
        for (int m : {1, 2, 4, 7}) {
          if (schedule_refusal(kind, ranks, v, m)) continue;
          const int k = ranks * v;
          const Schedule s = make_schedule(kind, k, m, mode, v);
          const auto order = program_order(s);
          std::set<std::tuple<ActionKind, int, int>> done;
          auto gradient_done = [&](int stage, int i) {
            return done.count({ActionKind::Backward, stage, i}) +
                   done.count({ActionKind::InputGrad, stage, i});
          };
          for (const Action& a : order) {
            EXPECT_TRUE(done.insert({a.kind, a.stage, a.micro_batch}).second) << to_string(a);
            if (a.kind == ActionKind::Forward && a.stage > 0) {
              EXPECT_TRUE(done.count({ActionKind::Forward, a.stage - 1, a.micro_batch}))
                  << to_string(a);
            }
            if (a.kind == ActionKind::Recompute) {
              EXPECT_TRUE(done.count({ActionKind::Forward, a.stage, a.micro_batch}))
                  << to_string(a);
            }
            if (sends_gradient(a.kind)) {
              const auto own =
                  s.recomputes(a.micro_batch) ? ActionKind::Recompute : ActionKind::Forward;
              EXPECT_TRUE(done.count({own, a.stage, a.micro_batch})) << to_string(a);
              if (a.stage + 1 < k) EXPECT_TRUE(gradient_done(a.stage + 1, a.micro_batch));
            }
            if (a.kind == ActionKind::WeightGrad) {
              EXPECT_TRUE(done.count({ActionKind::InputGrad, a.stage, a.micro_batch}));
            }
          }
          const std::size_t recomputed = mode == CheckpointMode::Always       ? m
                                         : mode == CheckpointMode::ExceptLast ? m - 1
                                                                              : 0;
          // Each (stage, micro-batch) one backward, B or I (DualPipeV splits some, not all);
          // every I has its W.
          std::size_t split = 0;
          for (int st = 0; st < k; ++st) {
            for (int i = 0; i < m; ++i) {
              EXPECT_EQ(gradient_done(st, i), 1u) << to_string(kind);
              split += done.count({ActionKind::InputGrad, st, i});
            }
          }
          if (!splits_backward(kind)) EXPECT_EQ(split, 0u) << to_string(kind);
          EXPECT_EQ(order.size(), static_cast<std::size_t>(k) * (2 * m + recomputed) + split)
              << to_string(kind);
        }
      }
    }
  }
}

TEST(DevicePrograms, SharedDeviceKeepsEachStagesOrder) {
  const Schedule s = make_schedule(ScheduleKind::OneFOneB, 4, 6, CheckpointMode::ExceptLast);
  const std::vector<int> device_of{0, 1, 0, 1};
  const auto programs = device_programs(s, device_of, 2);
  for (int stage = 0; stage < 4; ++stage) {
    std::vector<Action> mine;
    for (const Action& a : programs[device_of[stage]]) {
      if (a.stage == stage) mine.push_back(a);
    }
    EXPECT_EQ(mine, s.per_stage[stage]);
  }
}

// A plan's schedule has as many micro-batches as torch.chunk makes of the batch (64 into 6
// chunks of 11 makes 6; 10 into 6 chunks of 2 makes 5), with the plan's other choices.
TEST(ScheduleOf, APlanRunsAsManyMicroBatchesAsTheBatchSplitsInto) {
  Plan plan;
  plan.balance = {1, 1, 1, 1};
  plan.chunks = 6;
  plan.schedule = ScheduleKind::LoopedBFS;
  plan.stages_per_device = 2;
  plan.checkpoint = CheckpointMode::ExceptLast;
  for (const auto& [batch, micro_batches] : {std::pair{64, 6}, std::pair{10, 5}}) {
    EXPECT_EQ(schedule_of(plan, batch), make_schedule(ScheduleKind::LoopedBFS, 4, micro_batches,
                                                      CheckpointMode::ExceptLast, 2));
  }
}

TEST(ActionText, RoundTrips) {
  for (const char* text : {"0F0", "2F13", "11R4", "3B0"}) {
    const auto a = parse_action(text);
    ASSERT_TRUE(a) << text;
    EXPECT_EQ(to_string(*a), text);
  }
  for (const char* bad : {"", "F0", "0F", "0X1", "a0F1", "0F1x", "-1F0"}) {
    EXPECT_FALSE(parse_action(bad)) << bad;
  }
}

}  // namespace
}  // namespace pipetune
