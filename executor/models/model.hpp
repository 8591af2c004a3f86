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
  /// Mean loss of `output` against `target` over the samples given: cross entropy over the
  /// output's last dimension, or mean squared error. Throws InputError when the target's shape
  /// cannot match the output's.
  std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)> loss;
  /// The (inputs, targets) of training step `step` (0, 1, …), `batch` samples, on the CPU, floating
  /// tensors in the model's dtype: synthetic data drawn from (seed, step), or the next `batch`
  /// samples of a batch file, wrapping around.
  std::function<std::pair<at::Tensor, at::Tensor>(std::int64_t batch, std::int64_t step,
                                                  std::uint64_t seed)>
      make_batch;
  /// Samples in the model's batch file; 0 when the data is synthetic (any batch size).
  std::int64_t samples = 0;
};

/// Builds a model from a spec:
///   mlp[:layers=8,width=1024,input=W,classes=10,dropout=0]
///   gpt[:layers=4,width=256,heads=4,seq=64,vocab=1000,dropout=0]
///   resnet[:blocks=4,channels=32,image=32,classes=10]
///   torchscript:path=FILE.pt,batch=BATCH.pt[,loss=cross_entropy|mse]   (or FILE.pt:batch=…)
///   torchscript:path=FILE.pt,input=[long:]3x32x32,classes=10|vocab=V[,loss=…]
/// A TorchScript file's top level must be a Sequential; its children are the layers.
/// Throws InputError naming the key and what was expected.
Model build_model(const std::string& spec, const ModelOptions& options = {});

/// Refuses, before any training, what would fail in the first step: a batch file with fewer
/// samples than `batch`, an input a layer rejects (its dtype, its shape), an output with no
/// last dimension to classify, targets whose shape cannot match the output. Runs the first
/// min(batch, 2) samples of step 0 through the layers on the CPU, without autograd and in
/// evaluation mode (no running statistics move). Throws InputError naming the layer or shapes.
void check_model_batch(Model& model, std::int64_t batch);

/// The fewest samples a micro-batch of `model` may hold, and why fewer fail (empty at 1).
struct TrainableSize {
  std::int64_t samples = 1;
  std::string reason;  ///< the first layer that refused a smaller size, and torch's reason
};

/// Tries a training-mode forward (no autograd; every buffer and the CPU generator's state put
/// back) of 1, 2, ... samples of the model's step 0 until the layers take one: batch norm cannot
/// train on one value per channel, so a network whose last feature maps are 1 x 1 cannot train on
/// micro-batches of one sample. Throws InputError with the first refusal if even `batch` fails.
TrainableSize smallest_trainable_micro_batch(Model& model, std::int64_t batch);

/// Throws InputError, `what` first, where the layers cannot train on `samples` samples. Tries
/// 1, 2, ... samples first and stops at the first size that trains.
void check_trains_on(Model& model, std::int64_t samples, const std::string& what);

/// The models build_model knows, one line each, for --help texts and errors.
std::string model_catalogue();

}  // namespace pipetune::models
