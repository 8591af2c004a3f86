#pragma once

// Whether a TorchScript module's forward draws random numbers (dropout with a p that is not the
// constant 0, fused attention's dropout, sampling): the executor seeds such a layer's draws per
// micro-batch and layer, holding one lock for its forward (executor/models/torchscript.cpp).

namespace torch::jit {
struct Module;
}

namespace pipetune::models {

bool script_draws_random(const torch::jit::Module& module);

}  // namespace pipetune::models
