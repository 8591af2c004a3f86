#pragma once

// The backward of one stage for one micro-batch, whole (B) or in the two halves zero-bubble
// schedules run apart (I, then W), and the state a micro-batch keeps between its forward and
// its backward. I and W together leave the same .grad as B: W accumulates into it exactly as
// autograd's backward does.

#include <ATen/core/Tensor.h>

#include <vector>

namespace pipetune::exec {

/// What a stage keeps of one micro-batch from its forward (or recompute) to its backward.
struct MicroBatchState {
  at::Tensor input;            ///< requires grad when the previous stage needs its gradient
  at::Tensor output;           ///< the stage's output, or the scaled loss on the last stage
  at::Tensor output_gradient;  ///< from the next stage, kept by I for W (undefined: a loss)
};

/// B: gradients of `state.output` (seeded with `output_gradient`, undefined for a loss) into
/// the parameters' and the input's .grad; frees the graph. Returns the input's gradient
/// (undefined when the input needs none).
at::Tensor backward_whole(MicroBatchState& state, const at::Tensor& output_gradient);

/// I: the gradient w.r.t. the stage input only (undefined when the input needs none); the graph
/// and `output_gradient` are kept for W.
at::Tensor backward_input(MicroBatchState& state, const at::Tensor& output_gradient);

/// W, after I: the gradients w.r.t. `parameters` from the kept graph, accumulated into their
/// .grad; then the graph and the micro-batch's state are freed.
void backward_weight(MicroBatchState& state, const std::vector<at::Tensor>& parameters);

}  // namespace pipetune::exec
