#include "validate/fit_check.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "executor/device_name.hpp"
#include "profiler/profiler.hpp"
#include "sim/error.hpp"
#include "sim/hardware.hpp"
#include "sim/simulator.hpp"
#include "sim/units.hpp"

namespace pipetune::validate {

namespace {

// The distinct micro-batch sizes the plan splits the batch into: all a memory check needs.
std::vector<std::int64_t> sizes_of(const Plan& plan, std::int64_t batch) {
  const auto split = split_batch(batch, plan.chunks);
  std::set<std::int64_t> distinct(split.begin(), split.end());
  return {distinct.begin(), distinct.end()};
}

// The devices whose predicted peak exceeds their memory. With `rank_gpus` > 0 (a distributed
// run's ranks on this machine), the ranks on one GPU count together: every rank's peak is its
// own process's, none of another's tensors in it (a sent tensor is copied into the receiver's
// own memory), so their sum is what the GPU must hold once each caching allocator has reached
// its peak. A device's GPU comes from its name, or, where a hardware file names it otherwise,
// from the executor's device in its place; one with neither is checked alone.
// Where `free_bytes` knows what a group's first device can still take, a group within its memory
// but above that is returned too, as free_now. `one_gpu`: the devices are shares of one GPU
// (each with the GPU's peak), asked once, for the first.
std::vector<DoesNotFit> misfits_of(
    const std::vector<DeviceReport>& devices, const std::vector<std::string>& executor_devices,
    int rank_gpus, const std::function<std::int64_t(const std::string&)>& free_bytes,
    bool one_gpu) {
  // The name that says device k's GPU, and its index: its own, else the executor's device in
  // its place; none where neither names an indexed CUDA device.
  struct GpuName {
    const std::string* name;
    int index;
  };
  auto gpu_name_of = [&](std::size_t k) -> std::optional<GpuName> {
    for (const std::string* name :
         {&devices[k].name, k < executor_devices.size() ? &executor_devices[k] : nullptr}) {
      if (!name) continue;
      const auto parsed = exec::try_parse_device_name(*name);
      if (parsed && parsed->kind == exec::DeviceKind::Cuda && parsed->has_index)
        return GpuName{name, parsed->index};
    }
    return std::nullopt;
  };
  struct Group {
    std::optional<int> gpu;
    std::vector<std::string> names;
    std::int64_t peak = 0, capacity = 0, free = 0;
  };
  std::vector<Group> groups;          // in the order of their first device
  std::map<int, std::size_t> of_gpu;  // a GPU's group
  for (std::size_t k = 0; k < devices.size(); ++k) {
    const DeviceReport& d = devices[k];
    const auto gpu_name = gpu_name_of(k);
    std::optional<int> gpu;
    if (rank_gpus > 0 && gpu_name) gpu = gpu_name->index % rank_gpus;
    std::size_t at = groups.size();  // a group of its own, unless its GPU has one
    if (gpu) at = of_gpu.emplace(*gpu, groups.size()).first->second;
    if (at == groups.size()) {
      // Runs of one process ask the device by the name that says its GPU, else by the
      // executor's device in its place.
      const std::string& asked = gpu_name                      ? *gpu_name->name
                                 : k < executor_devices.size() ? executor_devices[k]
                                                               : d.name;
      const bool ask = rank_gpus <= 0 && free_bytes && (!one_gpu || groups.empty());
      groups.push_back({gpu, {}, 0, 0, ask ? free_bytes(asked) : 0});
    }
    Group& g = groups[at];
    g.names.push_back(d.name);
    g.peak += d.peak_memory_bytes;
    if (d.memory_capacity_bytes > 0)
      g.capacity =
          g.capacity == 0 ? d.memory_capacity_bytes : std::min(g.capacity, d.memory_capacity_bytes);
  }
  std::vector<DoesNotFit> out;
  for (const Group& g : groups) {
    const std::string name = g.names.size() == 1
                                 ? g.names[0]
                                 : fmt::format("GPU {} ({})", *g.gpu, fmt::join(g.names, " + "));
    if (g.capacity > 0 && g.peak > g.capacity) {
      out.push_back({name, g.peak, g.capacity});
    } else if (g.free > 0 && g.peak > g.free) {
      out.push_back({name, g.peak, g.free, /*free_now=*/true});
    }
  }
  return out;
}

}  // namespace

std::vector<DoesNotFit> predict_misfits(const FitCheck& check, const Plan& plan,
                                        const ModelFactory& make_model) {
  const std::int64_t memory = check.memory_bytes;
  // CPU devices have no memory of their own to exceed unless the user gives one.
  const bool known = check.device_kind == "cuda" || !check.hardware_path.empty() || memory > 0;
  if (!known) return {};

  Profile profile;
  if (!check.profile_path.empty()) {
    profile = load_profile(check.profile_path);
  } else {
    // Byte counts are exact after one pass; the times of this profile are not used.
    profiler::ProfileOptions o;
    o.device = check.device_kind;
    o.batch_size = check.batch;
    o.micro_batch_sizes = sizes_of(plan, check.batch);
    o.warmup = 0;
    o.repeats = 1;
    o.threads = 1;
    o.timer = "events";  // no CUPTI session left behind for the run that follows
    o.launch_times = "off";
    o.after_idle = false;
    models::Model model = make_model();
    profile = profiler::profile_model(model, o).profile;
  }

  Hardware hw;
  if (!check.hardware_path.empty()) {
    hw = load_hardware(check.hardware_path);
  } else {
    for (const auto& name : check.devices)
      // `run --sm-partitions` splits cuda:0.
      hw.devices.push_back(
          {name, profile.device.memory_bytes, 1.0, check.sm_partitions > 0 ? "cuda:0" : ""});
  }
  if (memory > 0) {
    for (auto& d : hw.devices) d.memory_bytes = memory;
  }
  Plan predicted = plan;
  predicted.optimizer_state_factor = check.optimizer_state_factor;
  check_plan(predicted, profile, hw, check.plan_source);
  SimulationOptions lean;
  lean.record_tasks = false;
  const Simulator simulator(profile, hw);
  const SimulationResult result = check.schedule ? simulator.run(predicted, *check.schedule, lean)
                                                 : simulator.run(predicted, lean);

  return misfits_of(result.devices, check.devices, check.rank_gpus, check.free_bytes,
                    check.sm_partitions > 0);
}

std::string misfit_message(const std::string& plan_source, const std::vector<DoesNotFit>& misfits) {
  std::vector<std::string> parts;
  const bool free_now =
      std::all_of(misfits.begin(), misfits.end(), [](const DoesNotFit& m) { return m.free_now; });
  for (const auto& m : misfits) {
    parts.push_back(fmt::format("{} needs {} ({} bytes) predicted, has {} ({} bytes){}", m.device,
                                format_bytes(m.predicted_bytes), m.predicted_bytes,
                                format_bytes(m.capacity_bytes), m.capacity_bytes,
                                m.free_now ? " free" : ""));
  }
  if (free_now) {
    return fmt::format(
        "{}: the plan may not fit what is free now: {} (the rest of the memory held by the CUDA "
        "context, other processes and this process's tensors)",
        plan_source, fmt::join(parts, "; "));
  }
  return fmt::format("{}: the plan does not fit: {}", plan_source, fmt::join(parts, "; "));
}

}  // namespace pipetune::validate
