// Tied weights: two layers holding one tensor must train as one tensor, with one gradient summed
// over both uses and one update, or the plan is refused. The truth is a training loop written
// out by hand on the two raw tensors, independent of the executor.

#include "executor/models/shared_tensors.hpp"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include "executor/executor.hpp"
#include "sim/error.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

using ::testing::HasSubstr;

// The output projection reuses the embedding's matrix, as tied language models do: y · W.
class TiedHeadImpl : public torch::nn::Module {
 public:
  explicit TiedHeadImpl(const at::Tensor& weight) : weight(register_parameter("weight", weight)) {}
  at::Tensor forward(const at::Tensor& x) { return x.matmul(weight); }
  at::Tensor weight;
};
TORCH_MODULE(TiedHead);

constexpr std::int64_t kBatch = 6;

enum class Head { Tied, Untied, View };

// pre (4 -> 4), embed (4 -> 6, weight W), act (tanh), head (6 -> 4: W itself, a copy of W, or a
// view of W's storage).
models::Model tied_model(Head head = Head::Tied) {
  torch::manual_seed(3);
  models::Model m;
  m.name = "tied";
  auto pre = torch::nn::Linear(torch::nn::LinearOptions(4, 4).bias(false));
  auto embed = torch::nn::Linear(torch::nn::LinearOptions(4, 6).bias(false));
  pre->to(at::kDouble);
  embed->to(at::kDouble);
  m.layer_names = {"pre", "embed", "act", "head"};
  m.layers->push_back("pre", pre);
  m.layers->push_back("embed", embed);
  m.layers->push_back("act", torch::nn::Tanh());
  const at::Tensor w = embed->weight;
  m.layers->push_back("head", TiedHead(head == Head::Tied     ? w
                                       : head == Head::Untied ? w.detach().clone()
                                                              : w.detach().view({6, 4})));
  m.loss = [](const at::Tensor& out, const at::Tensor& target) {
    return at::mse_loss(out, target);
  };
  m.make_batch = [](std::int64_t batch, std::int64_t step, std::uint64_t) {
    const auto gen = at::TensorOptions().dtype(at::kDouble);
    torch::manual_seed(100 + step);
    return std::pair{at::randn({batch, 4}, gen), at::randn({batch, 4}, gen)};
  };
  return m;
}

exec::ExecutorOptions cpu_devices(int n, exec::OptimizerKind optimizer, double lr) {
  exec::ExecutorOptions o;
  for (int d = 0; d < n; ++d) o.devices.push_back("cpu:" + std::to_string(d));
  o.threads_per_cpu_device = 1;
  o.optimizer = optimizer;
  o.learning_rate = lr;
  return o;
}

TEST(SharedTensors, FindsTheLayersThatHoldOneTensor) {
  models::Model m = tied_model();
  const auto shared = models::shared_tensors(m);
  ASSERT_EQ(shared.size(), 1u);
  EXPECT_EQ(shared[0].first_layer, 1u);
  EXPECT_EQ(shared[0].second_layer, 3u);
  EXPECT_TRUE(shared[0].parameter);
  EXPECT_EQ(models::describe(m, shared[0]),
            "layers 1 (\"embed\") and 3 (\"head\") share a parameter (embed.weight is "
            "head.weight)");
  // An untied copy of the same shapes shares nothing.
  models::Model untied = tied_model(Head::Untied);
  EXPECT_TRUE(models::shared_tensors(untied).empty());
}

TEST(SharedTensors, AViewOfAnotherLayersTensorCountsAsShared) {
  // The head holds a view of the embedding's storage, not the tensor itself.
  models::Model m = tied_model(Head::View);
  const auto shared = models::shared_tensors(m);
  ASSERT_EQ(shared.size(), 1u);
  EXPECT_EQ(shared[0].second_layer, 3u);
}

TEST(SharedTensors, APlanThatSplitsThemIsRefusedBeforeAnyWork) {
  const std::vector<std::pair<std::vector<int>, std::string>> cases{
      {{2, 2}, "on stages 0 and 1"}, {{1, 1, 2}, "on stages 1 and 2"}};
  for (const auto& [balance, stages] : cases) {
    models::Model m = tied_model();
    const at::Tensor before =
        m.layers->ptr(1)->as<torch::nn::LinearImpl>()->weight.detach().clone();
    try {
      exec::Pipeline pipeline(
          m, testing::make_plan(balance, 2, CheckpointMode::Never, ScheduleKind::GPipe), kBatch,
          cpu_devices(static_cast<int>(balance.size()), exec::OptimizerKind::Sgd, 0.1));
      ADD_FAILURE() << "a plan splitting the tied layers was accepted";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_THAT(what, HasSubstr("layers 1 (\"embed\") and 3 (\"head\") share a parameter"));
      EXPECT_THAT(what, HasSubstr(stages));
      EXPECT_EQ(what.find('\n'), std::string::npos);
    }
    EXPECT_TRUE(at::equal(m.layers->ptr(1)->as<torch::nn::LinearImpl>()->weight, before));
  }
}

struct HandWritten {
  at::Tensor pre, tied;
};

// The model written out on its two raw tensors, one update each per step.
double hand_written_loss(const HandWritten& h, const at::Tensor& x, const at::Tensor& y) {
  const at::Tensor hidden = at::tanh(x.matmul(h.pre.t()).matmul(h.tied.t()));
  return at::mse_loss(hidden.matmul(h.tied), y).item<double>();
}

class OneStageTrainsOneTensor
    : public ::testing::TestWithParam<std::tuple<exec::OptimizerKind, CheckpointMode, int>> {};

TEST_P(OneStageTrainsOneTensor, LossesAndWeightsEqualTheHandWrittenLoop) {
  const auto [kind, checkpoint, chunks] = GetParam();
  constexpr double kLr = 0.05;
  models::Model m = tied_model();
  // The tied pair on stage 1, "pre" on stage 0: two devices, the tie on one stage.
  exec::Pipeline pipeline(m, testing::make_plan({1, 3}, chunks, checkpoint, ScheduleKind::OneFOneB),
                          kBatch, cpu_devices(2, kind, kLr));
  auto* embed = m.layers->ptr(1)->as<torch::nn::LinearImpl>();
  auto* pre = m.layers->ptr(0)->as<torch::nn::LinearImpl>();
  HandWritten h{pre->weight.detach().clone().requires_grad_(),
                embed->weight.detach().clone().requires_grad_()};
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (kind == exec::OptimizerKind::Adam) {
    optimizer = std::make_unique<torch::optim::Adam>(std::vector<at::Tensor>{h.pre, h.tied},
                                                     torch::optim::AdamOptions(kLr));
  } else {
    optimizer = std::make_unique<torch::optim::SGD>(std::vector<at::Tensor>{h.pre, h.tied},
                                                    torch::optim::SGDOptions(kLr));
  }
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = m.make_batch(kBatch, step, 0);
    const exec::StepRecord record = pipeline.step(x, y);
    EXPECT_NEAR(record.loss, hand_written_loss(h, x, y), 1e-12) << "step " << step;
    optimizer->zero_grad();
    const at::Tensor hidden = at::tanh(x.matmul(h.pre.t()).matmul(h.tied.t()));
    at::mse_loss(hidden.matmul(h.tied), y).backward();
    optimizer->step();
    EXPECT_TRUE(at::allclose(embed->weight, h.tied, 1e-10, 1e-12)) << "step " << step;
    EXPECT_TRUE(at::allclose(pre->weight, h.pre, 1e-10, 1e-12)) << "step " << step;
  }
  // The two layers still hold one tensor.
  EXPECT_TRUE(m.layers->ptr(3)->as<TiedHeadImpl>()->weight.is_same(embed->weight));
}

INSTANTIATE_TEST_SUITE_P(
    SgdAndAdam, OneStageTrainsOneTensor,
    ::testing::Combine(::testing::Values(exec::OptimizerKind::Sgd, exec::OptimizerKind::Adam),
                       ::testing::Values(CheckpointMode::Never, CheckpointMode::Always),
                       ::testing::Values(1, 3)));

}  // namespace
}  // namespace pipetune
