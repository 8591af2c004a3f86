#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "sim/hardware.hpp"
#include "sim/plan.hpp"
#include "sim/profile.hpp"

namespace pipetune {

struct PlannerOptions;
struct SizeCosts;

/// Why torch.distributed.pipelining 2.11 cannot run `plan` as predicted, or "" when it can
/// (scripts/torch_pipeline.py refuses the same):
/// - its stages check every micro-batch against one shape, so the batch must split evenly;
/// - a PipelineStage runs one module for every micro-batch, so recomputing all but the last
///   micro-batch (checkpoint except_last) cannot be expressed;
/// - under a split backward (interleaved-zb, zbv, dualpipev) torch.utils.checkpoint recomputes
///   a checkpointed stage once for every autograd call that reaches it: at I and again for each
///   of W's parameter groups (measured 5-7 x the step's time and 3 x its memory), which no
///   prediction holds, so checkpoint always is refused there.
std::string torch_cannot_run(const Plan& plan, std::int64_t batch_size);

/// Why torch would refuse `plan` for what its layers do: a stage after the first whose layers
/// change its input in place (LayerProfile::modifies_input, after views of it or first), since
/// torch hands every stage but the first its input as a leaf that needs a gradient, and autograd
/// refuses an in-place change to such a tensor. pipetune's executor runs such a stage on a copy
/// of its input. "" when there is none.
std::string torch_changed_stage_input(const Plan& plan, const Profile& profile);
/// The same from `profile`'s costs at any size (SizeCosts::copies_input: the flags are the same
/// at every size), as the planner asks it of every plan it simulates.
std::string torch_changed_stage_input(const Plan& plan, const Profile& profile,
                                      const SizeCosts& costs);

/// Why torch would refuse `plan` for a stage's output: under a schedule that splits the backward
/// (interleaved-zb, zbv, dualpipev), a stage neither first nor last whose output is a view of an
/// input of its last layer (a Flatten at its end; LayerProfile::output_aliases_input without
/// modifies_input, after any in-place layers), since torch's I detaches the stage's output in
/// place, which a view refuses. "" when there is none.
std::string torch_view_stage_output(const Plan& plan, const Profile& profile);

/// Where a cut would fall inside a frozen stem: at the layers k in [1, returned) whose input
/// needs no gradient (CostModel::input_needs_gradient: no layer before k trains). 1, none,
/// without frozen parameters.
int frozen_stem_cuts_end(const Profile& profile);

/// Where torch's runtime would do work the prediction does not hold: a stage after the first that
/// starts inside a frozen stem (no layer before it trains). torch asks a gradient of every stage
/// input, so it builds a graph through those frozen layers and sends gradients back, where the
/// profile holds them as pipetune's executor runs them (no graph, no backward). "" when none, else
/// a line saying so.
std::string torch_frozen_stem_unmodelled(const Plan& plan, const Profile& profile);

/// Narrows the planner's choices to plans the hardware's runtime runs as predicted (all of them
/// for pipetune's executor; torch_cannot_run()'s for torch's). Returns "" or, when nothing the
/// options allow is left, why.
std::string keep_what_the_runtime_runs(PlannerOptions& options, const Hardware& hardware,
                                       std::int64_t batch_size);
/// The same for `profile`'s model, and for torch's runtime only balances torch runs: where a
/// layer of it changes its input in place (PlannerOptions::stage_inputs_unchanged), and where one
/// makes a view of its input (PlannerOptions::stage_outputs_detachable).
std::string keep_what_the_runtime_runs(PlannerOptions& options, const Hardware& hardware,
                                       const Profile& profile);

}  // namespace pipetune
