#include "executor/stage_backward.hpp"

#include <torch/autograd.h>

namespace pipetune::exec {

namespace {

bool needs_gradient(const at::Tensor& input) {
  return input.defined() && input.requires_grad();
}

// autograd's seed list: none for a scalar loss (ones), else the gradient received.
std::vector<at::Tensor> seed(const at::Tensor& output_gradient) {
  if (!output_gradient.defined()) return {};
  return {output_gradient};
}

}  // namespace

at::Tensor backward_whole(MicroBatchState& state, const at::Tensor& output_gradient) {
  torch::autograd::backward({state.output}, seed(output_gradient));
  at::Tensor input_gradient = needs_gradient(state.input) ? state.input.grad() : at::Tensor();
  state = {};
  return input_gradient;
}

at::Tensor backward_input(MicroBatchState& state, const at::Tensor& output_gradient) {
  state.output_gradient = output_gradient;
  if (!needs_gradient(state.input)) return {};
  auto gradients = torch::autograd::grad({state.output}, {state.input}, seed(output_gradient),
                                         /*retain_graph=*/true, /*create_graph=*/false,
                                         /*allow_unused=*/true);
  return gradients[0];
}

void backward_weight(MicroBatchState& state, const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> trained;
  for (const auto& p : parameters) {
    if (p.requires_grad()) trained.push_back(p);
  }
  if (!trained.empty()) {
    auto gradients = torch::autograd::grad({state.output}, trained, seed(state.output_gradient),
                                           /*retain_graph=*/false, /*create_graph=*/false,
                                           /*allow_unused=*/true);
    at::NoGradGuard no_grad;
    for (std::size_t k = 0; k < trained.size(); ++k) {
      if (!gradients[k].defined()) continue;  // a parameter this micro-batch did not reach
      at::Tensor& grad = trained[k].mutable_grad();
      if (grad.defined()) {
        grad.add_(gradients[k]);
      } else {
        grad = gradients[k];
      }
    }
  }
  state = {};
}

}  // namespace pipetune::exec
