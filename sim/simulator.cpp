#include "sim/simulator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "sim/error.hpp"
#include "sim/memory_model.hpp"
#include "sim/task_graph.hpp"

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
    case TaskKind::InputGrad:
      return "backward_input";
    case TaskKind::WeightGrad:
      return "backward_weight";
  }
  return "?";
}

bool is_compute(TaskKind kind) {
  return kind != TaskKind::SendActivation && kind != TaskKind::SendGradient;
}

std::string SimTask::label() const { return task_label(kind, stage, micro_batch); }

std::string task_label(TaskKind kind, int stage, int micro_batch) {
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
    case TaskKind::InputGrad:
      return to_string(Action{ActionKind::InputGrad, stage, micro_batch});
    case TaskKind::WeightGrad:
      return to_string(Action{ActionKind::WeightGrad, stage, micro_batch});
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
    : profile_(profile), hardware_(hardware), costs_(profile) {
  const int devices = static_cast<int>(hardware.devices.size());
  links_.resize(static_cast<std::size_t>(devices) * devices);
  for (int from = 0; from < devices; ++from) {
    for (int to = 0; to < devices; ++to) {
      links_[from * devices + to] =
          hardware.calibration.copy ? &*hardware.calibration.copy : &hardware.link_between(from, to);
    }
  }
  graph_.graph = std::make_unique<TaskGraph>();
}

Simulator::~Simulator() = default;

namespace {

// A stage's costs at one micro-batch size.
struct StageCost {
  double forward_ms = 0.0;
  double forward_nograd_ms = 0.0;  ///< a checkpointed micro-batch's forward
  double backward_ms = 0.0;
  double backward_input_ms = 0.0;   ///< I
  double backward_weight_ms = 0.0;  ///< W
  StageMemory memory;
};

}  // namespace

Simulator::Graph& Simulator::graph_for(const Plan& plan, const std::vector<int>& device_of,
                                       int micro_batches) const {
  Graph& g = graph_;
  if (g.valid && !g.given && g.kind == plan.schedule && g.checkpoint == plan.checkpoint &&
      g.micro_batches == micro_batches && g.stages_per_device == plan.stages_per_device &&
      g.device_of == device_of) {
    return g;
  }
  g.valid = false;
  g.given = false;
  g.kind = plan.schedule;
  g.checkpoint = plan.checkpoint;
  g.micro_batches = micro_batches;
  g.stages_per_device = plan.stages_per_device;
  g.device_of = device_of;
  build_task_graph(*g.graph,
                   make_schedule(plan.schedule, plan.stages(), micro_batches, plan.checkpoint,
                                 plan.stages_per_device),
                   device_of, static_cast<int>(hardware_.devices.size()));
  g.valid = true;
  return g;
}

Simulator::Graph& Simulator::graph_for(const Schedule& schedule,
                                       const std::vector<int>& device_of) const {
  Graph& g = graph_;
  if (g.valid && g.given && g.device_of == device_of && g.graph->schedule == schedule) return g;
  g.valid = false;
  g.given = true;
  g.device_of = device_of;
  build_task_graph(*g.graph, schedule, device_of, static_cast<int>(hardware_.devices.size()));
  g.valid = true;
  return g;
}

SimulationResult Simulator::run(const Plan& plan, const SimulationOptions& options) const {
  const std::vector<int> device_of = stage_devices(plan, hardware_);
  const auto micro_batches = static_cast<int>(split_batch(profile_.batch_size, plan.chunks).size());
  graph_for(plan, device_of, micro_batches);
  return simulate(plan, device_of, options);
}

SimulationResult Simulator::run(const Plan& plan, const Schedule& schedule,
                                const SimulationOptions& options) const {
  const auto micro_batches = static_cast<int>(split_batch(profile_.batch_size, plan.chunks).size());
  if (schedule.stages != plan.stages() || schedule.micro_batches != micro_batches) {
    throw InputError(fmt::format(
        "the schedule has {} stages and {} micro-batches; the plan has {} stages and {} "
        "micro-batches (chunks {} of a batch of {})",
        schedule.stages, schedule.micro_batches, plan.stages(), micro_batches, plan.chunks,
        profile_.batch_size));
  }
  const int devices = static_cast<int>(hardware_.devices.size());
  std::vector<int> device_of = schedule.stage_rank;
  if (!plan.devices.empty()) {
    device_of = stage_devices(plan, hardware_);
  } else if (schedule.ranks() > devices) {
    throw InputError(fmt::format("the schedule has {} programmes (rows); the hardware has {} "
                                 "device{}",
                                 schedule.ranks(), devices, devices == 1 ? "" : "s"));
  }
  graph_for(schedule, device_of);
  return simulate(plan, device_of, options);
}

SimulationResult Simulator::simulate(const Plan& plan, const std::vector<int>& device_of,
                                     const SimulationOptions& options) const {
  const int stages = plan.stages();
  const int devices = static_cast<int>(hardware_.devices.size());
  const std::vector<std::int64_t> sizes = split_batch(profile_.batch_size, plan.chunks);
  const int micro_batches = static_cast<int>(sizes.size());
  TaskGraph& graph = *graph_.graph;
  EventEngine& engine = graph.engine;

  // Layers [first[s], first[s+1]) form stage s.
  std::vector<int> first(stages + 1, 0);
  for (int s = 0; s < stages; ++s) first[s + 1] = first[s] + plan.balance[s];

  // tensor.chunk gives at most two distinct sizes: the common one and a smaller last one.
  std::vector<std::uint8_t> slot_of(micro_batches), recomputed(micro_batches);
  for (int i = 0; i < micro_batches; ++i) {
    slot_of[i] = sizes[i] == sizes[0] ? 0 : 1;
    recomputed[i] = graph.schedule.recomputes(i) ? 1 : 0;
  }
  // A calibration (empty: scale 1, no overhead) scales compute by how many devices are busy.
  const Calibration& calibration = hardware_.calibration;
  int busy_devices = 0;
  {
    std::vector<std::uint8_t> seen(devices, 0);
    for (int d : device_of) busy_devices += seen[d]++ == 0 ? 1 : 0;
  }
  const double time_scale = calibration.scale_for(busy_devices);
  const double overhead_ms = hardware_.launch_overhead_ms + calibration.task_overhead_ms;
  std::vector<std::array<StageCost, 2>> cost(stages);
  for (int s = 0; s < stages; ++s) {
    const double speed = hardware_.devices[device_of[s]].speed / time_scale;
    for (int slot = 0; slot < 2; ++slot) {
      const std::int64_t size = slot == 0 ? sizes.front() : sizes.back();
      const SizeCosts& c = costs_.at(size);
      cost[s][slot].forward_ms =
          c.forward_ms_sum(first[s], first[s + 1]) / speed + overhead_ms;
      cost[s][slot].forward_nograd_ms = c.forward_nograd_ms_sum(first[s], first[s + 1]) / speed + overhead_ms;
      cost[s][slot].backward_ms =
          c.backward_ms_sum(first[s], first[s + 1]) / speed + overhead_ms;
      cost[s][slot].backward_input_ms =
          c.backward_input_ms_sum(first[s], first[s + 1]) / speed + overhead_ms;
      cost[s][slot].backward_weight_ms =
          c.backward_weight_ms_sum(first[s], first[s + 1]) / speed + overhead_ms;
      cost[s][slot].memory = stage_memory(costs_, c, first[s], first[s + 1], s == 0);
    }
  }

  // Memory that lives through the whole iteration: parameters, optimizer state, the batch.
  std::vector<std::int64_t> baseline(devices, 0);
  for (int s = 0; s < stages; ++s) {
    const double params = static_cast<double>(costs_.param_bytes(first[s], first[s + 1]));
    baseline[device_of[s]] += std::llround(params * (1.0 + plan.optimizer_state_factor));
  }
  baseline[device_of[0]] += costs_.at(profile_.batch_size).input_bytes;
  for (int d = 0; d < devices; ++d) engine.set_counter_initial(graph.counter[d], baseline[d]);

  // Durations and memory effects, task by task (docs/memory-model.md).
  std::vector<double> busy(devices, 0.0);
  const auto& counter = graph.counter;
  for (std::size_t id = 0; id < graph.tasks.size(); ++id) {
    SimTask& t = graph.tasks[id];
    const int task = static_cast<int>(id);
    const int s = t.stage, i = t.micro_batch, d = t.device;
    const StageCost& c = cost[s][slot_of[i]];
    const StageMemory& m = c.memory;
    const bool last_stage = s + 1 == stages;
    const bool first_time = i == graph.first_backward[s];
    // A stage input that is its own buffer (received from another device, or left behind by a
    // checkpointed stage on this device) dies with the backward; otherwise it is the previous
    // stage's output, which that stage frees. The stage output and the received gradient die
    // with it too; the last stage has neither (its output died with the forward).
    const bool own_input = s > 0 && (device_of[s - 1] != d || recomputed[i]);
    const std::int64_t dies_with_backward =
        (last_stage ? 0 : 2 * m.output_bytes) + (own_input ? m.input_bytes : 0);
    switch (t.kind) {
      case TaskKind::Forward:
        engine.set_duration(task, recomputed[i] ? c.forward_nograd_ms : c.forward_ms);
        busy[d] += recomputed[i] ? c.forward_nograd_ms : c.forward_ms;
        if (recomputed[i]) {
          // No autograd: only the output survives; the last stage drops it with the loss.
          engine.set_start_effect(task, counter[d], m.output_bytes + m.checkpointed_forward_transient);
          engine.set_end_effect(task, counter[d],
                                m.checkpointed_forward_transient + (last_stage ? m.output_bytes : 0));
        } else {
          engine.set_start_effect(task, counter[d], m.kept_bytes + m.forward_transient);
          engine.set_end_effect(task, counter[d], m.forward_transient);
        }
        break;
      case TaskKind::Recompute:
        engine.set_duration(task, c.forward_ms);
        busy[d] += c.forward_ms;
        engine.set_start_effect(task, counter[d], m.kept_bytes + m.forward_transient);
        engine.set_end_effect(task, counter[d], m.forward_transient);
        break;
      case TaskKind::Backward: {
        engine.set_duration(task, c.backward_ms);
        busy[d] += c.backward_ms;
        const std::int64_t peak = first_time ? m.backward_peak_first : m.backward_peak;
        const std::int64_t net = first_time ? m.backward_net_first : m.backward_net;
        engine.set_start_effect(task, counter[d], peak);
        engine.set_end_effect(task, counter[d], (peak - net) + dies_with_backward);
        break;
      }
      case TaskKind::InputGrad:
        // The graph stays: I leaves its input gradient and the gradients W reads.
        engine.set_duration(task, c.backward_input_ms);
        busy[d] += c.backward_input_ms;
        engine.set_start_effect(task, counter[d], m.input_backward_peak);
        engine.set_end_effect(task, counter[d], m.input_backward_peak - m.input_backward_net);
        break;
      case TaskKind::WeightGrad: {
        // The parameter gradients (kept the first time, added into .grad later), then the
        // graph's activations, the gradients I kept and what dies with any backward.
        engine.set_duration(task, c.backward_weight_ms);
        busy[d] += c.backward_weight_ms;
        const std::int64_t params = costs_.param_bytes(first[s], first[s + 1]);
        engine.set_start_effect(task, counter[d], params);
        engine.set_end_effect(task, counter[d],
                              (first_time ? 0 : params) + m.weight_kept_gradients + m.kept_bytes -
                                  (last_stage ? 0 : m.output_bytes) + dies_with_backward);
        break;
      }
      case TaskKind::SendActivation:
        // The receiver allocates at once; a checkpointed sender frees its output when done.
        t.bytes = m.output_bytes;
        engine.set_duration(task, links_[d * devices + t.peer]->transfer_ms(static_cast<double>(t.bytes)));
        engine.set_start_effect(task, counter[t.peer], t.bytes);
        engine.set_end_effect(task, counter[d], recomputed[i] ? t.bytes : 0);
        break;
      case TaskKind::SendGradient:
        // The receiver allocates at once, the sender frees when it is done.
        t.bytes = m.input_bytes;
        engine.set_duration(task, links_[d * devices + t.peer]->transfer_ms(static_cast<double>(t.bytes)));
        engine.set_start_effect(task, counter[t.peer], t.bytes);
        engine.set_end_effect(task, counter[d], t.bytes);
        break;
    }
  }

  engine.run(options.record_memory);

  SimulationResult result;
  result.plan = plan;
  result.micro_batch_sizes = sizes;
  result.iteration_ms = engine.makespan();
  result.task_count = engine.task_count();
  result.throughput_samples_per_s =
      result.iteration_ms > 0 ? static_cast<double>(profile_.batch_size) / (result.iteration_ms / 1e3)
                              : 0.0;
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
  if (options.record_tasks || options.record_edges) {
    result.tasks = graph.tasks;
    for (std::size_t id = 0; id < result.tasks.size(); ++id) {
      result.tasks[id].start_ms = engine.start(static_cast<int>(id));
      result.tasks[id].end_ms = engine.finish(static_cast<int>(id));
    }
  }
  if (options.record_edges) result.edges = engine.edges();
  return result;
}

}  // namespace pipetune
