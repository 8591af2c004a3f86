// I then W against autograd's whole backward (B) on the same graph: the input gradient I sends
// and the .grad W leaves are B's, also when W accumulates over micro-batches.

#include "executor/stage_backward.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

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
  forward_layers(stage, state);
  return state;
}

// The state after a forward that ran the stage whole (no boundaries kept): the backward must
// still be right.
MicroBatchState forward_whole(torch::nn::Sequential& stage, const at::Tensor& x) {
  MicroBatchState state;
  state.input = x.detach().requires_grad_(true);
  state.output = stage->forward(state.input);
  return state;
}

// y = x * weight (per feature), whose backward counts the products it computes: the one w.r.t.
// its input and the one w.r.t. its weight, each only when the running backward needs it.
int input_gradient_products = 0;
int weight_gradient_products = 0;

struct CountingScaleFunction : torch::autograd::Function<CountingScaleFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight) {
    ctx->save_for_backward({x, weight});
    return x * weight;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list gradients) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor input_gradient, weight_gradient;
    if (ctx->needs_input_grad(0)) {
      ++input_gradient_products;
      input_gradient = gradients[0] * saved[1];
    }
    if (ctx->needs_input_grad(1)) {
      ++weight_gradient_products;
      weight_gradient = (gradients[0] * saved[0]).sum(0);
    }
    return {input_gradient, weight_gradient};
  }
};

struct CountingScaleImpl : torch::nn::Module {
  explicit CountingScaleImpl(std::int64_t features)
      : weight(register_parameter("weight", at::randn({features}, at::kDouble))) {}
  at::Tensor forward(const at::Tensor& x) { return CountingScaleFunction::apply(x, weight); }
  at::Tensor weight;
};
TORCH_MODULE(CountingScale);

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
    backward_weight(state, stage);
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
  backward_weight(split, stage);
  const std::vector<at::Tensor> got = grads(stage);
  for (std::size_t k = 0; k < expected.size(); ++k) {
    EXPECT_TRUE(at::allclose(got[k], expected[k], 1e-12, 1e-14)) << "parameter " << k;
  }
}

// W runs only weight-gradient work: the counting layer's input-gradient product runs once, in
// I, and its weight-gradient product once, in W; the split still equals B.
TEST(StageBackward, WeightHalfComputesNoInputGradients) {
  torch::manual_seed(5);
  torch::nn::Sequential stage(torch::nn::Linear(4, 6), CountingScale(6), torch::nn::Tanh(),
                              torch::nn::Linear(6, 3));
  stage->to(at::kDouble);
  const at::Tensor x = at::randn({5, 4}, at::kDouble);
  const at::Tensor seed = at::randn({5, 3}, at::kDouble);

  MicroBatchState whole = forward(stage, x, false);
  const at::Tensor whole_input = backward_whole(whole, seed);
  const std::vector<at::Tensor> expected = grads(stage);
  reset(stage);

  input_gradient_products = weight_gradient_products = 0;
  MicroBatchState split = forward(stage, x, false);
  const at::Tensor split_input = backward_input(split, seed);
  EXPECT_EQ(input_gradient_products, 1);
  EXPECT_EQ(weight_gradient_products, 0);
  backward_weight(split, stage);
  EXPECT_EQ(input_gradient_products, 1) << "W recomputed an activation gradient";
  EXPECT_EQ(weight_gradient_products, 1);

  EXPECT_TRUE(at::allclose(split_input, whole_input, 1e-12, 1e-14));
  const std::vector<at::Tensor> got = grads(stage);
  for (std::size_t k = 0; k < expected.size(); ++k) {
    EXPECT_TRUE(at::allclose(got[k], expected[k], 1e-12, 1e-14)) << "parameter " << k;
  }
}

// On a first stage (input needs no gradient) I stops at the first layer's output: the counting
// first layer computes no input gradient at all, and W only its weight gradient.
TEST(StageBackward, FirstStageSkipsTheFirstLayersInputGradient) {
  torch::manual_seed(6);
  torch::nn::Sequential stage(CountingScale(4), torch::nn::Linear(4, 3));
  stage->to(at::kDouble);
  const at::Tensor x = at::randn({5, 4}, at::kDouble);
  input_gradient_products = weight_gradient_products = 0;
  MicroBatchState split = forward(stage, x, true);
  split.output = split.output.pow(2).sum();
  EXPECT_FALSE(backward_input(split, {}).defined());
  backward_weight(split, stage);
  EXPECT_EQ(input_gradient_products, 0);
  EXPECT_EQ(weight_gradient_products, 1);
  const std::vector<at::Tensor> got = grads(stage);
  reset(stage);

  MicroBatchState whole = forward(stage, x, true);
  whole.output = whole.output.pow(2).sum();
  backward_whole(whole, {});
  const std::vector<at::Tensor> expected = grads(stage);
  for (std::size_t k = 0; k < expected.size(); ++k) {
    EXPECT_TRUE(at::allclose(got[k], expected[k], 1e-12, 1e-14)) << "parameter " << k;
  }
}

// A layer registered twice in one stage (shared weights) and a forward that kept no boundaries
// both fall back to W over the whole kept graph, and still equal B.
TEST(StageBackward, SharedLayersAndWholeForwardsStillEqualTheWholeBackward) {
  torch::manual_seed(7);
  torch::nn::Linear shared(4, 4);
  torch::nn::Sequential stage(shared, torch::nn::Tanh(), shared);
  stage->to(at::kDouble);
  const at::Tensor x = at::randn({5, 4}, at::kDouble);
  const at::Tensor seed = at::randn({5, 4}, at::kDouble);
  MicroBatchState whole = forward(stage, x, false);
  backward_whole(whole, seed);
  const at::Tensor expected_weight = shared->weight.grad().clone();
  const at::Tensor expected_bias = shared->bias.grad().clone();

  for (bool kept_boundaries : {true, false}) {
    reset(stage);
    MicroBatchState split = kept_boundaries ? forward(stage, x, false) : forward_whole(stage, x);
    backward_input(split, seed);
    backward_weight(split, stage);
    EXPECT_TRUE(at::allclose(shared->weight.grad(), expected_weight, 1e-12, 1e-14))
        << kept_boundaries;
    EXPECT_TRUE(at::allclose(shared->bias.grad(), expected_bias, 1e-12, 1e-14)) << kept_boundaries;
  }
}

}  // namespace
}  // namespace pipetune::exec
