#pragma once

// Which executor devices a plan's stages go to. A plan may name its devices for the simulator
// ("gpu0", or the CPU profile's "cpu:1"); the executor needs "cpu:<n>" or "cuda:<n>".

#include <cstdint>
#include <string>
#include <vector>

#include "executor/device_name.hpp"
#include "sim/plan.hpp"
#include "sim/schedule.hpp"

namespace pipetune::exec {

/// The executor's device names for a plan run on `kind` ("cpu" or "cuda"): the plan's own
/// names when they are "<kind>:<n>", else "<kind>:0", "<kind>:1", … by order of first use (one
/// per programme when the plan names none: a stage each, or stages_per_device each).
/// `sm_partitions` > 0: "cuda:<n>" names share n of the first GPU's SMs (ExecutorOptions).
/// `distributed`: one rank per device, "cuda:<n>" on GPU n mod the GPUs here (ranks may share
/// one), so no device index is refused for want of GPUs.
std::vector<std::string> executor_devices(const Plan& plan, const std::string& kind,
                                          int sm_partitions = 0, bool distributed = false);
/// Intra-op threads for each CPU device when `devices` CPU devices (worker threads of one
/// process, or ranks on one machine) share this machine's cores: an equal share, at least one.
/// The profiler measures with the same count, so a profiled layer runs as it will in the
/// pipeline; run, validate and profile all take it from here.
int cpu_threads_per_device(int devices);
/// The intra-op threads each CPU device runs with: `requested` (ExecutorOptions::
/// threads_per_cpu_device), or where it is 0 the share of `devices` sharing the cores.
int resolved_cpu_threads(int requested, int devices);
/// The plan with its device names replaced by executor_devices()' (unchanged when it has none).
Plan with_executor_devices(const Plan& plan, const std::vector<std::string>& devices);

/// Where a plan's stages run, how its batch splits and the schedule they run: what the pipeline
/// builds its runtime on.
struct StagePlacement {
  std::vector<std::int64_t> micro_batch_sizes;  ///< split_batch(batch size, plan.chunks)
  Schedule schedule;                      ///< the plan's schedule, or the one given (torch's CSV)
  std::vector<std::string> device_names;  ///< the devices that hold stages, in the order given
  std::vector<DeviceName> devices;        ///< device_names, parsed
  std::vector<int> device_of;             ///< stage -> index into device_names
  bool cuda = false;                      ///< every device is CUDA (else every one is a CPU)
};

/// Checks the plan against the model (`model_layers` layers), the batch and `devices` (executor
/// names, ExecutorOptions::devices) and places its stages: as the plan's `devices` name them,
/// else programme r (stage_rank) on devices[r]. Throws InputError naming the plan field or
/// device at fault, before any work. `world_size` > 0: a distributed run of that many
/// processes, each running one device. `given`: a schedule to run instead of the plan's (its
/// stage and micro-batch counts must be the plan's; its programmes place the stages).
StagePlacement place_stages(const Plan& plan, int model_layers, const std::string& model_name,
                            std::int64_t batch_size, const std::vector<std::string>& devices,
                            int world_size, const Schedule* given = nullptr, int sm_partitions = 0);

}  // namespace pipetune::exec
