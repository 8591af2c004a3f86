#include <algorithm>

#include "executor/executor.hpp"

namespace pipetune::exec {

Trace measured_trace(const Pipeline& pipeline, const StepRecord& step, const std::string& model,
                     const std::vector<std::int64_t>& capacity_bytes) {
  Trace trace;
  trace.kind = "measured";
  trace.model = model;
  trace.plan = pipeline.plan();
  trace.micro_batch_sizes = pipeline.micro_batch_sizes();
  // Align at the iteration's start, as predictions start at 0.
  const double origin = task_span(step.tasks).start_ms;

  const auto& names = pipeline.device_names();
  const auto& device_of = pipeline.stage_device();
  trace.devices.resize(names.size());
  for (std::size_t d = 0; d < names.size(); ++d) {
    TraceDevice& device = trace.devices[d];
    device.name = names[d];
    for (std::size_t s = 0; s < device_of.size(); ++s) {
      if (device_of[s] == static_cast<int>(d)) device.stages.push_back(static_cast<int>(s));
    }
    if (d < step.peak_memory_bytes.size()) device.peak_memory_bytes = step.peak_memory_bytes[d];
    if (d < capacity_bytes.size()) device.memory_capacity_bytes = capacity_bytes[d];
    if (d < step.memory.size()) {
      for (const auto& sample : step.memory[d]) {
        device.memory.push_back({std::max(0.0, sample.time - origin), sample.value});
      }
    }
  }
  double busy_total = 0.0;
  for (TraceTask t : step.tasks) {
    t.start_ms -= origin;
    t.end_ms -= origin;
    t.step = 0;
    if (is_compute(t.kind)) {
      trace.devices[t.device].busy_ms += t.duration_ms();
      busy_total += t.duration_ms();
    }
    trace.tasks.push_back(t);
  }
  std::stable_sort(trace.tasks.begin(), trace.tasks.end(),
                   [](const TraceTask& a, const TraceTask& b) {
                     return std::tie(a.device, a.start_ms) < std::tie(b.device, b.start_ms);
                   });
  trace.iteration_ms = step.pipeline_ms;
  std::int64_t samples = 0;
  for (auto size : pipeline.micro_batch_sizes()) samples += size;
  trace.throughput_samples_per_s = step.pipeline_ms > 0 ? samples / (step.pipeline_ms / 1e3) : 0.0;
  const double capacity = step.pipeline_ms * static_cast<double>(names.size());
  trace.bubble_fraction = capacity > 0 ? 1.0 - busy_total / capacity : 0.0;
  return trace;
}

}  // namespace pipetune::exec
