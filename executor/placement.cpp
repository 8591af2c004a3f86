#include "executor/placement.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <thread>

#include "executor/device_runtime.hpp"
#include "sim/error.hpp"
#include "sim/schedule.hpp"

namespace pipetune::exec {

namespace {

// "<kind>:<n>": a name the executor can use as it is.
bool is_kind(const std::string& name, const std::string& kind) {
  const auto parsed = try_parse_device_name(name);
  return parsed && parsed->has_index && to_string(parsed->kind) == kind;
}

// What the executor runs: a layer or more per stage summing to the model's, a chunk count the
// batch can split into.
void check_runnable(const Plan& plan, int model_layers, const std::string& model_name,
                    std::int64_t batch_size) {
  if (plan.balance.empty()) throw InputError("plan: balance: expected at least one stage");
  long long total = 0;
  for (std::size_t s = 0; s < plan.balance.size(); ++s) {
    if (plan.balance[s] < 1) {
      throw InputError(fmt::format(
          "plan: balance[{}]: expected a positive integer (every stage needs a layer), got {}", s,
          plan.balance[s]));
    }
    total += plan.balance[s];
  }
  if (total != model_layers) {
    throw InputError(
        fmt::format("plan: balance: expected layer counts summing to {} (the layers of {}), got {}",
                    model_layers, model_name, total));
  }
  if (plan.chunks < 1 || plan.chunks > batch_size) {
    throw InputError(fmt::format("plan: chunks: expected 1 to {} (the batch size), got {}",
                                 batch_size, plan.chunks));
  }
}

// The schedule the stages run: the one given, if it fits the plan, else the plan's own, with
// torch's refusals as the plan's fault.
Schedule schedule_to_run(const Plan& plan, int micro_batches, const Schedule* given) {
  if (given) {
    if (given->stages != plan.stages()) {
      throw InputError(fmt::format("plan: balance: the schedule has {} stages, the balance {}",
                                   given->stages, plan.stages()));
    }
    if (given->micro_batches != micro_batches) {
      throw InputError(
          fmt::format("plan: chunks: the schedule has {} micro-batches, the batch splits into {}",
                      given->micro_batches, micro_batches));
    }
    return *given;
  }
  const int per_device = is_multi_stage(plan.schedule) ? plan.stages_per_device : 1;
  if (per_device != plan.stages_per_device) {
    throw InputError(fmt::format("plan: stages_per_device: expected 1 for {}, got {}",
                                 to_string(plan.schedule), plan.stages_per_device));
  }
  if (per_device < 1 || plan.stages() % per_device != 0) {
    throw InputError(
        fmt::format("plan: balance: expected a multiple of {} stages (stages_per_device), got {}",
                    per_device, plan.stages()));
  }
  if (auto why =
          schedule_refusal(plan.schedule, plan.stages() / per_device, per_device, micro_batches)) {
    throw InputError("plan: schedule: " + *why);
  }
  return make_schedule(plan.schedule, plan.stages(), micro_batches, plan.checkpoint, per_device);
}

// Which of `devices` each stage runs on: the plan's own names (a programme's stages on one
// device), or programme r on entry r.
std::vector<std::string> stage_device_names(const Plan& plan, const Schedule& schedule,
                                            const std::vector<std::string>& devices) {
  const int stage_count = plan.stages();
  std::vector<std::string> names(stage_count);
  if (plan.devices.empty()) {
    if (schedule.ranks() > static_cast<int>(devices.size())) {
      const std::string stages = schedule.ranks() == stage_count
                                     ? fmt::format("{} stages", stage_count)
                                     : fmt::format("{} programmes of stages", schedule.ranks());
      throw InputError(
          fmt::format("plan: {} but {} devices (name the plan's devices to put several stages on "
                      "one device)",
                      stages, devices.size()));
    }
    for (int s = 0; s < stage_count; ++s) names[s] = devices[schedule.stage_rank[s]];
    return names;
  }
  if (static_cast<int>(plan.devices.size()) != stage_count) {
    throw InputError(fmt::format("plan: devices: expected one per stage ({}), got {}", stage_count,
                                 plan.devices.size()));
  }
  std::vector<int> first_of_rank(schedule.ranks(), -1);
  for (int s = 0; s < stage_count; ++s) {
    const auto& name = plan.devices[s];
    if (std::find(devices.begin(), devices.end(), name) == devices.end()) {
      throw InputError(fmt::format("plan: devices[{}]: \"{}\" is not one of the devices given ({})",
                                   s, name, fmt::join(devices, ", ")));
    }
    int& first = first_of_rank[schedule.stage_rank[s]];
    if (first < 0) {
      first = s;
    } else if (name != plan.devices[first]) {
      throw InputError(fmt::format(
          "plan: devices[{}]: expected \"{}\" (stages {} and {} are one programme), got \"{}\"", s,
          plan.devices[first], first, s, name));
    }
    names[s] = name;
  }
  return names;
}

// The CUDA devices a plan may name: the GPUs, or the shares of the first one's SMs.
int cuda_devices(int sm_partitions) {
  if (sm_partitions > 0) return cuda_device_count() > 0 ? sm_partitions : 0;
  return cuda_device_count();
}

// One device, parsed and checked against this build and machine.
DeviceName checked_device(const std::string& name, bool distributed, int sm_partitions) {
  const DeviceName device = parse_device_name(name);
  if (device.kind != DeviceKind::Cuda) return device;
  if (!cuda_built()) {
    throw InputError(fmt::format("device {}: this build of pipetune has no CUDA", name));
  }
  if (distributed && sm_partitions == 0) {
    if (cuda_device_count() == 0)
      throw InputError(fmt::format("device {}: no CUDA device on this machine", name));
    return device;  // a rank's: on GPU index mod the GPUs here (make_runtime in pipeline.cpp)
  }
  if (device.index >= cuda_devices(sm_partitions)) {
    throw InputError(sm_partitions > 0
                         ? fmt::format("device {}: no such SM partition (the GPU is split into {})",
                                       name, sm_partitions)
                         : fmt::format("device {}: no such CUDA device (this machine has {})", name,
                                       cuda_device_count()));
  }
  return device;
}

}  // namespace

StagePlacement place_stages(const Plan& plan, int model_layers, const std::string& model_name,
                            std::int64_t batch_size, const std::vector<std::string>& devices,
                            int world_size, const Schedule* given, int sm_partitions) {
  check_runnable(plan, model_layers, model_name, batch_size);
  StagePlacement out;
  out.micro_batch_sizes = split_batch(batch_size, plan.chunks);
  out.schedule = schedule_to_run(plan, static_cast<int>(out.micro_batch_sizes.size()), given);
  const std::vector<std::string> stage_names = stage_device_names(plan, out.schedule, devices);
  for (const auto& name : devices) {
    if (std::find(stage_names.begin(), stage_names.end(), name) != stage_names.end()) {
      out.device_names.push_back(name);
    }
  }
  for (const auto& name : stage_names) {
    const auto it = std::find(out.device_names.begin(), out.device_names.end(), name);
    out.device_of.push_back(static_cast<int>(it - out.device_names.begin()));
  }
  if (world_size > 0 && static_cast<int>(out.device_names.size()) != world_size) {
    throw InputError(
        fmt::format("plan: {} devices ({}) but WORLD_SIZE is {}: a distributed run puts each "
                    "device in its own process",
                    out.device_names.size(), fmt::join(out.device_names, ", "), world_size));
  }
  int cpu_devices = 0;
  for (const auto& name : out.device_names) {
    out.devices.push_back(checked_device(name, world_size > 0, sm_partitions));
    if (out.devices.back().kind == DeviceKind::Cuda) {
      out.cuda = true;
    } else {
      ++cpu_devices;
    }
  }
  if (out.cuda && cpu_devices > 0) {
    throw InputError("plan: mixing cpu and cuda devices in one pipeline is not supported");
  }
  return out;
}

std::vector<std::string> executor_devices(const Plan& plan, const std::string& kind,
                                          int sm_partitions, bool distributed) {
  if (kind == "cuda" && !exec::cuda_built()) {
    throw InputError(Input::Device, "cuda",
                     "this build of pipetune has no CUDA (LibTorch without CUDA, or no CUDA "
                     "toolkit)");
  }
  if (kind == "cuda" && exec::cuda_device_count() == 0) {
    throw InputError(Input::Device, "cuda", "no CUDA device on this machine");
  }
  std::vector<std::string> out;
  if (plan.devices.empty()) {
    int programmes = 0;
    for (int s = 0; s < plan.stages(); ++s) {
      programmes = std::max(
          programmes, 1 + stage_rank(plan.schedule, s, plan.stages(), plan.stages_per_device));
    }
    for (int r = 0; r < programmes; ++r) out.push_back(fmt::format("{}:{}", kind, r));
  } else {
    std::vector<std::string> seen;
    for (const auto& name : plan.devices) {
      if (std::find(seen.begin(), seen.end(), name) == seen.end()) seen.push_back(name);
    }
    const bool own = std::all_of(seen.begin(), seen.end(),
                                 [&](const std::string& n) { return is_kind(n, kind); });
    for (std::size_t k = 0; k < seen.size(); ++k)
      out.push_back(own ? seen[k] : fmt::format("{}:{}", kind, k));
  }
  if (kind == "cuda" && !distributed) {  // a distributed run's ranks may share GPUs
    for (const auto& name : out) {
      if (parse_device_name(name).index >= cuda_devices(sm_partitions)) {
        throw InputError(
            Input::Device, "cuda",
            sm_partitions > 0
                ? fmt::format("the plan needs {} but the GPU is split into {} SM partitions", name,
                              sm_partitions)
                : fmt::format("the plan needs {} but this machine has {} CUDA device(s); "
                              "name the plan's devices to "
                              "put several stages on one (e.g. \"devices\": [\"cuda:0\", "
                              "\"cuda:0\"])",
                              name, exec::cuda_device_count()));
      }
    }
  }
  return out;
}

Plan with_executor_devices(const Plan& plan, const std::vector<std::string>& devices) {
  if (plan.devices.empty()) return plan;
  Plan out = plan;
  std::vector<std::string> seen;
  for (auto& name : out.devices) {
    auto it = std::find(seen.begin(), seen.end(), name);
    if (it == seen.end()) {
      seen.push_back(name);
      it = seen.end() - 1;
    }
    name = devices[static_cast<std::size_t>(it - seen.begin())];
  }
  return out;
}

int cpu_threads_per_device(int devices) {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, devices));
}

int resolved_cpu_threads(int requested, int devices) {
  return requested > 0 ? requested : cpu_threads_per_device(devices);
}

}  // namespace pipetune::exec
