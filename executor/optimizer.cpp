#include "executor/optimizer.hpp"

#include <fmt/format.h>
#include <torch/optim.h>

#include <stdexcept>

#include "sim/error.hpp"

namespace pipetune::exec {

OptimizerKind parse_optimizer(const std::string& name) {
  if (name == "none") return OptimizerKind::None;
  if (name == "sgd") return OptimizerKind::Sgd;
  if (name == "momentum") return OptimizerKind::Momentum;
  if (name == "adam") return OptimizerKind::Adam;
  throw InputError(
      fmt::format("unknown optimizer \"{}\": expected sgd, momentum, adam or none", name));
}

double optimizer_state_factor(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::Momentum:
      return 1.0;
    case OptimizerKind::Adam:
      return 2.0;
    case OptimizerKind::None:
    case OptimizerKind::Sgd:
      break;
  }
  return 0.0;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(OptimizerKind kind,
                                                        std::vector<at::Tensor> params, double lr) {
  if (params.empty()) return nullptr;
  switch (kind) {
    case OptimizerKind::Sgd:
      return std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(lr));
    case OptimizerKind::Momentum:
      return std::make_unique<torch::optim::SGD>(std::move(params),
                                                 torch::optim::SGDOptions(lr).momentum(0.9));
    case OptimizerKind::Adam:
      return std::make_unique<torch::optim::Adam>(std::move(params), torch::optim::AdamOptions(lr));
    case OptimizerKind::None:
      break;
  }
  return nullptr;
}

std::vector<at::Tensor> optimizer_state_tensors(torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> out;
  for (auto& [key, state] : optimizer.state()) {
    if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(state.get())) {
      out.push_back(sgd->momentum_buffer());
    } else if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(state.get())) {
      out.insert(out.end(), {adam->exp_avg(), adam->exp_avg_sq(), adam->max_exp_avg_sq()});
    } else {
      throw std::logic_error(
          "optimizer_state_tensors: an optimizer state this executor does not make");
    }
  }
  return out;
}

}  // namespace pipetune::exec
