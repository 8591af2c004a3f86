#include "executor/optimizer.hpp"

#include <fmt/format.h>
#include <torch/optim.h>

#include "sim/error.hpp"

namespace pipetune::exec {

OptimizerKind parse_optimizer(const std::string& name) {
  if (name == "none") return OptimizerKind::None;
  if (name == "sgd") return OptimizerKind::Sgd;
  if (name == "momentum") return OptimizerKind::Momentum;
  if (name == "adam") return OptimizerKind::Adam;
  throw InputError(fmt::format("unknown optimizer \"{}\": expected sgd, momentum, adam or none", name));
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

std::unique_ptr<torch::optim::Optimizer> make_optimizer(OptimizerKind kind, std::vector<at::Tensor> params,
                                                        double lr) {
  if (params.empty()) return nullptr;
  switch (kind) {
    case OptimizerKind::Sgd:
      return std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(lr));
    case OptimizerKind::Momentum:
      return std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(lr).momentum(0.9));
    case OptimizerKind::Adam:
      return std::make_unique<torch::optim::Adam>(std::move(params), torch::optim::AdamOptions(lr));
    case OptimizerKind::None:
      break;
  }
  return nullptr;
}

}  // namespace pipetune::exec
