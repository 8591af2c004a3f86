#pragma once

// A module in evaluation mode for a scope (no running statistics updated, no dropout drawn), then
// back in the mode it was in, thrown through or not.

#include <torch/nn/module.h>

namespace pipetune::models {

class EvalGuard {
 public:
  explicit EvalGuard(torch::nn::Module& module) : module_(module), training_(module.is_training()) {
    module_.eval();
  }
  ~EvalGuard() { module_.train(training_); }
  EvalGuard(const EvalGuard&) = delete;
  EvalGuard& operator=(const EvalGuard&) = delete;

 private:
  torch::nn::Module& module_;
  bool training_;
};

}  // namespace pipetune::models
