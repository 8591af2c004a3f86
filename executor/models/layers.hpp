#pragma once

// Layers whose behaviour a pipeline must control: randomness and batch statistics.

#include <ATen/core/Generator.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

namespace pipetune::models {

/// The generator dropout draws from on this thread. The executor gives each (step, stage,
/// micro-batch) its own seed, so a recompute reproduces the forward's masks exactly while other
/// stages run concurrently; without one set, the global default generator is used.
class ScopedGenerator {
 public:
  explicit ScopedGenerator(at::Generator* generator);
  ~ScopedGenerator();
  ScopedGenerator(const ScopedGenerator&) = delete;
  ScopedGenerator& operator=(const ScopedGenerator&) = delete;
  static at::Generator* current();

 private:
  at::Generator* previous_;
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
