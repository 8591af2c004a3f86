#pragma once

// Stages as CUDA graphs, behind one narrow seam: GraphRuntime captures and replays (CUDA graphs
// on a GPU, a recording fake in the tests), and GraphReplayer, which holds all the bookkeeping,
// is torch-free and runs anywhere. Copies between stages stay outside the graphs: the replayer
// asks the executor to copy a micro-batch's tensor into the slot's static input buffer before
// the graph, and to hand on what the graph wrote to its static output buffer after it.

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "executor/graph_plan.hpp"
#include "sim/schedule.hpp"

namespace pipetune::exec {

class GraphRuntime {
 public:
  virtual ~GraphRuntime() = default;
  /// Records `work` (the action on its slot's static buffers) as `key`'s graph, in the pool of
  /// key.stage. Stream capture records without running, so the replayer replays it next.
  virtual void capture(const GraphKey& key, const std::function<void()>& work) = 0;
  virtual void replay(const GraphKey& key) = 0;
};

/// What the executor does around each graph, on the device's thread.
struct GraphStepCalls {
  /// Copy the action's micro-batch tensor (F: the stage input; B, I: the output gradient) into
  /// static buffer `buffer`. Not for R: it reads the input its F's copy left in the slot.
  std::function<void(const Action& action, int buffer)> copy_in;
  /// The action itself on its slot's static buffers, eagerly: what capture records.
  std::function<void(const Action& action, const GraphKey& key)> work;
  /// Hand on what the graph wrote to static buffer `buffer` (F: its output; B, I: dx).
  std::function<void(const Action& action, int buffer)> copy_out;
};

/// Runs one device's programme as graphs, step after step. The first step captures each graph
/// when it first meets it, which must be in the plan's capture order (each stage's actions run
/// in the device programme in their stage order): it throws std::logic_error otherwise, or for
/// an action the plan has no graph for. Later steps only replay. One per device thread.
class GraphReplayer {
 public:
  GraphReplayer(const GraphPlan& plan, GraphRuntime& runtime)
      : plan_(plan), runtime_(runtime), captured_(plan.captures.size(), 0) {}

  /// One step of `program` (device_programs' programme of this device): for each action,
  /// copy in, capture if not yet captured, replay, copy out.
  void run(std::span<const Action> program, const GraphStepCalls& calls);

 private:
  const GraphPlan& plan_;
  GraphRuntime& runtime_;
  std::vector<std::size_t> captured_;  ///< per stage: how many of plan_.captures[s] are captured
};

}  // namespace pipetune::exec
