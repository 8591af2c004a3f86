// The task graph (sim/task_graph) of small GPipe and 1F1B plans against tasks and dependencies
// counted by hand from the rules in docs/architecture.md.

#include "sim/task_graph.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace pipetune {
namespace {

TaskGraph graph_of(ScheduleKind kind, int stages, int micro_batches, CheckpointMode checkpoint,
                   const std::vector<int>& device_of) {
  TaskGraph graph;
  const int devices = *std::max_element(device_of.begin(), device_of.end()) + 1;
  build_task_graph(graph, make_schedule(kind, stages, micro_batches, checkpoint, 1), device_of,
                   devices);
  // Every task takes a unit of time; run() also lays out each resource's order for edges().
  for (std::size_t id = 0; id < graph.tasks.size(); ++id)
    graph.engine.set_duration(static_cast<int>(id), 1.0);
  graph.engine.run(false);
  return graph;
}

std::vector<std::string> labels(const TaskGraph& graph) {
  std::vector<std::string> out;
  for (const auto& t : graph.tasks) out.push_back(t.label());
  return out;
}

std::set<std::pair<std::string, std::string>> edges(const TaskGraph& graph) {
  std::set<std::pair<std::string, std::string>> out;
  for (auto [before, after] : graph.engine.edges()) {
    out.emplace(graph.tasks[before].label(), graph.tasks[after].label());
  }
  return out;
}

TEST(TaskGraph, GPipeOnTwoDevicesHasEveryTaskAndEdgeCountedByHand) {
  const TaskGraph g = graph_of(ScheduleKind::GPipe, 2, 2, CheckpointMode::Never, {0, 1});
  // Compute tasks in each device's programme order (GPipe: all forwards, then the backwards
  // in reverse), then the copies in the order their producers run.
  EXPECT_EQ(labels(g),
            (std::vector<std::string>{"0F0", "0F1", "0B1", "0B0", "1F0", "1F1", "1B1", "1B0",
                                      "0>1 act 0", "0>1 act 1", "1>0 grad 1", "1>0 grad 0"}));
  const std::set<std::pair<std::string, std::string>> expected = {
      // dependencies
      {"0F0", "0>1 act 0"},
      {"0F1", "0>1 act 1"},
      {"0>1 act 0", "1F0"},
      {"0>1 act 1", "1F1"},
      {"1F0", "1B0"},
      {"1F1", "1B1"},
      {"1B0", "1>0 grad 0"},
      {"1B1", "1>0 grad 1"},
      {"1>0 grad 0", "0B0"},
      {"1>0 grad 1", "0B1"},
      {"0F0", "0B0"},
      {"0F1", "0B1"},
      // each resource's order: two compute streams, two copy channels
      {"0F0", "0F1"},
      {"0F1", "0B1"},
      {"0B1", "0B0"},
      {"1F0", "1F1"},
      {"1F1", "1B1"},
      {"1B1", "1B0"},
      {"0>1 act 0", "0>1 act 1"},
      {"1>0 grad 1", "1>0 grad 0"}};
  EXPECT_EQ(edges(g), expected);
  // 12 dependencies and 8 order edges; two are both (0F1 -> 0B1 and 1F1 -> 1B1).
  EXPECT_EQ(g.engine.edges().size(), 20u);
  EXPECT_EQ(g.first_backward, (std::vector<int>{1, 1}));  // GPipe's backward starts at the last
  // Unit times: the longest path 0F0 act0 1F0 1F1 1B1 1B0 grad0 0B0 takes 8.
  EXPECT_DOUBLE_EQ(g.engine.makespan(), 8.0);
}

TEST(TaskGraph, StagesSharingADeviceNeedNoCopies) {
  const TaskGraph g = graph_of(ScheduleKind::GPipe, 2, 2, CheckpointMode::Never, {0, 0});
  EXPECT_EQ(g.tasks.size(), 8u);
  for (const auto& t : g.tasks) EXPECT_TRUE(is_compute(t.kind)) << t.label();
  const auto e = edges(g);
  EXPECT_TRUE(e.count({"0F0", "1F0"}));  // straight from the producer
  EXPECT_TRUE(e.count({"1B0", "0B0"}));
}

// Counts for K stages on K devices and M micro-batches of which r are recomputed, from the
// rules: forwards and backwards K·M; recomputes K·r; copies (K−1)·M each way; dependencies
// (K−1)·M (forward on activation) + (K−1)·M (copy on forward) + K·M (backward on forward or
// recompute) + (K−1)·M (backward on gradient) + (K−1)·M (copy on backward) + K·r (recompute on
// forward); resource order: one edge fewer than tasks on each of K streams and 2(K−1) channels.
struct Counts {
  std::size_t compute = 0, copies = 0, edges = 0;
};
Counts counted_by_hand(int K, int M, int r) {
  Counts c;
  c.compute = 2 * K * M + K * r;
  c.copies = 2 * (K - 1) * M;
  const std::size_t dependencies = 4 * (K - 1) * M + K * M + K * r;
  const std::size_t order = (c.compute - K) + (c.copies - 2 * (K - 1));
  c.edges = dependencies + order;
  return c;
}

TEST(TaskGraph, CountsOfGPipeAndOneFOneBWithEveryCheckpointModeMatchTheRules) {
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
    for (CheckpointMode mode :
         {CheckpointMode::Never, CheckpointMode::ExceptLast, CheckpointMode::Always}) {
      for (auto [K, M] : {std::pair{2, 3}, std::pair{3, 4}, std::pair{4, 2}}) {
        const int r = mode == CheckpointMode::Always       ? M
                      : mode == CheckpointMode::ExceptLast ? M - 1
                                                           : 0;
        std::vector<int> device_of(K);
        for (int s = 0; s < K; ++s) device_of[s] = s;
        const TaskGraph g = graph_of(kind, K, M, mode, device_of);
        const Counts want = counted_by_hand(K, M, r);
        std::size_t compute = 0, copies = 0, recomputes = 0;
        for (const auto& t : g.tasks) {
          (is_compute(t.kind) ? compute : copies) += 1;
          recomputes += t.kind == TaskKind::Recompute;
        }
        SCOPED_TRACE(::testing::Message()
                     << to_string(kind) << " " << to_string(mode) << " K=" << K << " M=" << M);
        EXPECT_EQ(compute, want.compute);
        EXPECT_EQ(copies, want.copies);
        EXPECT_EQ(recomputes, static_cast<std::size_t>(K * r));
        EXPECT_EQ(g.engine.edges().size(), want.edges);
        // Each recompute follows its own forward and feeds its own backward.
        const auto e = edges(g);
        for (const auto& t : g.tasks) {
          if (t.kind != TaskKind::Recompute) continue;
          const std::string f = task_label(TaskKind::Forward, t.stage, t.micro_batch);
          const std::string b = task_label(TaskKind::Backward, t.stage, t.micro_batch);
          EXPECT_TRUE(e.count({f, t.label()})) << t.label();
          EXPECT_TRUE(e.count({t.label(), b})) << t.label();
          EXPECT_FALSE(e.count({f, b}))
              << t.label();  // the backward waits on the recompute instead
        }
      }
    }
  }
}

TEST(TaskGraph, OneFOneBOnTwoDevicesRunsInPipeDreamFlushOrder) {
  // Stage 0 of 2 warms up with one forward, then alternates; stage 1 (the last) alternates.
  const TaskGraph g = graph_of(ScheduleKind::OneFOneB, 2, 3, CheckpointMode::Never, {0, 1});
  std::vector<std::string> device0, device1;
  for (const auto& t : g.tasks) {
    if (!is_compute(t.kind)) continue;
    (t.device == 0 ? device0 : device1).push_back(t.label());
  }
  EXPECT_EQ(device0, (std::vector<std::string>{"0F0", "0F1", "0B0", "0F2", "0B1", "0B2"}));
  EXPECT_EQ(device1, (std::vector<std::string>{"1F0", "1B0", "1F1", "1B1", "1F2", "1B2"}));
  EXPECT_EQ(g.first_backward, (std::vector<int>{0, 0}));
}

}  // namespace
}  // namespace pipetune
