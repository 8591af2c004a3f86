#pragma once

#include <cstdint>

#include "sim/cost_model.hpp"

namespace pipetune {

/// What one micro-batch of one stage (layers [first, end)) allocates and frees, from walking its
/// layers in order (docs/memory-model.md derives every term). Bytes; "transient" is allocated
/// when a task starts and freed when it ends; every value is ≥ 0 unless said otherwise.
struct StageMemory {
  std::int64_t input_bytes = 0;   ///< stage input: received activation, gradient sent back
  std::int64_t output_bytes = 0;  ///< stage output: activation sent on, gradient received
  /// Kept after a forward with autograd: Σ saved + Σ outputs, the stage output included except
  /// on the last stage, where the model output dies once the loss exists.
  std::int64_t kept_bytes = 0;
  /// Peak above kept_bytes while a forward or recompute with autograd runs.
  std::int64_t forward_transient = 0;
  /// Peak above the stage output while a checkpointed forward (no autograd) runs.
  std::int64_t checkpointed_forward_transient = 0;
  /// Peak above the memory at the start of a backward; "first" when it also allocates the
  /// parameter gradients (the stage's first backward of the iteration).
  std::int64_t backward_peak = 0;
  std::int64_t backward_peak_first = 0;
  /// Net change over a backward's layer walk (may be negative): + input gradient − saved bytes −
  /// intermediate outputs; "first" adds the parameter gradients. The stage output and the
  /// received gradient are freed by the simulator at the end of the backward, not counted here.
  std::int64_t backward_net = 0;
  std::int64_t backward_net_first = 0;
  /// The backward split (I then W). I walks the layers for input gradients only, with the graph
  /// kept: it frees no activation, and of the gradients of the layers' outputs it keeps those
  /// of layers with parameters, which their weight gradients read. Peak above I's start, and
  /// what I leaves (the stage's input gradient and the gradients kept for W).
  std::int64_t input_backward_peak = 0;
  std::int64_t input_backward_net = 0;
  /// Of input_backward_net, what W frees: the output gradients kept for it.
  std::int64_t weight_kept_gradients = 0;
};

/// `first_stage`: the model input needs no gradient, so the backward allocates none for it.
StageMemory stage_memory(const CostModel& model, const SizeCosts& costs, int first, int end,
                         bool first_stage);

}  // namespace pipetune
