#include "executor/models/gradient_flow.hpp"

namespace pipetune::models {

std::vector<char> inputs_wanting_gradients(const Model& model) {
  bool frozen = false;
  for (const auto& p : model.layers->parameters()) frozen = frozen || !p.requires_grad();
  std::vector<char> wants;
  bool trained_before = false;
  for (const auto& layer : *model.layers) {
    wants.push_back(!wants.empty() && (!frozen || trained_before) ? 1 : 0);
    for (const auto& p : layer.ptr()->parameters()) trained_before |= p.requires_grad();
  }
  return wants;
}

}  // namespace pipetune::models
