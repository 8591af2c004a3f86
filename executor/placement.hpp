#pragma once

// Which executor devices a plan's stages go to. A plan may name its devices for the simulator
// ("gpu0", or the CPU profile's "cpu:1"); the executor needs "cpu:<n>" or "cuda:<n>".

#include <string>
#include <vector>

#include "sim/plan.hpp"

namespace pipetune::exec {

/// The executor's device names for a plan run on `kind` ("cpu" or "cuda"): the plan's own
/// names when they are "<kind>:<n>", else "<kind>:0", "<kind>:1", … by order of first use (one
/// per stage when the plan names none).
std::vector<std::string> executor_devices(const Plan& plan, const std::string& kind);
/// Intra-op threads for each CPU device when `devices` CPU devices (worker threads of one
/// process, or ranks on one machine) share this machine's cores: an equal share, at least one.
/// The profiler measures with the same count, so a profiled layer runs as it will in the
/// pipeline; run, validate and profile all take it from here.
int cpu_threads_per_device(int devices);
/// The plan with its device names replaced by executor_devices()' (unchanged when it has none).
Plan with_executor_devices(const Plan& plan, const std::vector<std::string>& devices);

}  // namespace pipetune::exec
