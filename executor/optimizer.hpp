#pragma once

// The optimizers a pipeline can step, in one place: their names, the state each keeps (which the
// memory model charges), and the factory. Light on purpose: no LibTorch header.

#include <memory>
#include <string>
#include <vector>

namespace at {
class Tensor;
}
namespace torch::optim {
class Optimizer;
}

namespace pipetune::exec {

enum class OptimizerKind { None, Sgd, Momentum, Adam };

/// "none", "sgd", "momentum" or "adam"; InputError naming the choices for anything else.
OptimizerKind parse_optimizer(const std::string& name);

/// Optimizer state bytes per parameter byte (plan.json's `optimizer_state_factor`): SGD keeps
/// none, momentum one buffer per parameter, Adam two (first and second moments).
double optimizer_state_factor(OptimizerKind kind);

/// The optimizer over `params` with learning rate `lr`; null for None or when there are no
/// parameters.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(OptimizerKind kind,
                                                        std::vector<at::Tensor> params, double lr);

/// The tensors an optimizer keeps between steps (momentum buffers, Adam's moments), for
/// counting what a pipeline holds.
std::vector<at::Tensor> optimizer_state_tensors(torch::optim::Optimizer& optimizer);

}  // namespace pipetune::exec
