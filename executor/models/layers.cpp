#include "executor/models/layers.hpp"

#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include <mutex>

namespace pipetune::models {

namespace {
thread_local ScopedGenerator::State current_generator;
thread_local bool recomputing = false;

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}
}  // namespace

ScopedGenerator::ScopedGenerator(at::Generator* generator) : previous_(current_generator) {
  current_generator = State{generator};
}
ScopedGenerator::ScopedGenerator(at::Generator* generator, std::uint64_t seed)
    : previous_(current_generator) {
  current_generator = State{generator, /*per_layer=*/true, seed};
}
ScopedGenerator::~ScopedGenerator() {
  current_generator = previous_;
}
at::Generator* ScopedGenerator::current() {
  State& state = current_generator;
  if (state.generator != nullptr && state.reseed) {
    state.reseed = false;
    std::lock_guard<std::mutex> lock(state.generator->mutex());
    state.generator->set_current_seed(splitmix(state.seed ^ splitmix(state.layer + 1)));
  }
  return state.generator;
}
void ScopedGenerator::enter_layer(std::size_t layer) {
  State& state = current_generator;
  state.layer = layer;
  state.reseed = state.per_layer;
}

ScopedRecompute::ScopedRecompute() : previous_(recomputing) {
  recomputing = true;
}
ScopedRecompute::~ScopedRecompute() {
  recomputing = previous_;
}
bool ScopedRecompute::active() {
  return recomputing;
}

StageDropoutImpl::StageDropoutImpl(double p) : p_(p) {}

at::Tensor StageDropoutImpl::forward(const at::Tensor& x) {
  if (!is_training() || p_ <= 0.0) return x;
  std::optional<at::Generator> generator;
  if (auto* g = ScopedGenerator::current()) generator = *g;
  const at::Tensor keep = at::empty_like(x).bernoulli_(1.0 - p_, generator);
  return x * keep / (1.0 - p_);
}

DeferredBatchNorm2dImpl::DeferredBatchNorm2dImpl(std::int64_t channels, double momentum, double eps)
    : momentum_(momentum), eps_(eps) {
  weight = register_parameter("weight", at::ones({channels}));
  bias = register_parameter("bias", at::zeros({channels}));
  running_mean = register_buffer("running_mean", at::zeros({channels}));
  running_var = register_buffer("running_var", at::ones({channels}));
}

at::Tensor DeferredBatchNorm2dImpl::forward(const at::Tensor& x) {
  if (!is_training()) {
    return at::batch_norm(x, weight, bias, running_mean, running_var, false, momentum_, eps_, true);
  }
  if (!ScopedRecompute::active()) {
    at::NoGradGuard no_grad;
    const at::Tensor d = x.detach();
    const std::vector<std::int64_t> dims{0, 2, 3};
    const at::Tensor s = d.sum(dims), s2 = (d * d).sum(dims);
    if (count_ == 0) {
      sum_ = s;
      sum_of_squares_ = s2;
    } else {
      sum_ = sum_ + s;
      sum_of_squares_ = sum_of_squares_ + s2;
    }
    count_ += d.size(0) * d.size(2) * d.size(3);
  }
  // Normalise with this micro-batch's own statistics; leave the running ones for commit().
  return at::batch_norm(x, weight, bias, std::nullopt, std::nullopt, true, momentum_, eps_, true);
}

void DeferredBatchNorm2dImpl::commit() {
  if (count_ == 0) return;
  at::NoGradGuard no_grad;
  const double n = static_cast<double>(count_);
  const at::Tensor mean = sum_ / n;
  const at::Tensor variance = sum_of_squares_ / n - mean * mean;
  const at::Tensor unbiased = n > 1 ? variance * (n / (n - 1.0)) : variance;
  running_mean.mul_(1.0 - momentum_).add_(mean.to(running_mean.dtype()), momentum_);
  running_var.mul_(1.0 - momentum_).add_(unbiased.to(running_var.dtype()), momentum_);
  count_ = 0;
}

void commit_deferred_batch_norms(torch::nn::Module& module) {
  for (const auto& child : module.modules(/*include_self=*/true)) {
    if (auto* bn = child->as<DeferredBatchNorm2dImpl>()) bn->commit();
  }
}

}  // namespace pipetune::models
