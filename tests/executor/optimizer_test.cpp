// The optimizers' names, and the state factor the memory model charges against the state each
// optimizer really keeps after its first step.

#include "executor/optimizer.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "sim/error.hpp"

namespace pipetune::exec {
namespace {

TEST(Optimizer, NamesParseAndOthersAreRefused) {
  EXPECT_EQ(parse_optimizer("none"), OptimizerKind::None);
  EXPECT_EQ(parse_optimizer("sgd"), OptimizerKind::Sgd);
  EXPECT_EQ(parse_optimizer("momentum"), OptimizerKind::Momentum);
  EXPECT_EQ(parse_optimizer("adam"), OptimizerKind::Adam);
  try {
    parse_optimizer("Adam");
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("sgd, momentum, adam or none"), std::string::npos)
        << e.what();
  }
}

// Bytes of every tensor the optimizer keeps in its state, after one step.
std::int64_t state_bytes(torch::optim::Optimizer& optimizer) {
  std::int64_t bytes = 0;
  for (const auto& [key, state] : optimizer.state()) {
    if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(state.get())) {
      bytes += adam->exp_avg().nbytes() + adam->exp_avg_sq().nbytes();
      if (adam->max_exp_avg_sq().defined()) bytes += adam->max_exp_avg_sq().nbytes();
    } else if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(state.get())) {
      if (sgd->momentum_buffer().defined()) bytes += sgd->momentum_buffer().nbytes();
    }
  }
  return bytes;
}

TEST(Optimizer, StateFactorIsTheStateKeptPerParameterByte) {
  for (OptimizerKind kind : {OptimizerKind::Sgd, OptimizerKind::Momentum, OptimizerKind::Adam}) {
    torch::nn::Linear layer(7, 5);
    std::int64_t param_bytes = 0;
    for (const auto& p : layer->parameters()) param_bytes += p.nbytes();
    auto optimizer = make_optimizer(kind, layer->parameters(), 0.1);
    ASSERT_NE(optimizer, nullptr);
    layer->forward(torch::randn({3, 7})).sum().backward();
    optimizer->step();
    EXPECT_DOUBLE_EQ(static_cast<double>(state_bytes(*optimizer)),
                     optimizer_state_factor(kind) * static_cast<double>(param_bytes))
        << static_cast<int>(kind);
  }
}

TEST(Optimizer, NoneOrNoParametersMakeNoOptimizer) {
  torch::nn::Linear layer(2, 2);
  EXPECT_EQ(make_optimizer(OptimizerKind::None, layer->parameters(), 0.1), nullptr);
  EXPECT_EQ(make_optimizer(OptimizerKind::Adam, {}, 0.1), nullptr);
  EXPECT_EQ(optimizer_state_factor(OptimizerKind::None), 0.0);
}

}  // namespace
}  // namespace pipetune::exec
