#include "sim/simulator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>

#include "sim/after_idle.hpp"
#include "sim/cache_model.hpp"
#include "sim/corun.hpp"
#include "sim/error.hpp"
#include "sim/memory_model.hpp"
#include "sim/order_peak.hpp"
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

std::string SimTask::label() const {
  return task_label(kind, stage, micro_batch);
}

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
  return std::all_of(devices.begin(), devices.end(),
                     [](const DeviceReport& d) { return d.fits(); });
}

std::int64_t SimulationResult::max_peak_memory_bytes() const {
  std::int64_t peak = 0;
  for (const auto& d : devices) peak = std::max(peak, d.peak_memory_bytes);
  return peak;
}

// StageMemory by (micro-batch size's costs, first layer, end, first stage): a pure function of
// those and the cost model the simulator holds. Cleared when full: a search walks a
// neighbourhood of plans at a time.
struct Simulator::StageMemoryCache {
  static constexpr std::size_t kMostEntries = 1 << 15;
  using Key = std::tuple<const SizeCosts*, int, int, bool>;
  struct Hash {
    std::size_t operator()(const Key& k) const {
      const auto [c, first, end, first_stage] = k;
      std::size_t h = std::hash<const void*>()(c);
      h = h * 0x9E3779B97F4A7C15ULL + static_cast<std::size_t>(first);
      h = h * 0x9E3779B97F4A7C15ULL + static_cast<std::size_t>(end);
      return h * 2 + (first_stage ? 1 : 0);
    }
  };
  std::unordered_map<Key, StageMemory, Hash> entries;
  std::uint64_t walked = 0;  // layers walked (not found here)
  const StageMemory& of(const CostModel& costs, const SizeCosts& c, int first, int end,
                        bool first_stage) {
    const Key key{&c, first, end, first_stage};
    if (auto it = entries.find(key); it != entries.end()) return it->second;
    if (entries.size() >= kMostEntries) entries.clear();
    walked += static_cast<std::uint64_t>(end - first);
    return entries.emplace(key, stage_memory(costs, c, first, end, first_stage)).first->second;
  }
};

Simulator::Simulator(const Profile& profile, const Hardware& hardware)
    : profile_(profile),
      hardware_(hardware),
      costs_(profile),
      stage_memory_(std::make_unique<StageMemoryCache>()) {
  shared_gpu_ = shared_gpus(hardware);
  device_memory_ = device_memories(hardware);
  const int devices = static_cast<int>(hardware.devices.size());
  links_.resize(static_cast<std::size_t>(devices) * devices);
  for (int from = 0; from < devices; ++from) {
    for (int to = 0; to < devices; ++to) {
      links_[from * devices + to] = &hardware.copy_link(from, to);
    }
  }
  graph_.graph = std::make_unique<TaskGraph>();
}

Simulator::~Simulator() = default;

std::uint64_t Simulator::memory_walk_layers() const {
  return stage_memory_->walked;
}

namespace {

// A stage's compute times at one micro-batch size, alone or beside co-runners.
struct StageTimes {
  double forward_ms = 0.0;
  double forward_nograd_ms = 0.0;  ///< a checkpointed micro-batch's forward
  double backward_ms = 0.0;
  double backward_input_ms = 0.0;   ///< I
  double backward_weight_ms = 0.0;  ///< W
};

// A stage's costs at one micro-batch size.
struct StageCost {
  StageTimes solo;
  StageTimes corun;  ///< beside the profile's co-runners; solo without co-run times
  StageTimes host;   ///< the host's time to launch each task (all 0 without launch times)
  /// What each task takes longer with the cache emptied first (all 0 without cold times):
  /// sim/cache_model.hpp adds its share of it.
  StageTimes cold_extra;
  /// What the forward takes longer as its device's first task of a step, after the optimizer's
  /// sweep (0 without step-start times); the forward without autograd its share of it.
  StageTimes step_start_extra;
  std::int64_t gradient_bytes = 0;  ///< the parameter gradients W allocates
  StageMemory memory;
};

// By stage, a StageCost for each of the micro-batches' two sizes (PlanShape::slot_of).
using StageCosts = std::vector<std::array<StageCost, 2>>;

// What a plan is made of, in the terms the task effects need.
struct PlanShape {
  int stages = 0, devices = 0;
  std::vector<int> device_of;            ///< per stage
  std::vector<int> first;                ///< layers [first[s], first[s+1]) form stage s
  std::vector<std::int64_t> sizes;       ///< per micro-batch
  std::vector<std::uint8_t> slot_of;     ///< per micro-batch: 0 the common size, 1 a smaller last
  std::vector<std::uint8_t> recomputed;  ///< per micro-batch
};

int busy_devices(const PlanShape& shape) {
  std::vector<std::uint8_t> seen(shape.devices, 0);
  int busy = 0;
  for (int d : shape.device_of) busy += seen[d]++ == 0 ? 1 : 0;
  return busy;
}

// A split backward whose I does no work (whole_backward_at_weight): I takes the action's overhead
// alone, W the whole backward, and the extras follow the whole backward's.
void put_whole_backward_at_weight(StageCost& cost, double overhead_ms) {
  const auto whole_at_weight = [](StageTimes& t, double input_ms) {
    t.backward_weight_ms = t.backward_ms;
    t.backward_input_ms = input_ms;
  };
  for (StageTimes* t : {&cost.solo, &cost.host, &cost.corun}) whole_at_weight(*t, overhead_ms);
  for (StageTimes* t : {&cost.cold_extra, &cost.step_start_extra}) whole_at_weight(*t, 0.0);
}

// Every stage's durations and memory at both micro-batch sizes. A calibration (empty: scale
// 1, no overhead) scales compute by how many devices are busy. The per-task overhead is paid
// by the device and by the host alike.
StageCosts stage_costs(const CostModel& costs, const Hardware& hardware, const PlanShape& shape,
                       double spread_z, const auto& memory_of) {
  const double time_scale = hardware.calibration.scale_for(busy_devices(shape));
  const double overhead_ms = hardware.launch_overhead_ms + hardware.calibration.task_overhead_ms;
  StageCosts cost(shape.stages);
  for (int s = 0; s < shape.stages; ++s) {
    const double speed = hardware.devices[shape.device_of[s]].speed / time_scale;
    const int a = shape.first[s], b = shape.first[s + 1];
    for (int slot = 0; slot < 2; ++slot) {
      const SizeCosts& c = costs.at(slot == 0 ? shape.sizes.front() : shape.sizes.back());
      // The same expressions as stage_durations(), so that the planner's sweep agrees exactly.
      StageTimes& solo = cost[s][slot].solo;
      solo.forward_ms = c.forward_ms_sum(a, b) / speed + overhead_ms;
      solo.forward_nograd_ms = c.forward_nograd_ms_sum(a, b) / speed + overhead_ms;
      solo.backward_ms = c.backward_ms_sum(a, b) / speed + overhead_ms;
      solo.backward_input_ms = c.backward_input_ms_sum(a, b) / speed + overhead_ms;
      solo.backward_weight_ms = c.backward_weight_ms_sum(a, b) / speed + overhead_ms;
      StageTimes& host = cost[s][slot].host;
      host.forward_ms = c.forward_launch_ms(a, b) + overhead_ms;
      host.forward_nograd_ms = c.forward_nograd_launch_ms(a, b) + overhead_ms;
      host.backward_ms = c.backward_launch_ms(a, b) + overhead_ms;
      host.backward_input_ms = c.backward_input_launch_ms(a, b) + overhead_ms;
      host.backward_weight_ms = c.backward_weight_launch_ms(a, b) + overhead_ms;
      // Only forward and backward are measured beside co-runners; the forward without autograd
      // and the backward's halves slow down by the same factor as the whole they are part of.
      const double forward = c.forward_ms_sum(a, b), backward = c.backward_ms_sum(a, b);
      const double forward_slowdown = forward > 0 ? c.forward_corun_ms_sum(a, b) / forward : 1.0;
      const double backward_slowdown =
          backward > 0 ? c.backward_corun_ms_sum(a, b) / backward : 1.0;
      StageTimes& corun = cost[s][slot].corun;
      corun.forward_ms = c.forward_corun_ms_sum(a, b) / speed + overhead_ms;
      corun.forward_nograd_ms =
          c.forward_nograd_ms_sum(a, b) * forward_slowdown / speed + overhead_ms;
      corun.backward_ms = c.backward_corun_ms_sum(a, b) / speed + overhead_ms;
      corun.backward_input_ms =
          c.backward_input_ms_sum(a, b) * backward_slowdown / speed + overhead_ms;
      corun.backward_weight_ms =
          c.backward_weight_ms_sum(a, b) * backward_slowdown / speed + overhead_ms;
      // Only forward and backward are timed cold; the forward without autograd and the
      // backward's halves take the share of their whole that their hot times have.
      StageTimes& cold = cost[s][slot].cold_extra;
      const double forward_extra = c.forward_cold_extra_ms(a, b) / speed;
      const double backward_extra = c.backward_cold_extra_ms(a, b) / speed;
      const double nograd = c.forward_nograd_ms_sum(a, b);
      const double input = c.backward_input_ms_sum(a, b), weight = c.backward_weight_ms_sum(a, b);
      // A forward's extra, and the forward without autograd's share of it.
      const auto set_forward_extra = [&](StageTimes& times, double extra) {
        times.forward_ms = extra;
        times.forward_nograd_ms = forward > 0 ? extra * std::min(1.0, nograd / forward) : 0.0;
      };
      set_forward_extra(cold, forward_extra);
      cold.backward_ms = backward_extra;
      cold.backward_input_ms = input + weight > 0 ? backward_extra * input / (input + weight) : 0.0;
      cold.backward_weight_ms =
          input + weight > 0 ? backward_extra * weight / (input + weight) : 0.0;
      set_forward_extra(cost[s][slot].step_start_extra,
                        c.forward_step_start_extra_ms(a, b) / speed);
      if (whole_backward_at_weight(hardware.runtime, s))
        put_whole_backward_at_weight(cost[s][slot], overhead_ms);
      // The spread's shift (SimulationOptions::spread_z): forwards by their layers' relative
      // spread, backwards (and their halves) by theirs. Exactly 1 at z = 0.
      if (spread_z != 0.0) {
        const double f = forward > 0 ? 1.0 + spread_z * c.forward_sigma_ms(a, b) / forward : 1.0;
        const double g = backward > 0 ? 1.0 + spread_z * c.backward_sigma_ms(a, b) / backward : 1.0;
        for (StageTimes* t : {&solo, &cold, &corun}) {
          t->forward_ms *= std::max(0.0, f);
          t->forward_nograd_ms *= std::max(0.0, f);
          t->backward_ms *= std::max(0.0, g);
          t->backward_input_ms *= std::max(0.0, g);
          t->backward_weight_ms *= std::max(0.0, g);
        }
      }
      cost[s][slot].gradient_bytes = costs.trained_bytes(a, b);
      cost[s][slot].memory = memory_of(c, a, b, s == 0);
    }
  }
  return cost;
}

// Memory that lives through the whole iteration: parameters, optimizer state, the batch, and
// the libraries' workspaces on every device that computes.
std::vector<std::int64_t> baseline_memory(const CostModel& costs, const Plan& plan,
                                          const PlanShape& shape) {
  std::vector<std::int64_t> baseline(shape.devices, 0);
  std::vector<std::uint8_t> computes(shape.devices, 0);
  for (int s = 0; s < shape.stages; ++s) {
    const int first = shape.first[s], end = shape.first[s + 1];
    baseline[shape.device_of[s]] += resident_bytes(
        costs.held_bytes(first, end), costs.trained_bytes(first, end), plan.optimizer_state_factor);
    computes[shape.device_of[s]] = 1;
  }
  baseline[shape.device_of[0]] += costs.at(costs.profile().batch_size).input_bytes;
  for (int d = 0; d < shape.devices; ++d)
    baseline[d] += computes[d] ? costs.profile().device.library_bytes : 0;
  return baseline;
}

// What torch's buffers for hand-overs between a rank's neighbouring stages hold at a step's
// start: the last step's stage input and input gradient of every micro-batch (compute_effects).
void local_hand_over_buffers(const TaskGraph& graph, const PlanShape& shape, const StageCosts& cost,
                             std::vector<std::int64_t>& baseline) {
  for (int s = 1; s < shape.stages; ++s) {
    const int d = shape.device_of[s];
    if (graph.counter[shape.device_of[s - 1]] != graph.counter[d]) continue;
    for (const std::uint8_t slot : shape.slot_of) {
      const StageMemory& m = cost[static_cast<std::size_t>(s)][slot].memory;
      baseline[static_cast<std::size_t>(d)] += m.input_bytes + m.input_gradient_bytes;
    }
  }
}

// torch's runtime holds a tensor that several of a rank's stages hold (tied weights in a V, whose
// first and last stages share rank 0) once: one parameter, one .grad, one optimizer state, where
// pipetune's executor gives each stage its own copy (executor/tied_copies). The first of those
// stages to run a backward in the rank's programme leaves its gradient as the .grad; the others'
// first backwards still make it, at the same peak, and add it in, so it is not left twice.
void share_ties_within_devices(const CostModel& costs, const Plan& plan, const PlanShape& shape,
                               const Schedule& schedule, StageCosts& cost,
                               std::vector<std::int64_t>& baseline) {
  // Where a stage's first B or W is in its programme.
  const auto first_backward = [&](int s) {
    const auto& actions = schedule.per_rank[static_cast<std::size_t>(schedule.stage_rank[s])];
    return std::find_if(actions.begin(), actions.end(),
                        [&](const Action& a) {
                          return a.stage == s && (a.kind == ActionKind::Backward ||
                                                  a.kind == ActionKind::WeightGrad);
                        }) -
           actions.begin();
  };
  for (const TiedTensor& tie : costs.profile().tied) {
    // The stages holding it, by device.
    std::vector<std::vector<int>> holders(static_cast<std::size_t>(shape.devices));
    for (int s = 0; s < shape.stages; ++s) {
      const bool holds = std::any_of(tie.layers.begin(), tie.layers.end(), [&](int k) {
        return k >= shape.first[s] && k < shape.first[s + 1];
      });
      if (holds) holders[static_cast<std::size_t>(shape.device_of[s])].push_back(s);
    }
    for (int d = 0; d < shape.devices; ++d) {
      std::vector<int>& on = holders[static_cast<std::size_t>(d)];
      if (on.size() < 2) continue;
      const auto extra = static_cast<std::int64_t>(on.size() - 1);
      baseline[d] -= extra * resident_bytes(tie.bytes, tie.trained ? tie.bytes : 0,
                                            plan.optimizer_state_factor);
      if (!tie.trained) continue;
      // One programme a rank: the first backward comes first in it.
      const bool one_programme = std::all_of(on.begin(), on.end(), [&](int s) {
        return schedule.stage_rank[s] == schedule.stage_rank[on.front()];
      });
      if (!one_programme) continue;
      std::stable_sort(on.begin(), on.end(),
                       [&](int x, int y) { return first_backward(x) < first_backward(y); });
      for (std::size_t h = 1; h < on.size(); ++h) {
        for (StageCost& c : cost[static_cast<std::size_t>(on[h])]) {
          c.gradient_bytes -= tie.bytes;
          StageMemory& m = c.memory;
          m.backward_net_first -= tie.bytes;
          m.backward_after_peak_first -= tie.bytes;
          m.backward_after_layer_first -= tie.bytes;
          m.torch_weight[1].after_peak -= tie.bytes;
          m.torch_weight[1].after_layer -= tie.bytes;
        }
      }
    }
  }
}

// A task's time of `kind` from a stage's times.
double task_ms(TaskKind kind, bool recomputed, const StageTimes& times) {
  switch (kind) {
    case TaskKind::Forward:
      return recomputed ? times.forward_nograd_ms : times.forward_ms;
    case TaskKind::Recompute:
      return times.forward_ms;
    case TaskKind::Backward:
      return times.backward_ms;
    case TaskKind::InputGrad:
      return times.backward_input_ms;
    case TaskKind::WeightGrad:
      return times.backward_weight_ms;
    default:
      return 0.0;
  }
}

// A compute task's solo duration and memory effects, as the engine takes them.
struct ComputeEffects {
  double ms = 0.0;
  bool memory = false;  // false: a kind without memory effects (duration only)
  int counter = 0;
  MemoryEffect effect;
  double mid_offset = 0.0, late_offset = 0.0;
};

// A compute task's solo duration, `extra_ms` added (its cold cache's), and memory effects
// (docs/memory-model.md). `sends_held`: the runtime keeps what it sent to the step's end
// (sends_held_to_step_end), so a backward does not free the stage output it sent.
ComputeEffects compute_effects(const TaskGraph& graph, const SimTask& t, const StageCost& c,
                               const PlanShape& shape, Runtime runtime, bool sends_held,
                               double extra_ms) {
  const int s = t.stage, i = t.micro_batch, counter = graph.counter[t.device];
  const StageMemory& m = c.memory;
  const bool last_stage = s + 1 == shape.stages, recomputed = shape.recomputed[i] != 0;
  const bool first_time = i == graph.first_backward[s];
  // A stage input that is its own buffer (received from another device's memory, or left behind
  // by a checkpointed stage in this one) dies with the backward; otherwise it is the previous
  // stage's output, which that stage frees. The stage output and the received gradient die
  // with it too; the last stage has neither (its output died with the forward).
  const bool received_input = s > 0 && graph.counter[shape.device_of[s - 1]] != counter;
  const bool own_input = received_input || (s > 0 && recomputed);
  std::int64_t dies = dies_with_backward(m, last_stage, own_input);
  const bool torch = runtime == Runtime::TorchPipelining;
  // pipetune's executor holds, for W, the output of each layer that trains of a micro-batch whose
  // backward is split; torch runs a stage's forward whole and keeps its graph through I.
  const bool split =
      !torch && graph.split[static_cast<std::size_t>(s) * graph.schedule.micro_batches + i] != 0;
  // torch hands tensors between a rank's neighbouring stages without a message and keeps each
  // as the receiver's buffer until the next step's hand-over replaces it (set_local_fwd_input,
  // set_local_bwd_input): the stage output and the gradient it gets back outlive the step, and
  // each hand-over frees the last step's (counted from the start, local_hand_over_buffers()).
  const bool next_local = torch && !last_stage && graph.counter[shape.device_of[s + 1]] == counter;
  const bool previous_local = torch && s > 0 && !received_input;
  if (torch) {
    // torch receives into buffers it keeps for the run (counted from the start, set_copy_effects).
    if (received_input) dies -= m.input_bytes;
    if (!last_stage && !next_local)
      dies -= m.output_gradient_bytes + (sends_held ? m.output_bytes : 0);
    if (next_local) dies -= m.output_bytes + m.output_gradient_bytes;
    if (previous_local && recomputed) dies -= m.input_bytes;
  }
  ComputeEffects out;
  out.ms = task_ms(t.kind, recomputed, c.solo) + extra_ms;
  out.memory = true;
  out.counter = counter;
  switch (t.kind) {
    case TaskKind::Forward:
      out.effect = forward_effect(m, recomputed, last_stage, split);
      // torch keeps each micro-batch's output (the model's) until the step ends.
      if (torch && last_stage) out.effect.freed -= m.output_bytes;
      if (next_local) out.effect.freed += m.output_bytes;  // the last step's, handed over
      break;
    case TaskKind::Recompute:
      out.effect = recompute_task_effect(m, split);
      break;
    case TaskKind::Backward:
      out.effect = backward_effect(m, first_time, dies);
      if (previous_local) out.effect.freed += m.input_gradient_bytes;
      break;
    case TaskKind::InputGrad:
      // torch's first stage computes nothing at I (its input needs no gradient) and runs its
      // whole backward at W.
      if (!whole_backward_at_weight(runtime, s)) out.effect = input_backward_effect(m, torch);
      if (previous_local) out.effect.freed += m.input_gradient_bytes;
      break;
    case TaskKind::WeightGrad:
      out.effect =
          whole_backward_at_weight(runtime, s)
              ? backward_effect(m, first_time, dies)
              : weight_backward_effect(m, c.gradient_bytes, first_time, last_stage, dies, torch);
      break;
    default:
      out.memory = false;
      return out;
  }
  out.mid_offset = out.ms * out.effect.peak_end;
  out.late_offset = out.ms * out.effect.layer_end;
  return out;
}

void apply_effects(EventEngine& engine, int task, const ComputeEffects& e) {
  if (e.memory) {
    engine.set_start_effect(task, e.counter, e.effect.allocated);
    engine.set_mid_effect(task, e.mid_offset, e.effect.freed_after_peak);
    engine.set_late_effect(task, e.late_offset, e.effect.freed_after_layer);
    engine.set_end_effect(task, e.counter, e.effect.freed);
  }
  engine.set_duration(task, e.ms);
}

// Without cold caches a compute task's effects depend only on its stage, size slot, kind,
// checkpointing and whether it is the stage's first backward: computed once per combination
// and copied to the others (a GPipe step at 16 x 128 has 4,096 compute tasks, 320 kinds).
class EffectsMemo {
 public:
  EffectsMemo(int stages, Runtime runtime, bool sends_held)
      : index_(static_cast<std::size_t>(stages) * 2 * 7 * 8, -1),
        runtime_(runtime),
        sends_held_(sends_held) {}
  const ComputeEffects& get(const TaskGraph& graph, const SimTask& t, const StageCost& c,
                            const PlanShape& shape) {
    const std::size_t cell =
        static_cast<std::size_t>(t.stage) * graph.schedule.micro_batches + t.micro_batch;
    const int variant = (graph.split[cell] != 0 ? 4 : 0) +
                        (shape.recomputed[t.micro_batch] != 0 ? 2 : 0) +
                        (t.micro_batch == graph.first_backward[t.stage] ? 1 : 0);
    const std::size_t key =
        ((static_cast<std::size_t>(t.stage) * 2 + shape.slot_of[t.micro_batch]) * 7 +
         static_cast<std::size_t>(t.kind)) *
            8 +
        variant;
    if (index_[key] < 0) {
      index_[key] = static_cast<int>(effects_.size());
      effects_.push_back(compute_effects(graph, t, c, shape, runtime_, sends_held_, 0.0));
    }
    return effects_[static_cast<std::size_t>(index_[key])];
  }

 private:
  std::vector<int> index_;
  std::vector<ComputeEffects> effects_;
  Runtime runtime_;
  bool sends_held_;
};

// Each compute task's coldness (sim/cache_model.hpp), in the graph's order of compute tasks.
std::vector<double> task_coldness(const TaskGraph& graph, const StageCosts& cost,
                                  const PlanShape& shape, std::int64_t cache_bytes) {
  std::vector<CacheTask> tasks;
  for (const SimTask& t : graph.tasks) {
    if (!is_compute(t.kind)) continue;
    const StageCost& c = cost[t.stage][shape.slot_of[t.micro_batch]];
    tasks.push_back({t.device, t.kind, t.stage, t.micro_batch, shape.recomputed[t.micro_batch] == 0,
                     c.memory.kept_bytes});
  }
  return cache_coldness(tasks, shape.devices, cache_bytes);
}

// Whether a copy's two ends hold their tensors in one memory (shares of one GPU): then the
// receiver gets the tensor itself, as a stage on the same device does.
bool within_one_memory(const TaskGraph& graph, const SimTask& copy) {
  return graph.counter[copy.device] == graph.counter[copy.peer];
}

// Copies of one stage, size and direction move the same bytes over the same link: one transfer
// time each (a division), not one per copy. An entry is reused only for the same link and bytes.
class CopyTimes {
 public:
  explicit CopyTimes(int stages) : entries_(static_cast<std::size_t>(stages) * 4) {}
  double ms(const Link& link, std::int64_t bytes, int stage, int slot, bool gradient) {
    Entry& e = entries_[(static_cast<std::size_t>(stage) * 2 + slot) * 2 + (gradient ? 1 : 0)];
    if (e.link != &link || e.bytes != bytes)
      e = {&link, bytes, link.transfer_ms(static_cast<double>(bytes))};
    return e.ms;
  }

 private:
  struct Entry {
    const Link* link = nullptr;
    std::int64_t bytes = -1;
    double ms = 0.0;
  };
  std::vector<Entry> entries_;
};

// A copy's duration and memory effects: the receiver allocates at once; the sender frees a
// gradient when it is done, and an activation when it is checkpointed (nothing else holds it).
// Where the runtime keeps what it sent to the step's end (`sends_held`), the sender frees
// nothing and the bytes are added to `held` (by device), freed once the step is done.
void set_copy_effects(TaskGraph& graph, int task, const StageMemory& m, const PlanShape& shape,
                      const Link& link, Runtime runtime, bool sends_held, CopyTimes& times,
                      std::vector<std::int64_t>& baseline, std::vector<std::int64_t>& held) {
  SimTask& t = graph.tasks[static_cast<std::size_t>(task)];
  const bool gradient = t.kind == TaskKind::SendGradient;
  t.bytes = gradient ? m.input_gradient_bytes : m.output_bytes;
  graph.engine.set_duration(
      task, times.ms(link, t.bytes, t.stage, shape.slot_of[t.micro_batch], gradient));
  // Within one memory (shares of one GPU) the receiver holds the sender's tensor: no bytes move.
  const bool copied = !within_one_memory(graph, t);
  // torch makes every receive's buffer (a stage's, a micro-batch's, a direction's) at its first
  // step and keeps it: there from the step's start, never freed.
  const bool kept_buffer = copied && runtime == Runtime::TorchPipelining;
  if (kept_buffer) baseline[static_cast<std::size_t>(t.peer)] += t.bytes;
  graph.engine.set_start_effect(task, graph.counter[t.peer], copied && !kept_buffer ? t.bytes : 0);
  const bool kept_sent = copied && sends_held;
  if (kept_sent) held[static_cast<std::size_t>(t.device)] += t.bytes;
  const bool sender_frees = copied && !kept_sent && (gradient || shape.recomputed[t.micro_batch]);
  graph.engine.set_end_effect(task, graph.counter[t.device], sender_frees ? t.bytes : 0);
}

// Whether torch's runtime keeps every tensor a rank sent until its step ends (torch 2.11): a
// send's work holds its tensor until the work is dropped. The multi-stage runtime
// (`_PipelineScheduleRuntime`: the interleaved, looped and zero-bubble schedules, and an order
// from a CSV) keeps every send's work until the rank's actions are done, and ScheduleGPipe its
// forward and backward sends' until it returns. (A zero-bubble I also leaves the gradient it
// sends as its input buffer's `.grad`, until the next step.) Schedule1F1B drops each in turn
// (hold_sent_gradients_as_torch). On 4 ranks this was a looped ResNet's missing 15 %.
bool sends_held_to_step_end(Runtime runtime, ScheduleKind kind, bool custom_order) {
  return runtime == Runtime::TorchPipelining && (custom_order || kind != ScheduleKind::OneFOneB);
}

// torch's Schedule1F1B keeps the gradient it last sent referenced (its `bwd_sends`) until the
// stage's next backward is done (torch 2.11); the activations it sent live until their
// backwards anyway.
void hold_sent_gradients_as_torch(TaskGraph& graph) {
  const Schedule& schedule = graph.schedule;
  const auto at = [&](int stage, int micro_batch) {
    return static_cast<std::size_t>(stage) * static_cast<std::size_t>(schedule.micro_batches) +
           static_cast<std::size_t>(micro_batch);
  };
  const std::size_t slots = at(schedule.stages, 0);
  std::vector<int> backward(slots, -1), send(slots, -1);
  for (std::size_t id = 0; id < graph.tasks.size(); ++id) {
    const SimTask& t = graph.tasks[id];
    if (t.kind == TaskKind::Backward) backward[at(t.stage, t.micro_batch)] = static_cast<int>(id);
    if (t.kind == TaskKind::SendGradient && !within_one_memory(graph, t))
      send[at(t.stage, t.micro_batch)] = static_cast<int>(id);
  }
  EventEngine& engine = graph.engine;
  const auto free_at_end_of = [&](int task, int counter, std::int64_t bytes) {
    const EventEngine::Effects e = engine.effects(task);
    engine.set_end_effect(task, counter, e.end_bytes + bytes);
  };
  for (int stage = 0; stage < schedule.stages; ++stage) {
    // The stage's backwards in its programme's order: the holder of each gradient comes next.
    std::vector<int> order;
    for (const Action& a : schedule.per_stage[static_cast<std::size_t>(stage)])
      if (a.kind == ActionKind::Backward) order.push_back(a.micro_batch);
    if (order.empty()) continue;
    for (std::size_t k = 0; k + 1 < order.size(); ++k) {
      const int copy = send[at(stage, order[k])];
      if (copy < 0) continue;  // the first stage sends none, nor one sharing its memory
      const EventEngine::Effects e = engine.effects(copy);
      engine.set_end_effect(copy, e.end_counter, 0);
      free_at_end_of(backward[at(stage, order[k + 1])], e.end_counter, e.end_bytes);
    }
  }
}

// The transport between processes posts each receive, its buffer allocated, as soon as the same
// receiver's previous receive is in, and the step's first at the step's start: a copy's bytes
// are charged to its receiver when the copy before it ends, not when it starts. (A mid effect
// frees from its start's counter at the latest when the task ends; a negative one allocates.)
void post_receives_early(TaskGraph& graph, std::vector<std::int64_t>& baseline) {
  EventEngine& engine = graph.engine;
  for (std::size_t id = 0; id < graph.tasks.size(); ++id) {
    const SimTask& t = graph.tasks[id];
    if (is_compute(t.kind) || within_one_memory(graph, t)) continue;
    const int copy = static_cast<int>(id);
    const int next = graph.next_receive[id];
    const SimTask* after = next >= 0 ? &graph.tasks[static_cast<std::size_t>(next)] : nullptr;
    engine.set_start_effect(copy, graph.counter[t.peer], 0);
    engine.set_mid_effect(copy, std::numeric_limits<double>::infinity(),
                          after && !within_one_memory(graph, *after) ? -after->bytes : 0);
  }
  for (const int first : graph.first_receives) {
    const SimTask& t = graph.tasks[static_cast<std::size_t>(first)];
    if (!within_one_memory(graph, t)) baseline[static_cast<std::size_t>(t.peer)] += t.bytes;
  }
}

// A GPU's host thread launches its device's programme in order, each task once its inputs were
// launched (a stream waits for another's kernels through an event, not the host), and never
// waits for the device; the device runs a task once its inputs are computed and its kernels
// come in. So the host's times are the same graph run with the launch times as durations and
// copies instant (a copy thread only enqueues one); each compute task then starts no earlier
// than its launch began and ends no earlier than its launch ended. Within one task this is the
// longer of the two times; across tasks the host runs ahead while the device is the slower, so
// a launch-bound task that follows device-bound ones runs at the device's pace.
// A backward's kernels are launched by autograd's thread for the tensors' GPU, not by the
// stage's thread (which waits for it), so devices that are shares of one GPU take turns on one
// thread for their backwards' launches: `backward_thread` (by device, -1: a thread of its own).
// Returns each task's launch (start, end); copies' are instants.
std::vector<std::pair<double, double>> pace_by_host(TaskGraph& graph, const StageCosts& cost,
                                                    const PlanShape& shape,
                                                    const std::vector<int>& backward_thread) {
  EventEngine& engine = graph.engine;
  engine.clear_pacing();
  engine.clear_locks();
  for (std::size_t id = 0; id < graph.tasks.size(); ++id) {
    const SimTask& t = graph.tasks[id];
    const StageTimes& host = cost[t.stage][shape.slot_of[t.micro_batch]].host;
    engine.set_duration(
        static_cast<int>(id),
        is_compute(t.kind) ? task_ms(t.kind, shape.recomputed[t.micro_batch] != 0, host) : 0.0);
    const bool backward = t.kind == TaskKind::Backward || t.kind == TaskKind::InputGrad ||
                          t.kind == TaskKind::WeightGrad;
    if (backward && backward_thread[static_cast<std::size_t>(t.device)] >= 0)
      engine.set_lock(static_cast<int>(id), backward_thread[static_cast<std::size_t>(t.device)]);
  }
  engine.run(false);
  engine.clear_locks();
  std::vector<std::pair<double, double>> launched(graph.tasks.size());
  for (std::size_t id = 0; id < graph.tasks.size(); ++id) {
    const int task = static_cast<int>(id);
    launched[id] = {engine.start(task), engine.finish(task)};
    if (is_compute(graph.tasks[id].kind))
      engine.set_pacing(task, launched[id].first, launched[id].second);
  }
  return launched;
}

// A compute task's two durations, alone and beside the profile's co-runners (the same
// without co-run times).
struct TimedTask {
  int id = 0;
  int device = 0;
  double solo_ms = 0.0, corun_ms = 0.0;
  double duration_ms = 0.0;  ///< what the engine runs it for
};

// What each task pays for the wait before it (sim/after_idle.hpp), on the last run's timeline:
// `tasks` in graph order, where each device's come in its order; the first task's wait is from
// the step's start, where every device has just done the optimizer's work.
std::vector<double> pays_after_idle(const EventEngine& engine, std::span<const TimedTask> tasks,
                                    std::span<const double> work_ms,
                                    std::span<const AfterIdlePoint> points, int devices) {
  std::vector<AfterIdleDebt> debt(static_cast<std::size_t>(devices));
  std::vector<double> free_at(static_cast<std::size_t>(devices), 0.0);
  std::vector<double> pays(tasks.size());
  for (std::size_t k = 0; k < tasks.size(); ++k) {
    const auto d = static_cast<std::size_t>(tasks[k].device);
    const double idle_ms = std::max(0.0, engine.start(tasks[k].id) - free_at[d]);
    pays[k] = debt[d].pay(points, idle_ms, work_ms[k]);
    free_at[d] = engine.finish(tasks[k].id);
  }
  return pays;
}

// The fixed point of the models that read the timeline: the co-run model (sim/corun.hpp) gives
// each task solo + share × (co-run − solo) for the share of it during which other devices
// computed, and the after-idle model (sim/after_idle.hpp) adds what the wait before it costs.
// Run with the durations set, set them from that run, and run again, until no duration moves by
// more than 1e-9 of the makespan, or for a bounded number of rounds, so a timeline that flips
// between two orders still ends (on the last durations).
// Returns the engine runs it made.
int settle_timeline_durations(EventEngine& engine, std::vector<TimedTask>& tasks, int co_runners,
                              std::span<const AfterIdlePoint> after_idle, int devices) {
  constexpr int kMaxRounds = 32;
  std::vector<ComputeSpan> spans(tasks.size());
  std::vector<double> work(tasks.size());
  for (int round = 0; round < kMaxRounds; ++round) {
    engine.run(false);
    std::vector<double> shares;
    if (co_runners > 0) {
      for (std::size_t k = 0; k < tasks.size(); ++k)
        spans[k] = {tasks[k].device, engine.start(tasks[k].id), engine.finish(tasks[k].id)};
      shares = corun_shares(spans, co_runners);
    }
    for (std::size_t k = 0; k < tasks.size(); ++k) {
      const TimedTask& t = tasks[k];
      work[k] = shares.empty() ? t.solo_ms : t.solo_ms + shares[k] * (t.corun_ms - t.solo_ms);
    }
    const std::vector<double> pays =
        after_idle.empty() ? std::vector<double>{}
                           : pays_after_idle(engine, tasks, work, after_idle, devices);
    double largest_move = 0.0;
    for (std::size_t k = 0; k < tasks.size(); ++k) {
      TimedTask& t = tasks[k];
      const double ms = pays.empty() ? work[k] : work[k] + pays[k];
      largest_move = std::max(largest_move, std::abs(ms - t.duration_ms));
      t.duration_ms = ms;
      engine.set_duration(t.id, ms);
    }
    if (largest_move <= 1e-9 * engine.makespan()) return round + 1;
  }
  return kMaxRounds;
}

// Each device's compute time: every compute task's span on it, its duration (the co-run
// model's where it has run), or longer where it waited for its launches (`paced`). Summed in
// task order, a device's run of tasks in a register (its tasks are contiguous).
std::vector<double> busy_times(const TaskGraph& graph, int devices, bool paced) {
  const EventEngine& engine = graph.engine;
  std::vector<double> busy(devices, 0.0);
  int device = -1;
  double sum = 0.0;
  for (std::size_t id = 0; id < graph.tasks.size(); ++id) {
    const SimTask& t = graph.tasks[id];
    if (!is_compute(t.kind)) continue;
    if (t.device != device) {
      if (device >= 0) busy[device] = sum;
      device = t.device;
      sum = busy[device];
    }
    const int task = static_cast<int>(id);
    sum += paced ? engine.finish(task) - engine.start(task) : engine.duration(task);
  }
  if (device >= 0) busy[device] = sum;
  return busy;
}

// The plan in the terms the task effects need.
PlanShape plan_shape(const Plan& plan, const std::vector<int>& device_of, int devices,
                     std::int64_t batch, const Schedule& schedule) {
  PlanShape shape;
  shape.stages = plan.stages();
  shape.devices = devices;
  shape.device_of = device_of;
  shape.sizes = split_batch(batch, plan.chunks);
  shape.first.assign(shape.stages + 1, 0);
  for (int s = 0; s < shape.stages; ++s) shape.first[s + 1] = shape.first[s] + plan.balance[s];
  // tensor.chunk gives at most two distinct sizes: the common one and a smaller last one.
  for (std::size_t i = 0; i < shape.sizes.size(); ++i) {
    shape.slot_of.push_back(shape.sizes[i] == shape.sizes[0] ? 0 : 1);
    shape.recomputed.push_back(schedule.recomputes(static_cast<int>(i)) ? 1 : 0);
  }
  return shape;
}

// Device d's stages and memory after a run (no stages: not in the plan).
DeviceReport device_report(const TaskGraph& graph, const PlanShape& shape, int d,
                           bool with_history) {
  DeviceReport report;
  for (int s = 0; s < shape.stages; ++s) {
    if (shape.device_of[s] == d) report.stages.push_back(s);
  }
  report.index = d;
  report.peak_memory_bytes = graph.engine.peak(graph.counter[d]);
  report.peak_time_ms = graph.engine.peak_time(graph.counter[d]);
  if (with_history) report.memory = graph.engine.history(graph.counter[d]);
  return report;
}

// Every counter's peak at the measured times, after a run; empty unless every task has them.
std::vector<std::int64_t> measured_order_peaks(const TaskGraph& graph,
                                               const SimulationOptions& options) {
  if (!options.measured_times) return {};
  std::vector<double> start(graph.tasks.size()), finish(graph.tasks.size());
  for (std::size_t id = 0; id < graph.tasks.size(); ++id) {
    const auto times = options.measured_times(graph.tasks[id]);
    if (!times) return {};
    std::tie(start[id], finish[id]) = *times;
  }
  return peaks_at_times(graph.engine, start, finish);
}

// One simulation's plan, costs and runtime, which its set-up steps read.
struct StepSetUp {
  TaskGraph& graph;
  const PlanShape& shape;
  const StageCosts& cost;
  Runtime runtime;
  bool sends_held;  ///< sends_held_to_step_end()
};

// What setting the tasks' effects leaves for the run.
struct TaskEffects {
  std::vector<TimedTask> timed;    ///< compute tasks, where the timeline sets their durations
  std::vector<std::int64_t> held;  ///< by device: bytes sent and held to the step's end
};

// Every task's duration and memory effects. A compute task's extras (a cold cache, the step's
// first forward after the optimizer's sweep) come only with the profile's cold times; without
// them the effects of a kind of task are computed once (EffectsMemo).
TaskEffects set_task_effects(const StepSetUp& step, const Profile& profile,
                             const std::vector<const Link*>& links, bool timeline_durations,
                             std::vector<std::int64_t>& baseline) {
  TaskGraph& graph = step.graph;
  const PlanShape& shape = step.shape;
  const int devices = shape.devices;
  const std::vector<double> coldness =
      profile.has_cold_times() ? task_coldness(graph, step.cost, shape, profile.device.cache_bytes)
                               : std::vector<double>{};
  TaskEffects effects;
  effects.held.assign(static_cast<std::size_t>(devices), 0);
  EffectsMemo memo(shape.stages, step.runtime, step.sends_held);
  CopyTimes copy_times(shape.stages);
  std::vector<std::uint8_t> started(profile.has_cold_times() ? devices : 0, 0);
  for (std::size_t id = 0, compute = 0; id < graph.tasks.size(); ++id) {
    const SimTask& t = graph.tasks[id];
    const StageCost& c = step.cost[t.stage][shape.slot_of[t.micro_batch]];
    if (!is_compute(t.kind)) {
      set_copy_effects(graph, static_cast<int>(id), c.memory, shape,
                       *links[t.device * devices + t.peer], step.runtime, step.sends_held,
                       copy_times, baseline, effects.held);
      continue;
    }
    const bool recomputed = shape.recomputed[t.micro_batch] != 0;
    double extra_ms =
        coldness.empty() ? 0.0 : coldness[compute] * task_ms(t.kind, recomputed, c.cold_extra);
    ++compute;
    if (!started.empty() && !started[static_cast<std::size_t>(t.device)]) {
      started[static_cast<std::size_t>(t.device)] = 1;
      if (t.kind == TaskKind::Forward)
        extra_ms = std::max(extra_ms, task_ms(t.kind, recomputed, c.step_start_extra));
    }
    // With cold caches each task's own; else shared, by reference (no copy per task).
    ComputeEffects own;
    if (!coldness.empty())
      own = compute_effects(graph, t, c, shape, step.runtime, step.sends_held, extra_ms);
    const ComputeEffects& e = coldness.empty() ? memo.get(graph, t, c, shape) : own;
    apply_effects(graph.engine, static_cast<int>(id), e);
    // Only the models that read the timeline need the compute tasks listed (160 KB at 16 x
    // 128: a fresh mapping, page faults and all, on every run).
    if (timeline_durations) {
      const double corun_ms = task_ms(t.kind, recomputed, c.corun) + extra_ms;
      effects.timed.push_back({static_cast<int>(id), t.device, e.ms, corun_ms, e.ms});
    }
  }
  return effects;
}

// What each memory holds at the step's start. Shares of one GPU count into one counter
// (share_gpu_counters()).
void set_initial_memory(TaskGraph& graph, int devices, const std::vector<std::int64_t>& baseline) {
  EventEngine& engine = graph.engine;
  std::vector<std::int64_t> initial(engine.counter_count(), 0);
  for (int d = 0; d < devices; ++d) initial[graph.counter[d]] += baseline[d];
  for (int d = 0; d < devices; ++d)
    engine.set_counter_initial(graph.counter[d], initial[graph.counter[d]]);
}

// Once its last action is done, torch waits for its sends and drops them, then concatenates
// the micro-batches' outputs into the step's (and still holds them).
void end_step_as_torch(const StepSetUp& step, const std::vector<std::int64_t>& held) {
  const PlanShape& shape = step.shape;
  EventEngine& engine = step.graph.engine;
  for (int d = 0; d < shape.devices; ++d)
    if (held[static_cast<std::size_t>(d)] > 0)
      engine.allocate_at_end(step.graph.counter[d], -held[static_cast<std::size_t>(d)]);
  std::int64_t merged = 0;
  for (const std::uint8_t slot : shape.slot_of)
    merged += step.cost[shape.stages - 1][slot].memory.output_bytes;
  engine.allocate_at_end(step.graph.counter[shape.device_of[shape.stages - 1]], merged);
}

// Each counter's peak in the tasks' worst order, never below its peak in the run: the worst
// order does not see what is allocated after the tasks (torch's joined output).
std::vector<std::int64_t> worst_order_peaks_after_run(const EventEngine& engine) {
  std::vector<std::int64_t> worst_order = worst_order_peaks(engine);
  for (std::size_t c = 0; c < worst_order.size(); ++c)
    worst_order[c] = std::max(worst_order[c], engine.peak(static_cast<int>(c)));
  return worst_order;
}

// A report for each device that runs a stage, after a run, and the bubble they leave.
void add_device_reports(SimulationResult& result, const TaskGraph& graph, const PlanShape& shape,
                        const SimulationOptions& options, const Hardware& hardware,
                        const std::vector<int>& shared_gpu, bool paced) {
  const int devices = shape.devices;
  const std::vector<std::int64_t> worst_order = options.worst_order_peaks
                                                    ? worst_order_peaks_after_run(graph.engine)
                                                    : std::vector<std::int64_t>{};
  const std::vector<std::int64_t> measured_order = measured_order_peaks(graph, options);
  const std::vector<double> busy = busy_times(graph, devices, paced);
  double busy_total = 0.0;
  for (int d = 0; d < devices; ++d) {
    DeviceReport report = device_report(graph, shape, d, options.record_memory);
    if (report.stages.empty()) continue;
    report.name = hardware.devices[d].name;
    report.busy_ms = busy[d];
    if (!worst_order.empty()) report.worst_order_peak_bytes = worst_order[graph.counter[d]];
    if (!measured_order.empty())
      report.measured_order_peak_bytes = measured_order[graph.counter[d]];
    report.memory_capacity_bytes = hardware.devices[d].memory_bytes;
    if (shared_gpu[d] >= 0) report.share_of = hardware.devices[d].share_of;
    busy_total += busy[d];
    result.devices.push_back(std::move(report));
  }
  const double capacity = result.iteration_ms * static_cast<double>(result.devices.size());
  result.bubble_fraction = capacity > 0 ? 1.0 - busy_total / capacity : 0.0;
}

// The tasks with their times in the run (and their launches', where the host paced them).
void add_task_times(SimulationResult& result, const TaskGraph& graph,
                    const std::vector<std::pair<double, double>>& launched) {
  const EventEngine& engine = graph.engine;
  result.tasks = graph.tasks;
  for (std::size_t id = 0; id < result.tasks.size(); ++id) {
    result.tasks[id].start_ms = engine.start(static_cast<int>(id));
    result.tasks[id].end_ms = engine.finish(static_cast<int>(id));
    if (!launched.empty() && is_compute(result.tasks[id].kind))
      std::tie(result.tasks[id].launch_start_ms, result.tasks[id].launch_end_ms) = launched[id];
  }
}

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
  share_gpu_counters(g);
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
  share_gpu_counters(g);
  g.valid = true;
  return g;
}

// Shares of one GPU split its SMs, not its memory: one caching allocator holds every share's
// tensors, so their memory is one counter, each share's peak the GPU's (as the executor measures
// it), checked against the GPU's capacity.
void Simulator::share_gpu_counters(Graph& g) const {
  // device_memory_[d] <= d: its counter is already the memory's own.
  for (std::size_t d = 0; d < device_memory_.size(); ++d)
    g.graph->counter[d] = g.graph->counter[device_memory_[d]];
}

SimulationResult Simulator::run(const Plan& plan, const SimulationOptions& options) const {
  const std::vector<int> device_of = stage_devices(plan, hardware_);
  const auto micro_batches = micro_batch_count(profile_.batch_size, plan.chunks);
  graph_for(plan, device_of, micro_batches);
  return simulate(plan, device_of, options);
}

SimulationResult Simulator::run(const Plan& plan, const Schedule& schedule,
                                const SimulationOptions& options) const {
  const auto micro_batches = micro_batch_count(profile_.batch_size, plan.chunks);
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
    throw InputError(
        fmt::format("the schedule has {} programmes (rows); the hardware has {} "
                    "device{}",
                    schedule.ranks(), devices, devices == 1 ? "" : "s"));
  }
  graph_for(schedule, device_of);
  return simulate(plan, device_of, options);
}

SimulationResult Simulator::simulate(const Plan& plan, const std::vector<int>& device_of,
                                     const SimulationOptions& options) const {
  TaskGraph& graph = *graph_.graph;
  EventEngine& engine = graph.engine;
  const PlanShape shape = plan_shape(plan, device_of, static_cast<int>(hardware_.devices.size()),
                                     profile_.batch_size, graph.schedule);
  const Runtime runtime = hardware_.runtime;
  const bool torch = runtime == Runtime::TorchPipelining;
  StageCosts cost = stage_costs(
      costs_, hardware_, shape, options.spread_z,
      [&](const SizeCosts& c, int first, int end, bool first_stage) -> const StageMemory& {
        return stage_memory_->of(costs_, c, first, end, first_stage);
      });
  std::vector<std::pair<double, double>> launched;
  if (profile_.has_launch_times()) {
    // before the device's durations are set
    launched = pace_by_host(graph, cost, shape, shared_gpu_);
  } else {
    engine.clear_pacing();
  }
  std::vector<std::int64_t> baseline = baseline_memory(costs_, plan, shape);
  if (torch) {
    local_hand_over_buffers(graph, shape, cost, baseline);
    if (!profile_.tied.empty())
      share_ties_within_devices(costs_, plan, shape, graph.schedule, cost, baseline);
  }
  const StepSetUp step{graph, shape, cost, runtime,
                       sends_held_to_step_end(runtime, plan.schedule, graph_.given)};
  const bool corun = profile_.has_corun_times();
  const bool timeline_durations = corun || profile_.has_after_idle();
  TaskEffects effects = set_task_effects(step, profile_, links_, timeline_durations, baseline);
  if (hardware_.posted_receives && !torch) post_receives_early(graph, baseline);
  if (torch && !step.sends_held) hold_sent_gradients_as_torch(graph);
  set_initial_memory(graph, shape.devices, baseline);
  if (timeline_durations) {
    engine_runs_ +=
        settle_timeline_durations(engine, effects.timed, corun ? profile_.co_runners : 0,
                                  profile_.device.after_idle, shape.devices);
  }

  engine.run(options.record_memory);
  ++engine_runs_;
  if (torch) end_step_as_torch(step, effects.held);

  SimulationResult result;
  result.plan = plan;
  result.micro_batch_sizes = shape.sizes;
  result.iteration_ms = engine.makespan();
  result.task_count = engine.task_count();
  result.throughput_samples_per_s =
      result.iteration_ms > 0
          ? static_cast<double>(profile_.batch_size) / (result.iteration_ms / 1e3)
          : 0.0;
  add_device_reports(result, graph, shape, options, hardware_, shared_gpu_, !launched.empty());
  if (options.record_tasks || options.record_edges) add_task_times(result, graph, launched);
  if (options.record_edges) result.edges = engine.edges();
  return result;
}

}  // namespace pipetune
