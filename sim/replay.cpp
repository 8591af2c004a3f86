#include "sim/replay.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "sim/error.hpp"
#include "sim/task_graph.hpp"

namespace pipetune {

double replay_on_cpu_ms(const Trace& measured, const std::string& source) {
  Trace on_cpu = measured;
  bool any = false;
  for (TraceTask& t : on_cpu.tasks) {
    if (t.cpu_ms < 0) continue;
    any = true;
    // Two clocks: a task's CPU time can come out a hair above its wall time.
    t.end_ms = t.start_ms + std::min(t.cpu_ms, t.duration_ms());
  }
  return any ? replay_trace(on_cpu, source).iteration_ms : -1.0;
}

ReplayResult replay_trace(const Trace& measured, const std::string& source) {
  if (!measured.plan)
    throw InputError(source + ": pipetune.plan: the trace names no plan to replay");
  const Plan& plan = *measured.plan;
  const int stages = plan.stages();
  std::vector<int> device_of(stages, -1);
  for (std::size_t d = 0; d < measured.devices.size(); ++d) {
    for (int s : measured.devices[d].stages) {
      if (s < 0 || s >= stages)
        throw InputError(fmt::format("{}: summary.devices[{}].stages: stage {} is not in the plan",
                                     source, d, s));
      device_of[s] = static_cast<int>(d);
    }
  }
  for (int s = 0; s < stages; ++s) {
    if (device_of[s] < 0) throw InputError(fmt::format("{}: no device holds stage {}", source, s));
  }
  std::int64_t batch = 0;
  for (std::int64_t size : measured.micro_batch_sizes) batch += size;

  const StepTasks step = only_step(measured, source);

  TaskGraph graph;
  build_task_graph(graph, schedule_of(plan, batch), device_of,
                   static_cast<int>(measured.devices.size()));
  for (std::size_t id = 0; id < graph.tasks.size(); ++id) {
    const SimTask& t = graph.tasks[id];
    const int found = step.find(TaskKey::of(t));
    if (found < 0) {
      throw InputError(fmt::format("{}: the trace has no {} task, which the plan's programme runs",
                                   source, t.label()));
    }
    graph.engine.set_duration(static_cast<int>(id),
                              measured.tasks[step.indices()[found]].duration_ms());
  }
  graph.engine.run(false);
  ReplayResult result;
  result.iteration_ms = graph.engine.makespan();
  result.tasks = graph.tasks.size();
  result.timeline.plan = plan;
  result.timeline.iteration_ms = result.iteration_ms;
  result.timeline.task_count = graph.tasks.size();
  result.timeline.tasks = graph.tasks;
  for (std::size_t id = 0; id < graph.tasks.size(); ++id) {
    result.timeline.tasks[id].start_ms = graph.engine.start(static_cast<int>(id));
    result.timeline.tasks[id].end_ms = graph.engine.finish(static_cast<int>(id));
  }
  result.timeline.edges = graph.engine.edges();
  return result;
}

}  // namespace pipetune
