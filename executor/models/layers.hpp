#pragma once

// Layers whose behaviour a pipeline must control: randomness and batch statistics.

#include <ATen/core/Generator.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <cstdint>

namespace pipetune::models {

/// The generator random layers draw from on this thread; without one set, the global default
/// generator. The executor gives each (step, micro-batch) a seed and enters each layer as it runs
/// it (enter_layer, by its index in the whole model): a layer's first draw reseeds the generator
/// from that seed and the layer's index. So a layer draws the same masks in a recompute as in its
/// forward, whatever ran meanwhile, and whichever stage holds it: any split of the model draws
/// what one device draws. Entering a layer costs two thread-local stores; only a layer that draws
/// pays for the reseed.
class ScopedGenerator {
 public:
  /// Draws continue the generator's stream (the profiler's repeated timings).
  explicit ScopedGenerator(at::Generator* generator);
  /// Draws of each entered layer from `seed` and the layer's index.
  ScopedGenerator(at::Generator* generator, std::uint64_t seed);
  ~ScopedGenerator();
  ScopedGenerator(const ScopedGenerator&) = delete;
  ScopedGenerator& operator=(const ScopedGenerator&) = delete;
  /// The generator to draw from, reseeded for the entered layer at its first draw.
  static at::Generator* current();
  /// The layer about to run, by its index in the model. Entering it again (a recompute) starts
  /// its draws over.
  static void enter_layer(std::size_t layer);

  struct State {
    at::Generator* generator = nullptr;
    bool per_layer = false;
    std::uint64_t seed = 0;
    std::size_t layer = 0;
    bool reseed = false;  // entered and not drawn from yet
  };

 private:
  State previous_;
};

/// True while the executor recomputes a checkpointed micro-batch (thread-local): layers that
/// accumulate state (deferred batch norm) must not count that micro-batch twice.
class ScopedRecompute {
 public:
  ScopedRecompute();
  ~ScopedRecompute();
  static bool active();

 private:
  bool previous_;
};

/// Dropout that draws its mask from ScopedGenerator::current().
class StageDropoutImpl : public torch::nn::Module {
 public:
  explicit StageDropoutImpl(double p);
  at::Tensor forward(const at::Tensor& x);

 private:
  double p_;
};
TORCH_MODULE(StageDropout);

/// torchgpipe's deferred batch norm: each micro-batch is normalised with its own statistics (as
/// BatchNorm2d in training mode), but the running statistics are updated once per mini-batch,
/// from the statistics of the whole mini-batch, when commit() is called. So pipelined training
/// keeps the running statistics a full-batch BatchNorm would.
class DeferredBatchNorm2dImpl : public torch::nn::Module {
 public:
  explicit DeferredBatchNorm2dImpl(std::int64_t channels, double momentum = 0.1, double eps = 1e-5);
  at::Tensor forward(const at::Tensor& x);
  /// Folds the micro-batches seen since the last commit into the running statistics.
  void commit();

  at::Tensor weight, bias, running_mean, running_var;

 private:
  double momentum_, eps_;
  at::Tensor sum_, sum_of_squares_;
  std::int64_t count_ = 0;
};
TORCH_MODULE(DeferredBatchNorm2d);

/// Calls commit() on every DeferredBatchNorm2d inside `module`.
void commit_deferred_batch_norms(torch::nn::Module& module);

}  // namespace pipetune::models
