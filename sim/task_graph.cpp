#include "sim/task_graph.hpp"

#include <stdexcept>

namespace pipetune {

TaskKind task_kind(ActionKind kind) {
  switch (kind) {
    case ActionKind::Forward:
      return TaskKind::Forward;
    case ActionKind::Recompute:
      return TaskKind::Recompute;
    case ActionKind::Backward:
      return TaskKind::Backward;
    case ActionKind::InputGrad:
      return TaskKind::InputGrad;
    case ActionKind::WeightGrad:
      return TaskKind::WeightGrad;
  }
  return TaskKind::Forward;
}

void build_task_graph(TaskGraph& g, const Schedule& schedule, const std::vector<int>& device_of,
                      int devices) {
  const int stages = schedule.stages;
  const int micro_batches = schedule.micro_batches;
  g.schedule = schedule;
  const auto programs = device_programs(g.schedule, device_of, devices);

  // The stage's first B or W creates the parameter gradients; later ones add into them.
  g.first_backward.assign(stages, -1);
  for (int s = 0; s < stages; ++s) {
    for (const Action& a : g.schedule.per_stage[s]) {
      if (a.kind == ActionKind::Backward || a.kind == ActionKind::WeightGrad) {
        g.first_backward[s] = a.micro_batch;
        break;
      }
    }
  }
  g.split = micro_batches_with(g.schedule, ActionKind::InputGrad);

  EventEngine& engine = g.engine;
  engine.clear();
  const std::size_t cells = static_cast<std::size_t>(stages) * micro_batches;
  engine.reserve(6 * cells);
  g.tasks.clear();
  g.tasks.reserve(6 * cells);
  g.counter.resize(devices);
  std::vector<int> compute(devices);
  for (int d = 0; d < devices; ++d) {
    g.counter[d] = engine.add_counter(0);
    compute[d] = engine.add_resource();
  }
  std::vector<int> channel(static_cast<std::size_t>(devices) * devices, -1);
  auto channel_between = [&](int from, int to) {
    int& r = channel[static_cast<std::size_t>(from) * devices + to];
    if (r < 0) r = engine.add_resource();
    return r;
  };
  auto cell = [&](int s, int i) { return static_cast<std::size_t>(s) * micro_batches + i; };
  // Per cell, the engine task of each action kind (-1: none); "backward" is the B or I.
  std::vector<int> forward(cells, -1), recompute(cells, -1), backward(cells, -1), weight(cells, -1);
  std::vector<int> send_activation(cells, -1), send_gradient(cells, -1);
  auto slot = [&](ActionKind kind) -> std::vector<int>& {
    switch (kind) {
      case ActionKind::Forward:
        return forward;
      case ActionKind::Recompute:
        return recompute;
      case ActionKind::WeightGrad:
        return weight;
      case ActionKind::Backward:
      case ActionKind::InputGrad:
        break;
    }
    return backward;
  };

  // Compute tasks in each device's programme order.
  for (int d = 0; d < devices; ++d) {
    for (const Action& a : programs[d]) {
      slot(a.kind)[cell(a.stage, a.micro_batch)] = engine.add_task(compute[d], 0.0);
      g.tasks.push_back({task_kind(a.kind), a.stage, a.micro_batch, d, -1, 0.0, 0.0, 0});
    }
  }
  // Copies, queued on each channel in the order their producers run on the sending device.
  for (int d = 0; d < devices; ++d) {
    for (const Action& a : programs[d]) {
      const int s = a.stage, i = a.micro_batch;
      if (a.kind == ActionKind::Forward && s + 1 < stages && device_of[s + 1] != d) {
        send_activation[cell(s, i)] = engine.add_task(channel_between(d, device_of[s + 1]), 0.0);
        g.tasks.push_back({TaskKind::SendActivation, s, i, d, device_of[s + 1], 0.0, 0.0, 0});
      }
      if (sends_gradient(a.kind) && s > 0 && device_of[s - 1] != d) {
        send_gradient[cell(s, i)] = engine.add_task(channel_between(d, device_of[s - 1]), 0.0);
        g.tasks.push_back({TaskKind::SendGradient, s, i, d, device_of[s - 1], 0.0, 0.0, 0});
      }
    }
  }
  // Dependencies: a forward needs the previous stage's activation; a backward (B or I) needs
  // its own forward or recompute and the next stage's gradient; W needs its I; a copy needs
  // what it sends.
  for (int s = 0; s < stages; ++s) {
    for (int i = 0; i < micro_batches; ++i) {
      const std::size_t k = cell(s, i);
      if (s > 0) {
        const int producer = send_activation[cell(s - 1, i)];
        engine.add_dependency(producer >= 0 ? producer : forward[cell(s - 1, i)], forward[k]);
      }
      if (recompute[k] >= 0) engine.add_dependency(forward[k], recompute[k]);
      if (send_activation[k] >= 0) engine.add_dependency(forward[k], send_activation[k]);
      engine.add_dependency(recompute[k] >= 0 ? recompute[k] : forward[k], backward[k]);
      if (s + 1 < stages) {
        const int producer = send_gradient[cell(s + 1, i)];
        engine.add_dependency(producer >= 0 ? producer : backward[cell(s + 1, i)], backward[k]);
      }
      if (weight[k] >= 0) engine.add_dependency(backward[k], weight[k]);
      if (send_gradient[k] >= 0) engine.add_dependency(backward[k], send_gradient[k]);
    }
  }
  // Each device's receives in its programme's order, per sender: a forward takes the previous
  // stage's activation, a B or I the next stage's gradient.
  g.next_receive.assign(g.tasks.size(), -1);
  g.first_receives.clear();
  for (int d = 0; d < devices; ++d) {
    std::vector<int> last(devices, -1);
    for (const Action& a : programs[d]) {
      const int s = a.stage, i = a.micro_batch;
      int copy = -1;
      if (a.kind == ActionKind::Forward && s > 0) copy = send_activation[cell(s - 1, i)];
      if (sends_gradient(a.kind) && s + 1 < stages) copy = send_gradient[cell(s + 1, i)];
      if (copy < 0) continue;
      const int from = g.tasks[static_cast<std::size_t>(copy)].device;
      if (last[from] < 0) {
        g.first_receives.push_back(copy);
      } else {
        g.next_receive[static_cast<std::size_t>(last[from])] = copy;
      }
      last[from] = copy;
    }
  }
}

TaskOrder topological_order(const TaskGraph& graph) {
  const int n = static_cast<int>(graph.tasks.size());
  TaskOrder out;
  // Both directions as flat arrays indexed by per-task offsets.
  std::vector<int> after, after_start(n + 1, 0);
  out.before_start.assign(n + 1, 0);
  const auto edges = graph.engine.edges();
  for (const auto& [u, t] : edges) {
    ++out.before_start[t + 1];
    ++after_start[u + 1];
  }
  for (int id = 0; id < n; ++id) {
    out.before_start[id + 1] += out.before_start[id];
    after_start[id + 1] += after_start[id];
  }
  out.before.resize(out.before_start[n]);
  after.resize(after_start[n]);
  {
    std::vector<int> into_before(out.before_start.begin(), out.before_start.end() - 1);
    std::vector<int> into_after(after_start.begin(), after_start.end() - 1);
    for (const auto& [u, t] : edges) {
      out.before[into_before[t]++] = u;
      after[into_after[u]++] = t;
    }
  }
  std::vector<int> waiting(n);
  for (int id = 0; id < n; ++id) {
    waiting[id] = out.before_start[id + 1] - out.before_start[id];
    if (waiting[id] == 0) out.order.push_back(id);
  }
  for (std::size_t i = 0; i < out.order.size(); ++i) {
    const int u = out.order[i];
    for (int k = after_start[u]; k < after_start[u + 1]; ++k)
      if (--waiting[after[k]] == 0) out.order.push_back(after[k]);
  }
  if (static_cast<int>(out.order.size()) != n)
    throw std::logic_error("the schedule's task graph has a cycle");
  return out;
}

}  // namespace pipetune
