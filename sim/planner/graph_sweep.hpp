#pragma once

// A multi-stage plan's iteration time without the event engine, for the planner's searches.
//
// Where nothing paces the devices (no launch times, no co-run times), every resource (a
// device's stream, one direction of a link) runs its tasks in the order the task graph gives
// it, so the simulated makespan is the longest path over the graph's dependencies and those
// orders: one pass in a topological order, each task starting when its last predecessor ends.
// The durations are the simulator's own expressions and the additions the same, so the two
// agree exactly; the pass skips the event queue and the memory model (several times faster on
// 32 stages x 16 micro-batches), which is why the planner times balances with it and simulates
// only those that could become a configuration's best. IterationSweep (stage_timing.hpp) is the
// one-stage-per-device counterpart, with prefix bounds the enumeration needs.

#include <cstdint>
#include <vector>

#include "sim/cost_model.hpp"
#include "sim/hardware.hpp"
#include "sim/schedule.hpp"

namespace pipetune {

class GraphSweep {
 public:
  /// `schedule` (its micro-batches those of `sizes`, tensor.chunk's split) with stage s on
  /// device device_of[s] of `hardware` (calibrated as the simulator's). Builds the task graph
  /// once; run() then times any balance of that shape.
  GraphSweep(const CostModel& costs, const Hardware& hardware, const Schedule& schedule,
             const std::vector<int>& device_of, const std::vector<std::int64_t>& sizes);

  /// Whether run() equals the simulator for `profile`: not where launch times, co-run times or
  /// cold times change a task's time with what runs around it.
  static bool exact_for(const Profile& profile);

  /// The simulated iteration time of the plan whose stage s holds balance[s] layers, in order.
  double run(const std::vector<int>& balance);

  /// Tasks (compute and copies) one run() covers.
  std::size_t task_count() const { return cost_of_.size(); }

 private:
  // Per task, in a topological order: where its duration is in cost_, [stage][slot][kind] with
  // kind 0 forward, 1 forward without autograd, 2 recompute, 3 backward, 4 its input half (I),
  // 5 its weight half (W), 6 the activation copy it sends, 7 the gradient copy.
  std::vector<int> cost_of_;
  std::vector<int> predecessor_start_;  // CSR over the tasks: predecessors' positions
  std::vector<int> predecessor_;
  const CostModel& costs_;
  std::vector<std::int64_t> sizes_;  // [slot]
  std::vector<double> speed_;        // per stage, with the calibration's scale
  double overhead_ms_ = 0.0;
  Runtime runtime_ = Runtime::Pipetune;  // whole_backward_at_weight()
  // Per stage, the links its activations and its gradients leave by (null: none).
  std::vector<const Link*> activation_link_, gradient_link_;
  std::vector<double> cost_, finish_;  // scratch
};

}  // namespace pipetune
