#pragma once

// The backward of one stage for one micro-batch, whole (B) or in the two halves zero-bubble
// schedules run apart (I, then W), and the state a micro-batch keeps between its forward and
// its backward. I and W together leave the same .grad as B: W accumulates into it exactly as
// autograd's backward does.
//
// A split micro-batch runs its stage's layers one by one and keeps the output of every layer
// with parameters (boundaries autograd holds anyway). I is one traversal from the stage output to
// the stage input that also yields the gradient at every boundary and no weight gradient; W then
// runs, layer by layer, only the weight-gradient part of each layer from its boundary gradient, so
// it repeats none of I's activation-gradient work.

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstddef>
#include <vector>

namespace pipetune::exec {

/// What a stage keeps of one micro-batch from its forward (or recompute) to its backward.
struct MicroBatchState {
  at::Tensor input;  ///< requires grad when the previous stage needs its gradient
  /// The layers run on a copy of `input`: the stage's first layer modifies its input in place,
  /// which autograd refuses on the leaf that collects the input's gradient.
  bool copy_input = false;
  at::Tensor output;  ///< the stage's output, or the scaled loss on the last stage
  /// Split backward only: each layer's output where the layer has trained parameters (else
  /// undefined; the last is the stage's output before any loss); empty when the forward ran
  /// the stage whole.
  std::vector<at::Tensor> layer_outputs;
  /// Kept by I for W: the gradient at each of `layer_outputs` (undefined where none flows).
  std::vector<at::Tensor> layer_output_gradients;
  /// Kept by I for W when the stage ran whole: the gradient from the next stage (undefined: a
  /// loss).
  at::Tensor output_gradient;
};

/// What the stage's layers run on: `state.input`, or a copy of it where the first layer changes
/// its input in place (`copy_input`). Every forward and recompute of the stage takes it from here.
at::Tensor layers_input(const MicroBatchState& state);

/// Adds `term` into `sum` in place, or makes `sum` it when `sum` is undefined: how a gradient is
/// accumulated (as autograd adds into .grad). An undefined `term` adds nothing.
void accumulate_into(at::Tensor& sum, const at::Tensor& term);

/// `stage`'s layers on `x`, one after another, each entered (ScopedGenerator::enter_layer) by its
/// index in the model: the stage's first layer is the model's layer `first_layer`.
at::Tensor forward_stage(torch::nn::Sequential& stage, std::size_t first_layer, at::Tensor x);

/// The forward of a micro-batch whose backward is split: runs `stage`'s layers one by one on
/// `state.input`, as forward_stage does, keeping each layer's output in `state`. Returns the
/// stage's output (also stored as `state.output`; the last stage replaces that with its loss).
at::Tensor forward_layers(torch::nn::Sequential& stage, MicroBatchState& state,
                          std::size_t first_layer = 0);

/// B: gradients of `state.output` (seeded with `output_gradient`, undefined for a loss) into
/// the parameters' and the input's .grad; frees the graph. Returns the input's gradient
/// (undefined when the input needs none).
at::Tensor backward_whole(MicroBatchState& state, const at::Tensor& output_gradient);

/// I: the gradient w.r.t. the stage input (undefined when the input needs none) and, after
/// forward_layers, at every layer boundary; no weight gradient. The graph and the gradients W
/// needs are kept.
at::Tensor backward_input(MicroBatchState& state, const at::Tensor& output_gradient);

/// W, after I: the gradients w.r.t. the parameters of `stage`, accumulated into their .grad;
/// after forward_layers, each layer's from its kept boundary gradient (layers without trained
/// parameters are skipped). Then the graph and the micro-batch's state are freed.
void backward_weight(MicroBatchState& state, torch::nn::Sequential& stage);

}  // namespace pipetune::exec
