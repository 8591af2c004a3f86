#include "sim/simulator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "sim/memory_model.hpp"

namespace pipetune {

std::string_view to_string(TaskKind kind) {
  switch (kind) {
    case TaskKind::Forward:
      return "forward";
    case TaskKind::Recompute:
      return "recompute";
    case TaskKind::Backward:
      return "backward";
    case TaskKind::SendActivation:
      return "send_activation";
    case TaskKind::SendGradient:
      return "send_gradient";
  }
  return "?";
}

bool is_compute(TaskKind kind) {
  return kind == TaskKind::Forward || kind == TaskKind::Recompute || kind == TaskKind::Backward;
}

std::string SimTask::label() const {
  switch (kind) {
    case TaskKind::Forward:
      return to_string(Action{ActionKind::Forward, stage, micro_batch});
    case TaskKind::Recompute:
      return to_string(Action{ActionKind::Recompute, stage, micro_batch});
    case TaskKind::Backward:
      return to_string(Action{ActionKind::Backward, stage, micro_batch});
    case TaskKind::SendActivation:
      return fmt::format("{}>{} act {}", stage, stage + 1, micro_batch);
    case TaskKind::SendGradient:
      return fmt::format("{}>{} grad {}", stage, stage - 1, micro_batch);
  }
  return "?";
}

bool SimulationResult::fits() const {
  return std::all_of(devices.begin(), devices.end(), [](const DeviceReport& d) { return d.fits(); });
}

std::int64_t SimulationResult::max_peak_memory_bytes() const {
  std::int64_t peak = 0;
  for (const auto& d : devices) peak = std::max(peak, d.peak_memory_bytes);
  return peak;
}

Simulator::Simulator(const Profile& profile, const Hardware& hardware)
    : profile_(profile), hardware_(hardware), costs_(profile) {}

namespace {

// A stage's costs at one micro-batch size.
struct StageCost {
  double forward_ms = 0.0;
  double backward_ms = 0.0;
  StageMemory memory;
};

}  // namespace

SimulationResult Simulator::run(const Plan& plan, const SimulationOptions& options) const {
  const int stages = plan.stages();
  const int devices = static_cast<int>(hardware_.devices.size());
  const std::vector<int> device_of = stage_devices(plan, hardware_);
  const std::vector<std::int64_t> sizes = split_batch(profile_.batch_size, plan.chunks);
  const int micro_batches = static_cast<int>(sizes.size());
  const Schedule schedule = make_schedule(plan.schedule, stages, micro_batches, plan.checkpoint);
  const auto programs = device_programs(schedule, device_of, devices);

  // Layers [first[s], first[s+1]) form stage s.
  std::vector<int> first(stages + 1, 0);
  for (int s = 0; s < stages; ++s) first[s + 1] = first[s] + plan.balance[s];

  // tensor.chunk gives at most two distinct sizes: the common one and a smaller last one.
  auto size_slot = [&](int micro_batch) { return sizes[micro_batch] == sizes[0] ? 0 : 1; };
  std::vector<std::array<StageCost, 2>> cost(stages);
  for (int s = 0; s < stages; ++s) {
    const double speed = hardware_.devices[device_of[s]].speed;
    for (int slot = 0; slot < 2; ++slot) {
      const std::int64_t size = slot == 0 ? sizes.front() : sizes.back();
      const SizeCosts& c = costs_.at(size);
      cost[s][slot].forward_ms =
          c.forward_ms_sum(first[s], first[s + 1]) / speed + hardware_.launch_overhead_ms;
      cost[s][slot].backward_ms =
          c.backward_ms_sum(first[s], first[s + 1]) / speed + hardware_.launch_overhead_ms;
      cost[s][slot].memory = stage_memory(costs_, c, first[s], first[s + 1], s == 0);
    }
  }
  auto at = [&](int s, int i) -> const StageCost& { return cost[s][size_slot(i)]; };
  auto mem = [&](int s, int i) -> const StageMemory& { return at(s, i).memory; };
  auto recomputed = [&](int i) { return schedule.recomputes(i); };

  // The first backward of each stage allocates its parameter gradients.
  std::vector<int> first_backward(stages, -1);
  for (int s = 0; s < stages; ++s) {
    for (const Action& a : schedule.per_stage[s]) {
      if (a.kind == ActionKind::Backward) {
        first_backward[s] = a.micro_batch;
        break;
      }
    }
  }

  EventEngine engine;
  const std::size_t cells = static_cast<std::size_t>(stages) * micro_batches;
  engine.reserve(5 * cells, 8 * cells);

  // Memory that lives through the whole iteration: parameters, optimizer state, the batch.
  std::vector<std::int64_t> baseline(devices, 0);
  for (int s = 0; s < stages; ++s) {
    const double params = static_cast<double>(costs_.param_bytes(first[s], first[s + 1]));
    baseline[device_of[s]] += std::llround(params * (1.0 + plan.optimizer_state_factor));
  }
  baseline[device_of[0]] += costs_.at(profile_.batch_size).input_bytes;
  std::vector<int> counter(devices), compute(devices);
  for (int d = 0; d < devices; ++d) {
    counter[d] = engine.add_counter(baseline[d]);
    compute[d] = engine.add_resource();
  }
  std::vector<int> channel(static_cast<std::size_t>(devices) * devices, -1);
  auto channel_between = [&](int from, int to) {
    int& r = channel[static_cast<std::size_t>(from) * devices + to];
    if (r < 0) r = engine.add_resource();
    return r;
  };

  auto cell = [&](int s, int i) { return static_cast<std::size_t>(s) * micro_batches + i; };
  std::vector<int> forward(cells, -1), recompute(cells, -1), backward(cells, -1);
  std::vector<int> send_activation(cells, -1), send_gradient(cells, -1);
  std::vector<SimTask> records;
  records.reserve(5 * cells);

  // Compute tasks in each device's programme order.
  for (int d = 0; d < devices; ++d) {
    for (const Action& a : programs[d]) {
      const StageCost& c = at(a.stage, a.micro_batch);
      const double duration = a.kind == ActionKind::Backward ? c.backward_ms : c.forward_ms;
      const int id = engine.add_task(compute[d], duration);
      const std::size_t k = cell(a.stage, a.micro_batch);
      TaskKind kind = TaskKind::Forward;
      if (a.kind == ActionKind::Forward) forward[k] = id;
      if (a.kind == ActionKind::Recompute) recompute[k] = id, kind = TaskKind::Recompute;
      if (a.kind == ActionKind::Backward) backward[k] = id, kind = TaskKind::Backward;
      records.push_back({kind, a.stage, a.micro_batch, d, -1, 0.0, 0.0, 0});
    }
  }
  // Copies, queued on each channel in the order their producers run on the sending device.
  for (int d = 0; d < devices; ++d) {
    for (const Action& a : programs[d]) {
      const int s = a.stage, i = a.micro_batch;
      if (a.kind == ActionKind::Forward && s + 1 < stages && device_of[s + 1] != d) {
        const int to = device_of[s + 1];
        const std::int64_t bytes = mem(s, i).output_bytes;
        send_activation[cell(s, i)] = engine.add_task(
            channel_between(d, to),
            hardware_.link_between(d, to).transfer_ms(static_cast<double>(bytes)));
        records.push_back({TaskKind::SendActivation, s, i, d, to, 0.0, 0.0, bytes});
      }
      if (a.kind == ActionKind::Backward && s > 0 && device_of[s - 1] != d) {
        const int to = device_of[s - 1];
        const std::int64_t bytes = mem(s, i).input_bytes;
        send_gradient[cell(s, i)] = engine.add_task(
            channel_between(d, to),
            hardware_.link_between(d, to).transfer_ms(static_cast<double>(bytes)));
        records.push_back({TaskKind::SendGradient, s, i, d, to, 0.0, 0.0, bytes});
      }
    }
  }

  // Dependencies and memory, micro-batch by micro-batch (docs/memory-model.md).
  for (int s = 0; s < stages; ++s) {
    const int d = device_of[s];
    for (int i = 0; i < micro_batches; ++i) {
      const std::size_t k = cell(s, i);
      const StageMemory& m = mem(s, i);
      const bool last_stage = s + 1 == stages;

      // Forward: needs this micro-batch's activation from the previous stage.
      if (s > 0) {
        const int producer = send_activation[cell(s - 1, i)];
        engine.add_dependency(producer >= 0 ? producer : forward[cell(s - 1, i)], forward[k]);
      }
      if (recomputed(i)) {
        // No autograd: only the output survives, and the last stage drops it with the loss.
        engine.set_start_effect(forward[k], counter[d], m.output_bytes + m.checkpointed_forward_transient);
        engine.set_end_effect(forward[k], counter[d],
                              m.checkpointed_forward_transient + (last_stage ? m.output_bytes : 0));
        engine.add_dependency(forward[k], recompute[k]);
        engine.set_start_effect(recompute[k], counter[d], m.kept_bytes + m.forward_transient);
        engine.set_end_effect(recompute[k], counter[d], m.forward_transient);
      } else {
        engine.set_start_effect(forward[k], counter[d], m.kept_bytes + m.forward_transient);
        engine.set_end_effect(forward[k], counter[d], m.forward_transient);
      }

      // Activation copy: the receiver allocates at once; a checkpointed sender frees its output
      // once the copy is done.
      if (const int copy = send_activation[k]; copy >= 0) {
        engine.add_dependency(forward[k], copy);
        engine.set_start_effect(copy, counter[device_of[s + 1]], m.output_bytes);
        if (recomputed(i)) engine.set_end_effect(copy, counter[d], m.output_bytes);
      }

      // Backward: needs the recomputed (or kept) activations and the gradient from downstream.
      engine.add_dependency(recomputed(i) ? recompute[k] : forward[k], backward[k]);
      if (!last_stage) {
        const int producer = send_gradient[cell(s + 1, i)];
        engine.add_dependency(producer >= 0 ? producer : backward[cell(s + 1, i)], backward[k]);
      }
      const bool first_time = i == first_backward[s];
      const std::int64_t peak = first_time ? m.backward_peak_first : m.backward_peak;
      const std::int64_t net = first_time ? m.backward_net_first : m.backward_net;
      // A stage input that is its own buffer (received from another device, or left behind by
      // a checkpointed stage on this device) dies with the backward; otherwise it is the
      // previous stage's output, which that stage frees.
      const bool own_input = s > 0 && (device_of[s - 1] != d || recomputed(i));
      const std::int64_t freed = (peak - net) + m.output_bytes +
                                 (last_stage ? 0 : m.output_bytes) +
                                 (own_input ? m.input_bytes : 0);
      engine.set_start_effect(backward[k], counter[d], peak);
      engine.set_end_effect(backward[k], counter[d], freed);

      // Gradient copy: the receiver allocates at once, the sender frees when it is done.
      if (const int copy = send_gradient[k]; copy >= 0) {
        engine.add_dependency(backward[k], copy);
        engine.set_start_effect(copy, counter[device_of[s - 1]], m.input_bytes);
        engine.set_end_effect(copy, counter[d], m.input_bytes);
      }
    }
  }

  engine.run(options.record_memory);

  SimulationResult result;
  result.plan = plan;
  result.micro_batch_sizes = sizes;
  result.iteration_ms = engine.makespan();
  result.throughput_samples_per_s =
      result.iteration_ms > 0 ? static_cast<double>(profile_.batch_size) / (result.iteration_ms / 1e3)
                              : 0.0;

  std::vector<double> busy(devices, 0.0);
  for (std::size_t id = 0; id < records.size(); ++id) {
    auto& r = records[id];
    r.start_ms = engine.start(static_cast<int>(id));
    r.end_ms = engine.finish(static_cast<int>(id));
    if (is_compute(r.kind)) busy[r.device] += r.end_ms - r.start_ms;
  }
  double busy_total = 0.0;
  for (int d = 0; d < devices; ++d) {
    DeviceReport report;
    for (int s = 0; s < stages; ++s) {
      if (device_of[s] == d) report.stages.push_back(s);
    }
    if (report.stages.empty()) continue;
    report.name = hardware_.devices[d].name;
    report.index = d;
    report.busy_ms = busy[d];
    report.peak_memory_bytes = engine.peak(counter[d]);
    report.peak_time_ms = engine.peak_time(counter[d]);
    report.memory_capacity_bytes = hardware_.devices[d].memory_bytes;
    if (options.record_memory) report.memory = engine.history(counter[d]);
    busy_total += busy[d];
    result.devices.push_back(std::move(report));
  }
  const double capacity = result.iteration_ms * static_cast<double>(result.devices.size());
  result.bubble_fraction = capacity > 0 ? 1.0 - busy_total / capacity : 0.0;
  if (options.record_edges) result.edges = engine.edges();
  if (options.record_tasks) result.tasks = std::move(records);
  return result;
}

}  // namespace pipetune
