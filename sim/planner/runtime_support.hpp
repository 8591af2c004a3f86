#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "sim/hardware.hpp"
#include "sim/plan.hpp"

namespace pipetune {

struct PlannerOptions;

/// Why torch.distributed.pipelining 2.11 cannot run `plan` on devices of `device_type`
/// ("cpu", "cuda"), or "" when it can (scripts/torch_pipeline.py refuses the same):
/// - its stages check every micro-batch against one shape, so the batch must split evenly;
/// - a PipelineStage runs one module for every micro-batch, so recomputing all but the last
///   micro-batch (checkpoint except_last) cannot be expressed;
/// - its V schedules send tensors between a rank's two stages as messages to the rank itself,
///   which Gloo (the CPU backend) cannot carry.
std::string torch_cannot_run(const Plan& plan, std::int64_t batch_size,
                             std::string_view device_type);

/// Narrows the planner's choices to plans the hardware's runtime runs (all of them for
/// pipetune's executor). Returns "" or, when nothing the options allow is left, why.
std::string keep_what_the_runtime_runs(PlannerOptions& options, const Hardware& hardware,
                                       std::int64_t batch_size, std::string_view device_type);

}  // namespace pipetune
