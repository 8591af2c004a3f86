#pragma once

// A model as pipetune runs it: a top-level Sequential whose children are the layers a plan
// balances over stages, a loss, and a source of training batches.

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace pipetune::models {

struct ModelOptions {
  c10::ScalarType dtype = c10::kFloat;
  bool deferred_batch_norm = false;  ///< running statistics updated once per mini-batch
  std::uint64_t seed = 0;            ///< parameter initialisation
};

struct Model {
  std::string name;  ///< for reports: "mlp-8x1024"
  std::string spec;  ///< what --model was given, canonical form: "mlp:layers=8,width=1024,..."
  torch::nn::Sequential layers;
  std::vector<std::string> layer_names;
  /// Mean loss of `output` against `target` over the samples given (cross entropy).
  std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)> loss;
  /// A deterministic synthetic batch (inputs, targets) of `batch` samples, on the CPU.
  std::function<std::pair<at::Tensor, at::Tensor>(std::int64_t batch, std::uint64_t seed)> make_batch;
};

/// Builds a model from a spec:
///   mlp[:layers=8,width=1024,input=W,classes=10,dropout=0]
///   gpt[:layers=4,width=256,heads=4,seq=64,vocab=1000,dropout=0]
///   resnet[:blocks=4,channels=32,image=32,classes=10]
///   torchscript:path=FILE.pt,input=3x32x32,classes=10   (or just FILE.pt with the same keys)
/// A TorchScript file's top level must be a Sequential; its children are the layers.
/// Throws InputError naming the key and what was expected.
Model build_model(const std::string& spec, const ModelOptions& options = {});

/// The models build_model knows, one line each, for --help texts and errors.
std::string model_catalogue();

}  // namespace pipetune::models
