#pragma once

// Layers that hold one tensor: tied weights (a language model's embedding and output projection
// share one matrix). Trained on one stage, the tensor gets one gradient summed over both uses
// and one update. Split over two stages, each stage would update it with its part of the
// gradient (or, on one host, step it twice): a different model from the one-device run. Until
// the executor keeps such a tensor as one across stages, a plan that splits it is refused.

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "executor/models/model.hpp"

namespace pipetune::models {

/// Two layers holding one tensor, or tensors over one storage (a view of the other's).
struct SharedTensor {
  std::size_t first_layer = 0;
  std::size_t second_layer = 0;
  std::string first_name;   ///< the first layer's name for it, e.g. "weight"
  std::string second_name;  ///< the second layer's
  bool parameter = true;    ///< false: a buffer
};

/// Every pair of layers of `model` that hold one tensor, each pair once, in layer order.
std::vector<SharedTensor> shared_tensors(Model& model);

/// The first of `shared` that `balance` puts on two stages.
std::optional<SharedTensor> split_by(const std::vector<SharedTensor>& shared,
                                     const std::vector<int>& balance);

/// InputError, before any work, when `balance` puts two layers that hold one tensor on
/// different stages; names both layers and the tensor. `source` names the plan.
void check_shared_tensors_on_one_stage(Model& model, const std::vector<int>& balance,
                                       const std::string& source);

/// One line for a report: "layers 0 (\"embed\") and 5 (\"head\") share a parameter
/// (embed.weight is head.weight)".
std::string describe(const Model& model, const SharedTensor& shared);

}  // namespace pipetune::models
