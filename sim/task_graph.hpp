#pragma once

#include <span>
#include <vector>

#include "sim/event_engine.hpp"
#include "sim/schedule.hpp"
#include "sim/simulator.hpp"

namespace pipetune {

/// The task graph of a schedule placed on devices, as the simulator and the replay of measured
/// traces both run it: compute tasks in each device's programme order, then copies (one per
/// stage boundary crossing devices, per micro-batch and direction) queued on their channel in
/// the order their producers run; dependencies as docs/architecture.md lists them. Durations,
/// memory effects and counters' values are left to the caller.
struct TaskGraph {
  Schedule schedule;
  EventEngine engine;
  std::vector<SimTask> tasks;       ///< what each engine task is (times filled by the caller)
  std::vector<int> counter;         ///< per device: its memory counter
  std::vector<int> first_backward;  ///< per stage: the micro-batch of its first B or W
  /// Per stage and micro-batch (micro_batches_with(schedule, InputGrad)): 1 where its backward
  /// is split into I and W, whose forward holds more (StageMemory::split_kept_bytes).
  std::vector<char> split;
  /// Receives as a device's programme needs them, per sending device (one receiver thread per
  /// peer in the executor's transport between processes): per copy, the copy that the same
  /// receiver takes next (-1: none, or not a copy), and each receiver's first copy.
  std::vector<int> next_receive;
  std::vector<int> first_receives;
};

/// The task kind that runs an action.
TaskKind task_kind(ActionKind kind);

void build_task_graph(TaskGraph& graph, const Schedule& schedule, const std::vector<int>& device_of,
                      int devices);

/// The graph's tasks in a topological order of the engine's edges (dependencies and each
/// resource's order), with each task's predecessors: where nothing paces the tasks, one pass in
/// this order computes the engine's times. Throws std::logic_error on a cycle.
struct TaskOrder {
  std::vector<int> order;
  /// Task id's predecessors: before[before_start[id] .. before_start[id + 1]) (one array for
  /// all, as the graph is built for every configuration the planner searches).
  std::vector<int> before, before_start;
  std::span<const int> predecessors(int id) const {
    return {before.data() + before_start[id],
            static_cast<std::size_t>(before_start[id + 1] - before_start[id])};
  }
};
TaskOrder topological_order(const TaskGraph& graph);

}  // namespace pipetune
