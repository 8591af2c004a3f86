#pragma once

// Where autograd carries gradients through a model's layers. One device asks no gradient of
// data: in a model with frozen parameters (transfer learning's stem, `requires_grad` off), the
// layers up to the first whose parameters train work on data alone, so autograd records nothing
// there. The executor asks a stage's input for its gradient, and the profiler a layer's, by this
// one rule, which the simulator reads from the profile (CostModel::input_needs_gradient).

#include <vector>

#include "executor/models/model.hpp"

namespace pipetune::models {

/// Per layer of `model`: whether its input needs a gradient. Never the model's input; in a model
/// with frozen parameters, only where some layer before trains; in one without, every other
/// layer's (as every stage input always has, even after a parameterless first layer).
std::vector<char> inputs_wanting_gradients(const Model& model);

}  // namespace pipetune::models
