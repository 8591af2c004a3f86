#include "executor/stage_backward.hpp"

#include <torch/autograd.h>

#include <unordered_set>

#include "executor/models/layers.hpp"

namespace pipetune::exec {

void accumulate_into(at::Tensor& sum, const at::Tensor& term) {
  if (!term.defined()) return;
  if (sum.defined()) {
    sum.add_(term);
  } else {
    sum = term;
  }
}

namespace {

bool needs_gradient(const at::Tensor& tensor) {
  return tensor.defined() && tensor.requires_grad();
}

// autograd's seed list: none for a scalar loss (ones), else the gradient received.
std::vector<at::Tensor> seed(const at::Tensor& output_gradient) {
  if (!output_gradient.defined()) return {};
  return {output_gradient};
}

// The parameters that train, each once (a module registered twice lists its own twice).
std::vector<at::Tensor> trained(const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> out;
  std::unordered_set<const void*> seen;
  for (const auto& p : parameters) {
    if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  }
  return out;
}

// Adds `gradients` into the parameters' .grad as autograd's backward does (an undefined one: a
// parameter this micro-batch did not reach).
void accumulate(const std::vector<at::Tensor>& parameters,
                const std::vector<at::Tensor>& gradients) {
  at::NoGradGuard no_grad;
  for (std::size_t k = 0; k < parameters.size(); ++k) {
    accumulate_into(const_cast<at::Tensor&>(parameters[k]).mutable_grad(), gradients[k]);
  }
}

// W over the whole kept graph from the stage output: the way when no boundaries were kept.
void weight_gradients_from_output(const MicroBatchState& state,
                                  const std::vector<at::Tensor>& parameters) {
  if (parameters.empty()) return;
  accumulate(parameters,
             torch::autograd::grad({state.output}, parameters, seed(state.output_gradient),
                                   /*retain_graph=*/false, /*create_graph=*/false,
                                   /*allow_unused=*/true));
}

// A parameter used by two layers of the stage: a layer's W from its own boundary would reach
// the other use too (counted twice, through a graph already freed).
bool layers_share_parameters(const std::vector<std::vector<at::Tensor>>& per_layer) {
  std::unordered_set<const void*> seen;
  for (const auto& parameters : per_layer) {
    for (const auto& p : parameters) {
      if (!seen.insert(p.unsafeGetTensorImpl()).second) return true;
    }
  }
  return false;
}

}  // namespace

at::Tensor layers_input(const MicroBatchState& state) {
  return state.copy_input ? state.input.clone() : state.input;
}

at::Tensor forward_stage(torch::nn::Sequential& stage, std::size_t first_layer, at::Tensor x) {
  for (auto& layer : *stage) {
    models::ScopedGenerator::enter_layer(first_layer++);
    x = layer.forward<at::Tensor>(x);
  }
  return x;
}

at::Tensor forward_layers(torch::nn::Sequential& stage, MicroBatchState& state,
                          std::size_t first_layer) {
  state.layer_outputs.assign(stage->size(), at::Tensor());
  at::Tensor x = layers_input(state);
  std::size_t j = 0;
  for (auto& layer : *stage) {
    models::ScopedGenerator::enter_layer(first_layer + j);
    x = layer.forward<at::Tensor>(x);
    // Only W reads a boundary: keep those of layers with trained parameters.
    if (!trained(layer.ptr()->parameters()).empty()) state.layer_outputs[j] = x;
    ++j;
  }
  state.output = x;
  return x;
}

at::Tensor backward_whole(MicroBatchState& state, const at::Tensor& output_gradient) {
  // A first stage of parameterless layers (a Flatten alone) has no graph: nothing to do.
  if (!needs_gradient(state.output)) {
    state = {};
    return {};
  }
  torch::autograd::backward({state.output}, seed(output_gradient));
  at::Tensor input_gradient = needs_gradient(state.input) ? state.input.grad() : at::Tensor();
  state = {};
  return input_gradient;
}

at::Tensor backward_input(MicroBatchState& state, const at::Tensor& output_gradient) {
  state.output_gradient = output_gradient;
  // Ask for the input and every boundary that needs a gradient, except the stage output
  // itself when it is the seeded root (its gradient is the seed).
  std::vector<at::Tensor> wanted;
  std::vector<int> wanted_boundary;  // per wanted: its index in layer_outputs, -1: the input
  if (needs_gradient(state.input)) {
    wanted.push_back(state.input);
    wanted_boundary.push_back(-1);
  }
  const int layers = static_cast<int>(state.layer_outputs.size());
  state.layer_output_gradients.assign(state.layer_outputs.size(), at::Tensor());
  for (int j = 0; j < layers; ++j) {
    const at::Tensor& boundary = state.layer_outputs[j];
    if (!needs_gradient(boundary)) continue;
    if (boundary.is_same(state.output)) {
      state.layer_output_gradients[j] = output_gradient;
      continue;
    }
    wanted.push_back(boundary);
    wanted_boundary.push_back(j);
  }
  if (wanted.empty()) return {};
  auto gradients = torch::autograd::grad({state.output}, wanted, seed(output_gradient),
                                         /*retain_graph=*/true, /*create_graph=*/false,
                                         /*allow_unused=*/true);
  at::Tensor input_gradient;
  for (std::size_t k = 0; k < wanted.size(); ++k) {
    if (wanted_boundary[k] < 0) {
      input_gradient = gradients[k];
    } else {
      state.layer_output_gradients[wanted_boundary[k]] = gradients[k];
    }
  }
  return input_gradient;
}

void backward_weight(MicroBatchState& state, torch::nn::Sequential& stage) {
  const bool kept_boundaries = !state.layer_outputs.empty() &&
                               state.layer_outputs.size() == stage->size() &&
                               state.layer_output_gradients.size() == stage->size();
  std::vector<std::vector<at::Tensor>> per_layer;
  if (kept_boundaries) {
    for (auto& layer : *stage) per_layer.push_back(trained(layer.ptr()->parameters()));
  }
  if (!kept_boundaries || layers_share_parameters(per_layer)) {
    weight_gradients_from_output(state, trained(stage->parameters()));
    state = {};
    return;
  }
  // Layer j's weights from the gradient at its own output: the traversal stops at its input
  // (only the parameters' edges are needed), so no activation gradient is recomputed.
  for (std::size_t j = 0; j < per_layer.size(); ++j) {
    const at::Tensor& boundary = state.layer_outputs[j];
    const at::Tensor& gradient = state.layer_output_gradients[j];
    if (per_layer[j].empty() || !needs_gradient(boundary) || !gradient.defined()) continue;
    accumulate(per_layer[j], torch::autograd::grad({boundary}, per_layer[j], {gradient},
                                                   /*retain_graph=*/false, /*create_graph=*/false,
                                                   /*allow_unused=*/true));
  }
  state = {};
}

}  // namespace pipetune::exec
