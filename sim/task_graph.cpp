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

namespace {

using Programs = std::vector<std::vector<Action>>;

// The engine task of each action kind per (stage, micro-batch) cell, -1 where there is none;
// "backward" is the B or I.
struct CellTasks {
  int micro_batches = 0;
  std::vector<int> forward, recompute, backward, weight, send_activation, send_gradient;

  CellTasks(int stages, int micro_batches_) : micro_batches(micro_batches_) {
    const std::size_t cells = static_cast<std::size_t>(stages) * micro_batches;
    for (auto* v : {&forward, &recompute, &backward, &weight, &send_activation, &send_gradient})
      v->assign(cells, -1);
  }
  std::size_t cell(int s, int i) const { return static_cast<std::size_t>(s) * micro_batches + i; }
  std::vector<int>& of(ActionKind kind) {
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
  }
};

// The stage's first B or W creates the parameter gradients; later ones add into them.
void mark_first_backwards(TaskGraph& g) {
  g.first_backward.assign(g.schedule.stages, -1);
  for (int s = 0; s < g.schedule.stages; ++s) {
    for (const Action& a : g.schedule.per_stage[s]) {
      if (a.kind == ActionKind::Backward || a.kind == ActionKind::WeightGrad) {
        g.first_backward[s] = a.micro_batch;
        break;
      }
    }
  }
}

// Compute tasks in each device's programme order, on the device's resource.
void add_compute_tasks(TaskGraph& g, const Programs& programs, const std::vector<int>& compute,
                       CellTasks& cells) {
  for (std::size_t d = 0; d < programs.size(); ++d) {
    for (const Action& a : programs[d]) {
      cells.of(a.kind)[cells.cell(a.stage, a.micro_batch)] = g.engine.add_task(compute[d], 0.0);
      g.tasks.push_back(
          {task_kind(a.kind), a.stage, a.micro_batch, static_cast<int>(d), -1, 0.0, 0.0, 0});
    }
  }
}

// Copies, queued on each channel (one a direction between two devices) in the order their
// producers run on the sending device.
void add_copy_tasks(TaskGraph& g, const Programs& programs, const std::vector<int>& device_of,
                    CellTasks& cells) {
  const int devices = static_cast<int>(programs.size());
  const int stages = g.schedule.stages;
  std::vector<int> channel(static_cast<std::size_t>(devices) * devices, -1);
  const auto channel_between = [&](int from, int to) {
    int& r = channel[static_cast<std::size_t>(from) * devices + to];
    if (r < 0) r = g.engine.add_resource();
    return r;
  };
  for (int d = 0; d < devices; ++d) {
    for (const Action& a : programs[d]) {
      const int s = a.stage, i = a.micro_batch;
      if (a.kind == ActionKind::Forward && s + 1 < stages && device_of[s + 1] != d) {
        cells.send_activation[cells.cell(s, i)] =
            g.engine.add_task(channel_between(d, device_of[s + 1]), 0.0);
        g.tasks.push_back({TaskKind::SendActivation, s, i, d, device_of[s + 1], 0.0, 0.0, 0});
      }
      if (sends_gradient(a.kind) && s > 0 && device_of[s - 1] != d) {
        cells.send_gradient[cells.cell(s, i)] =
            g.engine.add_task(channel_between(d, device_of[s - 1]), 0.0);
        g.tasks.push_back({TaskKind::SendGradient, s, i, d, device_of[s - 1], 0.0, 0.0, 0});
      }
    }
  }
}

// A forward needs the previous stage's activation; a backward (B or I) needs its own forward
// or recompute and the next stage's gradient; W needs its I; a copy needs what it sends.
void add_dependencies(EventEngine& engine, int stages, const CellTasks& c) {
  for (int s = 0; s < stages; ++s) {
    for (int i = 0; i < c.micro_batches; ++i) {
      const std::size_t k = c.cell(s, i);
      if (s > 0) {
        const int producer = c.send_activation[c.cell(s - 1, i)];
        engine.add_dependency(producer >= 0 ? producer : c.forward[c.cell(s - 1, i)], c.forward[k]);
      }
      if (c.recompute[k] >= 0) engine.add_dependency(c.forward[k], c.recompute[k]);
      if (c.send_activation[k] >= 0) engine.add_dependency(c.forward[k], c.send_activation[k]);
      engine.add_dependency(c.recompute[k] >= 0 ? c.recompute[k] : c.forward[k], c.backward[k]);
      if (s + 1 < stages) {
        const int producer = c.send_gradient[c.cell(s + 1, i)];
        engine.add_dependency(producer >= 0 ? producer : c.backward[c.cell(s + 1, i)],
                              c.backward[k]);
      }
      if (c.weight[k] >= 0) engine.add_dependency(c.backward[k], c.weight[k]);
      if (c.send_gradient[k] >= 0) engine.add_dependency(c.backward[k], c.send_gradient[k]);
    }
  }
}

// Each device's receives in its programme's order, per sender: a forward takes the previous
// stage's activation, a B or I the next stage's gradient.
void link_receives(TaskGraph& g, const Programs& programs, const CellTasks& c) {
  const int devices = static_cast<int>(programs.size());
  const int stages = g.schedule.stages;
  g.next_receive.assign(g.tasks.size(), -1);
  g.first_receives.clear();
  for (int d = 0; d < devices; ++d) {
    std::vector<int> last(devices, -1);
    for (const Action& a : programs[d]) {
      const int s = a.stage, i = a.micro_batch;
      int copy = -1;
      if (a.kind == ActionKind::Forward && s > 0) copy = c.send_activation[c.cell(s - 1, i)];
      if (sends_gradient(a.kind) && s + 1 < stages) copy = c.send_gradient[c.cell(s + 1, i)];
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

}  // namespace

void build_task_graph(TaskGraph& g, const Schedule& schedule, const std::vector<int>& device_of,
                      int devices) {
  g.schedule = schedule;
  const Programs programs = device_programs(g.schedule, device_of, devices);
  mark_first_backwards(g);
  g.split = micro_batches_with(g.schedule, ActionKind::InputGrad);

  EventEngine& engine = g.engine;
  engine.clear();
  const std::size_t cells = static_cast<std::size_t>(schedule.stages) * schedule.micro_batches;
  engine.reserve(6 * cells);
  g.tasks.clear();
  g.tasks.reserve(6 * cells);
  g.counter.resize(devices);
  std::vector<int> compute(devices);
  for (int d = 0; d < devices; ++d) {
    g.counter[d] = engine.add_counter(0);
    compute[d] = engine.add_resource();
  }
  CellTasks tasks(schedule.stages, schedule.micro_batches);
  add_compute_tasks(g, programs, compute, tasks);
  add_copy_tasks(g, programs, device_of, tasks);
  add_dependencies(engine, schedule.stages, tasks);
  link_receives(g, programs, tasks);
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
