#include "sim/planner/graph_sweep.hpp"

#include <algorithm>
#include <stdexcept>

#include "sim/planner/stage_timing.hpp"
#include "sim/task_graph.hpp"

namespace pipetune {

GraphSweep::GraphSweep(const CostModel& costs, const Hardware& hardware, const Schedule& schedule,
                       const std::vector<int>& device_of, const std::vector<std::int64_t>& sizes)
    : costs_(costs) {
  const int devices = static_cast<int>(hardware.devices.size());
  const int stages = schedule.stages, m = schedule.micro_batches;
  if (static_cast<int>(sizes.size()) != m || static_cast<int>(device_of.size()) != stages)
    throw std::invalid_argument("GraphSweep: sizes or devices of another shape");
  sizes_ = {sizes.front(), sizes.back()};
  // As the simulator: compute scaled by how many devices hold stages, a per-task overhead.
  std::vector<char> holds(devices, 0);
  for (int d : device_of) holds.at(d) = 1;
  const double time_scale =
      hardware.calibration.scale_for(static_cast<int>(std::count(holds.begin(), holds.end(), 1)));
  overhead_ms_ = hardware.launch_overhead_ms + hardware.calibration.task_overhead_ms;
  runtime_ = hardware.runtime;
  for (int s = 0; s < stages; ++s)
    speed_.push_back(hardware.devices[device_of[s]].speed / time_scale);

  TaskGraph graph;
  build_task_graph(graph, schedule, device_of, devices);
  const int n = static_cast<int>(graph.tasks.size());
  const TaskOrder sorted = topological_order(graph);
  const std::vector<int>& order = sorted.order;
  std::vector<int> position(n);
  for (int k = 0; k < n; ++k) position[order[k]] = k;
  activation_link_.assign(stages, nullptr);
  gradient_link_.assign(stages, nullptr);
  predecessor_start_.push_back(0);
  for (int id : order) {
    const SimTask& t = graph.tasks[id];
    int kind = 0;
    switch (t.kind) {
      case TaskKind::Forward:
        kind = schedule.recomputes(t.micro_batch) ? 1 : 0;
        break;
      case TaskKind::Recompute:
        kind = 2;
        break;
      case TaskKind::Backward:
        kind = 3;
        break;
      case TaskKind::InputGrad:
        kind = 4;
        break;
      case TaskKind::WeightGrad:
        kind = 5;
        break;
      case TaskKind::SendActivation:
      case TaskKind::SendGradient: {
        const bool activation = t.kind == TaskKind::SendActivation;
        kind = activation ? 6 : 7;
        // A stage's copies in one direction all go to the same device.
        (activation ? activation_link_ : gradient_link_)[t.stage] =
            &hardware.copy_link(t.device, t.peer);
        break;
      }
    }
    const int slot = sizes[t.micro_batch] == sizes.front() ? 0 : 1;
    cost_of_.push_back((t.stage * 2 + slot) * 8 + kind);
    for (int u : sorted.predecessors(id)) predecessor_.push_back(position[u]);
    predecessor_start_.push_back(static_cast<int>(predecessor_.size()));
  }
  finish_.assign(n, 0.0);
  cost_.assign(static_cast<std::size_t>(stages) * 16, 0.0);
}

bool GraphSweep::exact_for(const Profile& profile) {
  return !profile.has_launch_times() && !profile.has_corun_times() && !profile.has_cold_times() &&
         !profile.has_after_idle();
}

double GraphSweep::run(const std::vector<int>& balance) {
  const int stages = static_cast<int>(speed_.size());
  if (static_cast<int>(balance.size()) != stages)
    throw std::invalid_argument("GraphSweep::run: a balance of another stage count");
  // The simulator's expressions: stage_durations() (stage_timing.hpp), and the backward's
  // halves as the simulator's stage_costs() writes them.
  const SizeCosts& common = costs_.at(sizes_[0]);
  const SizeCosts& last = costs_.at(sizes_[1]);
  for (int s = 0, a = 0; s < stages; a += balance[s], ++s) {
    const int b = a + balance[s];
    const double speed = speed_[s];
    const StageDurations d = stage_durations(common, last, a, b, speed, overhead_ms_,
                                             activation_link_[s], gradient_link_[s], false);
    for (int slot = 0; slot < 2; ++slot) {
      const SizeCosts& c = slot == 0 ? common : last;
      double* x = &cost_[static_cast<std::size_t>(s * 2 + slot) * 8];
      x[0] = x[2] = d.forward[slot];
      x[1] = d.forward_nograd[slot];
      x[3] = d.backward[slot];
      const bool whole_at_w = whole_backward_at_weight(runtime_, s);
      x[4] = whole_at_w ? overhead_ms_ : c.backward_input_ms_sum(a, b) / speed + overhead_ms_;
      x[5] = whole_at_w ? d.backward[slot] : c.backward_weight_ms_sum(a, b) / speed + overhead_ms_;
      x[6] = d.activation_copy[slot];
      x[7] = d.gradient_copy[slot];
    }
  }
  double makespan = 0.0;
  const std::size_t n = cost_of_.size();
  for (std::size_t k = 0; k < n; ++k) {
    double start = 0.0;
    for (int p = predecessor_start_[k]; p < predecessor_start_[k + 1]; ++p)
      start = std::max(start, finish_[predecessor_[p]]);
    finish_[k] = start + cost_[cost_of_[k]];
    makespan = std::max(makespan, finish_[k]);
  }
  return makespan;
}

}  // namespace pipetune
