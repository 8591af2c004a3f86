#pragma once

// The independent truth for the executor's tests: the same model, run unpipelined on one
// device, one micro-batch after another (as tensor.chunk splits the batch), each loss scaled by
// its share of the batch, gradients accumulated. Without batch norm this equals one pass over
// the whole batch.

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <map>
#include <string>

#include "executor/models/model.hpp"

namespace pipetune::testing {

inline double reference_step(models::Model& model, const at::Tensor& input,
                             const at::Tensor& target, int chunks) {
  for (auto& p : model.layers->parameters()) p.mutable_grad().reset();
  const auto inputs = input.chunk(chunks), targets = target.chunk(chunks);
  double loss = 0.0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const double scale =
        static_cast<double>(inputs[i].size(0)) / static_cast<double>(input.size(0));
    at::Tensor l = model.loss(model.layers->forward(inputs[i]), targets[i]) * scale;
    torch::autograd::backward({l});
    loss += l.item<double>();
  }
  return loss;
}

inline std::map<std::string, at::Tensor> gradients(models::Model& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model.layers->named_parameters()) {
    if (p.value().grad().defined()) out[p.key()] = p.value().grad().detach().clone();
  }
  return out;
}

inline std::map<std::string, at::Tensor> parameters(models::Model& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model.layers->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

}  // namespace pipetune::testing
