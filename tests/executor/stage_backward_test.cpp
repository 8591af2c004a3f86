// I then W against autograd's whole backward (B) on the same graph: the input gradient I sends
// and the .grad W leaves are B's, also when W accumulates over micro-batches.

#include "executor/stage_backward.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <vector>

namespace pipetune::exec {
namespace {

torch::nn::Sequential small_stage() {
  torch::manual_seed(3);
  torch::nn::Sequential stage(torch::nn::Linear(4, 6), torch::nn::Tanh(), torch::nn::Linear(6, 3));
  stage->to(at::kDouble);
  return stage;
}

// The stage's state after a forward of `x` (a leaf that needs its gradient unless `first`).
MicroBatchState forward(torch::nn::Sequential& stage, const at::Tensor& x, bool first) {
  MicroBatchState state;
  state.input = first ? x : x.detach().requires_grad_(true);
  state.output = stage->forward(state.input);
  return state;
}

std::vector<at::Tensor> grads(torch::nn::Sequential& stage) {
  std::vector<at::Tensor> out;
  for (auto& p : stage->parameters()) out.push_back(p.grad().clone());
  return out;
}

void reset(torch::nn::Sequential& stage) {
  for (auto& p : stage->parameters()) p.mutable_grad().reset();
}

TEST(StageBackward, InputThenWeightEqualsTheWholeBackwardAndAccumulates) {
  torch::nn::Sequential stage = small_stage();
  const std::vector<at::Tensor> inputs{at::randn({5, 4}, at::kDouble),
                                       at::randn({5, 4}, at::kDouble)};
  const std::vector<at::Tensor> seeds{at::randn({5, 3}, at::kDouble),
                                      at::randn({5, 3}, at::kDouble)};

  std::vector<at::Tensor> whole_inputs;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    MicroBatchState state = forward(stage, inputs[i], false);
    whole_inputs.push_back(backward_whole(state, seeds[i]));
    EXPECT_FALSE(state.output.defined());  // freed
  }
  const std::vector<at::Tensor> whole = grads(stage);

  reset(stage);
  // Both Is before either W, as the zero-bubble schedules run them.
  std::vector<MicroBatchState> states;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    states.push_back(forward(stage, inputs[i], false));
    const at::Tensor input_gradient = backward_input(states.back(), seeds[i]);
    ASSERT_TRUE(input_gradient.defined());
    EXPECT_TRUE(at::allclose(input_gradient, whole_inputs[i], 1e-12, 1e-14));
    for (auto& p : stage->parameters()) EXPECT_FALSE(p.grad().defined()) << "I touched .grad";
  }
  for (auto& state : states) {
    backward_weight(state, stage->parameters());
    EXPECT_FALSE(state.output.defined());
  }
  const std::vector<at::Tensor> split = grads(stage);
  ASSERT_EQ(split.size(), whole.size());
  for (std::size_t k = 0; k < whole.size(); ++k) {
    EXPECT_TRUE(at::allclose(split[k], whole[k], 1e-12, 1e-14)) << "parameter " << k;
  }
}

TEST(StageBackward, TheFirstStageAndALossNeedNoSeedOrInputGradient) {
  torch::nn::Sequential stage = small_stage();
  const at::Tensor x = at::randn({5, 4}, at::kDouble);
  MicroBatchState whole = forward(stage, x, true);
  whole.output = whole.output.pow(2).sum();  // a loss: autograd seeds it with one
  EXPECT_FALSE(backward_whole(whole, {}).defined());
  const std::vector<at::Tensor> expected = grads(stage);

  reset(stage);
  MicroBatchState split = forward(stage, x, true);
  split.output = split.output.pow(2).sum();
  EXPECT_FALSE(backward_input(split, {}).defined());
  backward_weight(split, stage->parameters());
  const std::vector<at::Tensor> got = grads(stage);
  for (std::size_t k = 0; k < expected.size(); ++k) {
    EXPECT_TRUE(at::allclose(got[k], expected[k], 1e-12, 1e-14)) << "parameter " << k;
  }
}

}  // namespace
}  // namespace pipetune::exec
