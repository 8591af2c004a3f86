#pragma once

// Layers that hold one tensor: tied weights (a language model's embedding and output projection
// share one matrix). Trained on one device, the tensor gets one gradient summed over both uses
// and one update. Split over stages, each stage holding it gets its own copy, and the pipeline
// sums the copies' gradients before the optimizer step (across ranks too), so every copy takes
// the one-device update (executor/tied_copies.hpp). What cannot be kept as one that way (a
// buffer, a view of another layer's tensor, a tensor inside a C++ module whose slot cannot be
// re-pointed) is refused when a plan splits it.

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
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
  bool same_tensor = true;  ///< false: another tensor over the same storage (a view)
};

/// One parameter several layers hold as the same tensor, and each holder's name for it (a layer
/// may hold it under two names).
struct TiedParameter {
  std::vector<std::pair<std::size_t, std::string>> holders;  ///< (layer, name), in layer order
  std::vector<std::size_t> layers;  ///< the holders' layers, each once, in order
  std::string name;                 ///< "embed.weight": the first holder's layer and name for it
  at::Tensor tensor;
};

/// Every parameter that two or more layers hold as the same tensor, in order of first holder.
std::vector<TiedParameter> tied_parameters(Model& model);

/// Every pair of layers of `model` that hold one tensor, each pair once, in layer order.
std::vector<SharedTensor> shared_tensors(Model& model);

/// The stage `balance` puts each layer on, by layer.
std::vector<int> stage_of_layers(const std::vector<int>& balance);

/// The first of `shared` that `balance` puts on two stages.
std::optional<SharedTensor> split_by(const std::vector<SharedTensor>& shared,
                                     const std::vector<int>& balance);

/// InputError, before any work, when `balance` puts two layers that hold one tensor on
/// different stages and that tensor cannot be kept as one there: a buffer, a view, or a
/// parameter a later stage holds in a layer that cannot take its own copy (can_repoint).
/// Names both layers and the tensor. `source` names the plan.
void check_tied_split(Model& model, const std::vector<int>& balance, const std::string& source);

/// Why the tensor `shared` names cannot be kept as one across two stages (one clause, for a
/// message); empty when it can.
std::string why_not_split(Model& model, const SharedTensor& shared);

/// Whether `layer` (a TorchScript child) can be given another tensor for its parameter `name`
/// (the layer's named_parameters() key), and doing it: the layer's forward then reads `tensor`.
bool can_repoint(torch::nn::Module& layer, const std::string& name);
bool repoint_parameter(torch::nn::Module& layer, const std::string& name, const at::Tensor& tensor);

/// One line for a report: "layers 0 (\"embed\") and 5 (\"head\") share a parameter
/// (embed.weight is head.weight)".
std::string describe(const Model& model, const SharedTensor& shared);

}  // namespace pipetune::models
