#pragma once

// x W: an output projection reusing another layer's matrix W, as tied language models do (the
// executor's and the profiler's tests of tied weights build their models with it).

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace pipetune::testing {

class TiedHeadImpl : public torch::nn::Module {
 public:
  explicit TiedHeadImpl(const at::Tensor& weight) : weight(register_parameter("weight", weight)) {}
  at::Tensor forward(const at::Tensor& x) { return x.matmul(weight); }
  at::Tensor weight;
};
TORCH_MODULE(TiedHead);

}  // namespace pipetune::testing
