#include "profiler/profiler.hpp"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/version.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_set>

#include "executor/device_name.hpp"
#include "executor/models/gradient_flow.hpp"
#include "executor/models/layers.hpp"
#include "executor/models/model.hpp"
#include "executor/models/shared_tensors.hpp"
#include "executor/sm_partitions.hpp"
#include "profiler/backend.hpp"
#include "profiler/cpu_cache.hpp"
#include "profiler/host_pace.hpp"
#include "profiler/peak_release.hpp"
#include "sim/after_idle.hpp"
#include "sim/error.hpp"

namespace pipetune::profiler {

namespace {

struct Statistics {
  double median = 0.0;
  double spread = 0.0;  // median absolute deviation
};

Statistics statistics(std::vector<double> v) {
  Statistics s;
  if (v.empty()) return s;
  auto median_of = [](std::vector<double>& x) {
    std::sort(x.begin(), x.end());
    const std::size_t n = x.size();
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
  };
  s.median = median_of(v);
  for (auto& x : v) x = std::abs(x - s.median);
  s.spread = median_of(v);
  return s;
}

std::int64_t bytes_of(const at::Tensor& t) {
  return t.defined() ? static_cast<std::int64_t>(t.nbytes()) : 0;
}

// A layer of the model and what running it means: its forward, plus the loss for the last one.
struct Runner {
  torch::nn::AnyModule& layer;
  models::Model& model;
  bool last;
  const at::Tensor& target;
  // Whether its input needs a gradient (models::inputs_wanting_gradients), as the executor asks
  // it of a stage's input.
  bool input_wants_gradient;
  // Returns what backward starts from (the loss, or the output) and the output.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& x) {
    at::Tensor y = layer.forward(x);
    if (!last) return {y, y};
    return {model.loss(y, target), y};
  }
};

// A layer's input as a stage's intermediate: a storage of its own (so what keeps it alive can
// be seen), with a graph behind it when it needs a gradient (so a layer that works in place
// may modify it). The gradient arrives in `leaf`.
struct LayerInput {
  at::Tensor leaf, x;
};
LayerInput layer_input(const at::Tensor& previous, bool wants_gradient) {
  LayerInput in;
  if (!wants_gradient || !at::isFloatingType(previous.scalar_type())) {
    in.x = previous.detach().clone();
    return in;
  }
  in.leaf = previous.detach().requires_grad_(true);
  in.x = in.leaf.clone();
  return in;
}

// The model's layers as the profiler runs them, each knowing whether its input needs a
// gradient (models::inputs_wanting_gradients).
struct ModelLayers {
  ModelLayers(models::Model& model, std::vector<torch::nn::AnyModule*>& modules)
      : model(model),
        modules(modules),
        wants(models::inputs_wanting_gradients(model)),
        count(static_cast<int>(modules.size())) {}
  // Layer l, with the loss on `target` where it is the last.
  Runner runner(int l, const at::Tensor& target) const {
    return Runner{*modules[l], model, l + 1 == count, target, wants[l] != 0};
  }

  models::Model& model;
  std::vector<torch::nn::AnyModule*>& modules;
  const std::vector<char> wants;
  const int count;
};

void reset_gradients(torch::nn::Module& module, LayerInput& input) {
  for (auto& p : module.parameters()) p.mutable_grad().reset();
  if (input.leaf.defined()) input.leaf.mutable_grad().reset();
}

std::vector<std::int64_t> checked_sizes(const ProfileOptions& options) {
  if (options.batch_size < 1) {
    throw InputError(Input::BatchSize,
                     fmt::format("expected a positive integer, got {}", options.batch_size));
  }
  if (options.launch_times != "auto" && options.launch_times != "on" &&
      options.launch_times != "off") {
    throw InputError(
        fmt::format("launch times: expected auto, on or off, got '{}'", options.launch_times));
  }
  if (options.repeats < 1)
    throw InputError(Input::Repeats, fmt::format("expected at least 1, got {}", options.repeats));
  std::vector<std::int64_t> sizes = options.micro_batch_sizes.empty()
                                        ? default_micro_batch_sizes(options.batch_size)
                                        : options.micro_batch_sizes;
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  for (auto s : sizes) {
    if (s < 1 || s > options.batch_size) {
      throw InputError(Input::MicroBatchSizes,
                       fmt::format("expected sizes from 1 to {} (the batch size), got {}",
                                   options.batch_size, s));
    }
  }
  return sizes;
}

// The sizes from the fewest samples a micro-batch may hold: the defaults start there, sizes
// asked for below it are refused.
std::vector<std::int64_t> trainable_sizes(std::vector<std::int64_t> sizes,
                                          const ProfileOptions& options,
                                          const models::TrainableSize& least) {
  if (least.samples == 1) return sizes;
  if (!options.micro_batch_sizes.empty() && sizes.front() < least.samples) {
    throw InputError(Input::MicroBatchSizes,
                     fmt::format("expected sizes of at least {}, got {}: {}", least.samples,
                                 sizes.front(), least.reason));
  }
  std::erase_if(sizes, [&](std::int64_t s) { return s < least.samples; });
  if (sizes.empty() || sizes.front() != least.samples) sizes.insert(sizes.begin(), least.samples);
  return sizes;
}

// "cpu" or "cuda[:<n>]", read as the executor reads device names.
std::unique_ptr<MeasureBackend> make_backend(const ProfileOptions& options) {
  const auto device = exec::try_parse_device_name(options.device);
  if (device && device->kind == exec::DeviceKind::Cpu && !device->has_index) {
    return make_cpu_backend(options.threads);
  }
  if (device && device->kind == exec::DeviceKind::Cuda)
    return make_cuda_backend(device->index, options.timer);
  throw InputError(Input::Device, fmt::format("expected cpu or cuda, got \"{}\"", options.device));
}

// The profile's header and each layer's name and parameters; the per-size arrays come later.
Profile empty_profile(models::Model& model, MeasureBackend& backend, at::ScalarType dtype,
                      const ProfileOptions& options, const std::vector<std::int64_t>& sizes) {
  Profile profile;
  profile.model = model.name;
  profile.device = {backend.device_type(), backend.device_name(), backend.memory_bytes()};
  profile.dtype = dtype == at::kDouble     ? "float64"
                  : dtype == at::kHalf     ? "float16"
                  : dtype == at::kBFloat16 ? "bfloat16"
                                           : "float32";
  profile.timer = backend.timer_name();
  profile.batch_size = options.batch_size;
  profile.micro_batch_sizes = sizes;
  profile.layers.resize(model.layer_names.size());
  auto layer = model.layers->begin();
  // Each layer is charged what it holds, each tensor once; a tensor several layers hold (tied
  // weights) is listed as tied, so a stage holding several of them counts it once.
  for (std::size_t l = 0; l < profile.layers.size(); ++l, ++layer) {
    LayerProfile& out = profile.layers[l];
    out.name = model.layer_names[l];
    std::unordered_set<const void*> counted;
    std::int64_t trained = 0;
    for (const auto& p : layer->ptr()->parameters()) {
      if (counted.insert(p.unsafeGetTensorImpl()).second) {
        out.param_bytes += bytes_of(p);
        if (p.requires_grad()) trained += bytes_of(p);
      }
    }
    // Written only where some parameter is frozen, so other profiles read as before.
    if (trained != out.param_bytes) out.trainable_param_bytes = trained;
    // Its buffers by storage, as the executor counts what a device holds (a buffer that views
    // another's storage adds nothing).
    std::unordered_set<const void*> storages;
    for (const auto& b : layer->ptr()->buffers()) {
      if (!b.defined() || !b.has_storage() || counted.count(b.unsafeGetTensorImpl())) continue;
      if (storages.insert(b.storage().data()).second)
        out.buffer_bytes += static_cast<std::int64_t>(b.storage().nbytes());
    }
  }
  for (const models::TiedParameter& t : models::tied_parameters(model)) {
    TiedTensor tied{t.name, {}, bytes_of(t.tensor), t.tensor.requires_grad()};
    for (std::size_t l : t.layers) tied.layers.push_back(static_cast<int>(l));
    profile.tied.push_back(std::move(tied));
  }
  return profile;
}

// Each layer's median times at one size, and their spreads.
struct LayerTimes {
  Statistics forward, backward, forward_nograd, backward_input, backward_weight;
  Statistics forward_cold, backward_cold;  ///< with the cache emptied first; empty when not timed
  // Right after a sweep like the optimizer's (forward_step_start_ms); empty when not timed.
  Statistics forward_step_start;
};

// Writes `buffer` through: what the cache held before is gone (the buffer is a few times its
// size). The sink keeps the compiler from dropping the writes.
void empty_cache(std::vector<std::uint8_t>& buffer) {
  static std::uint8_t fill = 0;
  std::fill(buffer.begin(), buffer.end(), ++fill);
  volatile std::uint8_t sink = buffer[buffer.size() / 2];
  (void)sink;
}

// The parameters a backward can reach (frozen ones have no gradient to compute).
std::vector<at::Tensor> trainable_parameters(torch::nn::AnyModule& layer) {
  std::vector<at::Tensor> out;
  for (auto& p : layer.ptr()->parameters()) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

// Runs `work` with the backend not watching the host's calls (MeasureBackend::watch_launches),
// watching again afterwards, also when `work` throws.
template <typename Work>
auto unwatched(MeasureBackend& backend, Work&& work) {
  backend.watch_launches(false);
  try {
    auto result = work();
    backend.watch_launches(true);
    return result;
  } catch (...) {
    backend.watch_launches(true);
    throw;
  }
}

// A backward call's own host time beyond its layers' launches (autograd hands the graph to its
// device thread and waits for it), which every layer's backward in the host pass includes and a
// stage's backward pays once: backwards through one and through two small products on the
// device, t1 = call + 2 launches (product, gradient accumulation), t2 = call + 3, so the call is
// 2 t1 - t2. Timed with nothing watching the calls, each from an idle device.
double measure_backward_call_ms(MeasureBackend& backend, int repeats) {
  const at::Tensor leaf =
      at::ones({1}, at::TensorOptions().device(backend.device())).requires_grad_(true);
  auto backward_through = [&](int products) {
    std::vector<double> took;
    for (int r = 0; r < std::max(repeats, 5); ++r) {
      at::Tensor out = leaf;
      for (int k = 0; k < products; ++k) out = out * 2.0;
      const at::Tensor seed = at::ones_like(out);
      backend.synchronize();
      const auto started = std::chrono::steady_clock::now();
      torch::autograd::backward({out}, {seed});
      took.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
              .count());
    }
    return statistics(took).median;
  };
  return unwatched(backend, [&] {
    const double one = backward_through(1), two = backward_through(2);
    return std::max(0.0, 2.0 * one - two);
  });
}

using HostClock = std::chrono::steady_clock;

double ms_between(HostClock::time_point from, HostClock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// Each layer's share of one backward call through layers [first, reached.size()), in ms: from
// when the gradient of its output came in (reached[l]; the call's start for the last layer) to
// when its input's did (reached[l - 1]; the call's end for `first`). An output whose gradient
// never came (a layer that ignores its input) ends no backward: the layer after takes the time.
// The call's own time is taken out half at each end, where it falls.
std::vector<double> backward_shares(std::vector<std::optional<HostClock::time_point>> reached,
                                    int first, HostClock::time_point started,
                                    HostClock::time_point ended, double call_ms) {
  const int layer_count = static_cast<int>(reached.size());
  for (int l = layer_count - 2; l >= first; --l) {
    if (!reached[l]) reached[l] = l + 2 == layer_count ? started : *reached[l + 1];
  }
  std::vector<double> shares(layer_count, 0.0);
  for (int l = layer_count - 1; l >= first; --l) {
    const HostClock::time_point from = l + 1 == layer_count ? started : *reached[l];
    const HostClock::time_point to = l == first ? ended : *reached[l - 1];
    double took = ms_between(from, to);
    if (l + 1 == layer_count) took -= 0.5 * call_ms;
    if (l == first) took -= 0.5 * call_ms;
    shares[l] = std::max(0.0, took);
  }
  return shares;
}

// Each layer's host time per repetition, in ms: forward without autograd, forward, backward.
struct HostTimes {
  std::vector<std::vector<double>> nograd, forward, backward;
};

// A host's calls timed, layer by layer, in repetitions over each micro-batch size.
class HostCallTimer {
 public:
  HostCallTimer(models::Model& model, std::vector<torch::nn::AnyModule*>& modules,
                MeasureBackend& backend, double backward_call_ms)
      : layers_(model, modules), backend_(backend), backward_call_ms_(backward_call_ms) {}

  // The forward without autograd, then the forward and backward through one graph.
  void repetition(HostTimes& host, const at::Tensor& input, const at::Tensor& target, bool timed) {
    nograd_pass(host, input, target, timed);
    graph_pass(host, input, target, timed);
  }
  // Whether a layer's input is a copy of the layer before's output: only where a layer
  // modifies its input in place and the layer before saved that output for its backward, which
  // one graph cannot hold (the device pass copies every input, a pipeline the first of each
  // stage).
  bool copy_inputs = false;

 private:
  void nograd_pass(HostTimes& host, const at::Tensor& input, const at::Tensor& target, bool timed) {
    at::NoGradGuard no_grad;
    at::Tensor current = input.clone();  // the batch itself stays as it is
    backend_.synchronize();
    auto mark = HostClock::now();
    for (int l = 0; l < layers_.count; ++l) {
      Runner run = layers_.runner(l, target);
      current = run.forward(current).second;
      const auto now = HostClock::now();
      if (timed) host.nograd[l].push_back(ms_between(mark, now));
      mark = now;
    }
  }
  void graph_pass(HostTimes& host, const at::Tensor& input, const at::Tensor& target, bool timed) {
    // One graph through every layer, as within a stage.
    // reached[l]: when the gradient of layer l's output is in, so layer l's backward starts. Each
    // hook is set as the output is made, so that a next layer working on it in place does not
    // move it (a hook set before an in-place change sees the gradient of the value before it).
    std::vector<at::Tensor> outputs(layers_.count);
    std::vector<std::optional<HostClock::time_point>> reached(layers_.count);
    at::Tensor root;
    at::Tensor current = input.clone();
    backend_.synchronize();
    auto mark = HostClock::now();
    for (int l = 0; l < layers_.count; ++l) {
      // An input without a graph behind it asks for its gradient all the same where a layer
      // before trains, as a stage's input does and as the device pass times it.
      if (layers_.wants[l] && at::isFloatingType(current.scalar_type()) && !current.requires_grad())
        current = current.detach().requires_grad_(true);
      else if (l > 0 && copy_inputs)
        current = current.clone();
      Runner run = layers_.runner(l, target);
      std::tie(root, current) = run.forward(current);
      outputs[l] = current;
      const auto now = HostClock::now();
      if (timed) host.forward[l].push_back(ms_between(mark, now));
      if (l + 1 < layers_.count && current.requires_grad())
        current.register_hook([&reached, l](const at::Tensor&) { reached[l] = HostClock::now(); });
      mark = HostClock::now();
    }
    if (!root.requires_grad()) return;  // nothing has a gradient: no backward
    // The layers before the first output without a gradient have no backward (as a first layer
    // without parameters has none).
    int first_with_backward = layers_.count - 1;
    while (first_with_backward > 0 && outputs[first_with_backward - 1].requires_grad())
      --first_with_backward;
    backend_.synchronize();
    const auto started = HostClock::now();
    torch::autograd::backward({root});
    const auto ended = HostClock::now();
    if (!timed) return;
    const std::vector<double> shares =
        backward_shares(std::move(reached), first_with_backward, started, ended, backward_call_ms_);
    for (int l = first_with_backward; l < layers_.count; ++l) host.backward[l].push_back(shares[l]);
  }

  const ModelLayers layers_;
  MeasureBackend& backend_;
  const double backward_call_ms_;
};

// The host's pace: each layer's calls timed by the steady clock as a stage makes them, in one
// untimed and `repeats` timed repetitions with nothing watching the calls (CUPTI's callbacks
// would slow them). Every pass starts from an idle device, and its layers' calls follow each
// other with no wait between them: one graph through every layer and one backward call for all,
// each layer's backward bounded by the hooks on the gradients of its output and its input.
// Timing each layer by itself, as the device pass does, made an H200 GPT's launch sums 25 %
// longer than its whole step: a call per layer and a synchronize before each cost more than a
// stage pays. A launch queue that fills makes the host wait only where the device's time is the
// larger anyway. The one backward call's own time (`backward_call_ms`, paid once per stage) is
// taken out of the layers it falls on: its start before the last layer, its end after the
// first that has a backward.
//
// The sizes take turns, repetition by repetition (every size's untimed one first), so that a
// slow minute of the host's lands on every size alike instead of on the one being timed: on a
// lent H200 the same calls timed size after size came out 1.1, 1.9 and 2.2 ms. The host's pace
// (host_pace.hpp) is taken before every round of sizes; `paces` gets each.
std::vector<HostTimes> time_host_calls(
    models::Model& model, std::vector<torch::nn::AnyModule*>& modules,
    const std::vector<std::pair<at::Tensor, at::Tensor>>& batches, MeasureBackend& backend,
    int repeats, double backward_call_ms, std::vector<double>& paces) {
  const int layer_count = static_cast<int>(modules.size());
  std::vector<HostTimes> by_size(batches.size());
  for (HostTimes& host : by_size) {
    host.nograd.resize(layer_count);
    host.forward.resize(layer_count);
    host.backward.resize(layer_count);
  }
  HostCallTimer timer(model, modules, backend, backward_call_ms);
  const std::string device = backend.device().str();
  unwatched(backend, [&] {
    // The untimed repetitions first: the first calls after CUPTI lets go pay for it.
    for (std::size_t s = 0; s < batches.size(); ++s) {
      const auto& [input, target] = batches[s];
      try {
        timer.repetition(by_size[s], input, target, false);
      } catch (const c10::Error&) {
        // Autograd refused a saved tensor modified in place: again, with copies between layers.
        timer.copy_inputs = true;
        timer.repetition(by_size[s], input, target, false);
      }
    }
    for (int r = 0; r < repeats; ++r) {
      paces.push_back(measure_host_pace_us(device));
      for (std::size_t s = 0; s < batches.size(); ++s)
        timer.repetition(by_size[s], batches[s].first, batches[s].second, true);
    }
    backend.synchronize();
    return 0;
  });
  return by_size;
}

class LayerTimer {
 public:
  LayerTimer(models::Model& model, std::vector<torch::nn::AnyModule*>& modules,
             const at::Tensor& input, const at::Tensor& target, MeasureBackend& backend)
      : layers_(model, modules),
        input_(input),
        target_(target),
        backend_(backend),
        ids_(static_cast<std::size_t>(layers_.count)) {}

  // One repetition: the forward without autograd, the forward and the backward through every
  // layer, and the split backward.
  void repetition(bool timed) {
    nograd_pass(timed);
    forward_backward_pass(timed, &RegionIds::forward, &RegionIds::backward, [] {});
    // Parameter gradients stay allocated and accumulate, as in every backward of a stage but
    // its first.
    split_backward_pass(timed);
  }
  // The forward and backward again, each layer after the cache was emptied.
  void cold_pass(std::vector<std::uint8_t>& flush) {
    forward_backward_pass(true, &RegionIds::cold_forward, &RegionIds::cold_backward,
                          [&] { empty_cache(flush); });
  }
  // Once a pass, as once a step: the layers after the first run on the data their forerunners
  // left, as a stage's layers do in its first task (a sweep before each layer made every input
  // cold too, and predicted the ViT's first tasks 15-18 % long).
  void step_start_pass() {
    at::Tensor current = input_;
    sweep_parameters();
    for (int l = 0; l < layers_.count; ++l) {
      const LayerInput in = layer_input(current, layers_.wants[l] != 0);
      Runner run = layers_.runner(l, target_);
      current = region(true, ids_[l].step_start, [&] { return run.forward(in.x); }).second;
    }
  }
  // Each layer's statistics over its timed regions.
  std::vector<LayerTimes> collect() {
    const auto times = backend_.collect_ms();
    auto pick = [&](const std::vector<std::uint64_t>& ids) {
      std::vector<double> v;
      for (auto id : ids) {
        auto it = times.find(id);
        v.push_back(it == times.end() ? 0.0 : it->second);  // no device work at all: 0
      }
      return statistics(v);
    };
    std::vector<LayerTimes> out(layers_.count);
    for (int l = 0; l < layers_.count; ++l) {
      const RegionIds& r = ids_[l];
      out[l] = {pick(r.forward), pick(r.backward),     pick(r.nograd),        pick(r.input),
                pick(r.weight),  pick(r.cold_forward), pick(r.cold_backward), pick(r.step_start)};
    }
    return out;
  }

 private:
  // A layer's timed regions, by what they time.
  struct RegionIds {
    std::vector<std::uint64_t> forward, backward, nograd, input, weight, cold_forward,
        cold_backward, step_start;
  };
  using Ids = std::vector<std::uint64_t> RegionIds::*;

  // Runs `work` as a region of `ids` when the repetition is timed.
  template <typename Work>
  std::invoke_result_t<Work&> region(bool timed, std::vector<std::uint64_t>& ids, Work&& work) {
    const std::uint64_t id = next_region_++;
    if (timed) backend_.begin(id);
    auto result = work();
    if (timed) {
      backend_.end(id);
      ids.push_back(id);
    }
    return result;
  }
  // Each layer's input (a leaf where it wants a gradient) and what its backward starts from.
  struct Forwarded {
    std::vector<LayerInput> inputs;
    std::vector<at::Tensor> roots;
    at::Tensor output;  // the last layer's, alive through the backward as a stage's is
  };
  // The forward through every layer, each on its own input; `run_layer(l, run, x)` runs layer
  // l and returns (root, output).
  template <typename RunLayer>
  Forwarded forward_through(RunLayer&& run_layer) {
    Forwarded f{std::vector<LayerInput>(layers_.count), std::vector<at::Tensor>(layers_.count),
                input_};
    for (int l = 0; l < layers_.count; ++l) {
      f.inputs[l] = layer_input(f.output, layers_.wants[l] != 0);
      Runner run = layers_.runner(l, target_);
      std::tie(f.roots[l], f.output) = run_layer(l, run, f.inputs[l].x);
    }
    return f;
  }
  // The forward a checkpointed micro-batch runs: no autograd, nothing saved.
  void nograd_pass(bool timed) {
    at::NoGradGuard no_grad;
    at::Tensor current = input_;
    for (int l = 0; l < layers_.count; ++l) {
      Runner run = layers_.runner(l, target_);
      current = region(timed, ids_[l].nograd, [&] { return run.forward(current).second; });
    }
  }
  // The forward and the backward through every layer, each layer's timed as its `forward` and
  // `backward` regions, `before_each` run before each (outside the timing).
  template <typename Before>
  void forward_backward_pass(bool timed, Ids forward, Ids backward, Before&& before_each) {
    Forwarded f = forward_through([&](int l, Runner& run, const at::Tensor& x) {
      before_each();
      return region(timed, ids_[l].*forward, [&] { return run.forward(x); });
    });
    std::vector<LayerInput>& inputs = f.inputs;
    std::vector<at::Tensor>& roots = f.roots;
    at::Tensor gradient;  // flowing back from the layer after
    for (int l = layers_.count - 1; l >= 0; --l) {
      if (!roots[l].requires_grad()) break;  // nothing before can need a gradient either
      before_each();
      region(timed, ids_[l].*backward, [&] {
        if (l + 1 == layers_.count) {
          torch::autograd::backward({roots[l]});
        } else {
          torch::autograd::backward({roots[l]}, {gradient});
        }
        return 0;
      });
      gradient = inputs[l].leaf.defined() ? inputs[l].leaf.grad() : at::Tensor();
      roots[l] = at::Tensor();
      if (!gradient.defined()) break;
    }
  }
  // The backward split as zero-bubble schedules run it, after a forward of its own: per layer,
  // I (the input's gradient, the graph kept) then W (the parameters' gradients from that
  // graph). A layer whose input needs no gradient (the model's first, or any up to the first
  // that trains) has no I; its W is its whole backward, as torch's first stage runs it. A layer
  // without parameters has no W.
  void split_backward_pass(bool timed) {
    Forwarded f =
        forward_through([](int, Runner& run, const at::Tensor& x) { return run.forward(x); });
    std::vector<LayerInput>& inputs = f.inputs;
    std::vector<at::Tensor>& roots = f.roots;
    at::Tensor gradient;  // the input gradient I of the layer after
    for (int l = layers_.count - 1; l >= 0; --l) {
      if (!roots[l].requires_grad()) break;
      const bool last = l + 1 == layers_.count;
      const std::vector<at::Tensor> seed =
          last ? std::vector<at::Tensor>{} : std::vector<at::Tensor>{gradient};
      const std::vector<at::Tensor> parameters = trainable_parameters(*layers_.modules[l]);
      at::Tensor input_gradient;
      if (inputs[l].leaf.defined()) {
        input_gradient = region(timed, ids_[l].input, [&] {
          return torch::autograd::grad({roots[l]}, {inputs[l].leaf}, seed,
                                       /*retain_graph=*/!parameters.empty(),
                                       /*create_graph=*/false, /*allow_unused=*/true)[0];
        });
      }
      if (!parameters.empty()) {
        region(timed, ids_[l].weight, [&] {
          torch::autograd::backward({roots[l]}, seed, /*retain_graph=*/false,
                                    /*create_graph=*/false, parameters);
          return 0;
        });
      }
      roots[l] = at::Tensor();
      gradient = input_gradient;
      if (!gradient.defined()) break;
    }
  }
  // The optimizer's sweep before a step's first task: every parameter read and written, every
  // gradient read (multiplied by one in place: nothing changes). On a CPU it leaves the caches
  // holding the whole model's parameters and gradients, which the model's 4 MB-flush cold
  // times do not: a pipeline's first forward of a step measured 13-16 % over its prediction
  // without it.
  void sweep_parameters() {
    at::NoGradGuard no_grad;
    for (torch::nn::AnyModule* module : layers_.modules) {
      for (const at::Tensor& p : trainable_parameters(*module)) {
        p.detach().mul_(1.0);
        if (p.grad().defined()) p.grad().detach().mul_(1.0);
      }
    }
  }

  const ModelLayers layers_;
  const at::Tensor& input_;
  const at::Tensor& target_;
  MeasureBackend& backend_;
  std::uint64_t next_region_ = 1;
  std::vector<RegionIds> ids_;
};

// Time, in context: each repetition is one forward pass through every layer and one backward
// pass back, each layer timed on its own within it. Timing a layer alone, again and again,
// would keep its weights in cache, which a pipeline streaming micro-batches through many
// layers does not; small-batch layers are bound by memory, so that matters. Layers are joined
// by detached tensors, so each backward can be timed by itself.
//
// With `cache_bytes` > 0, each layer is also timed cold: the same passes with the cache emptied
// before each layer's forward and each layer's backward (sim/cache_model.hpp); and its forward
// as a step's first task runs it, right after a sweep over every parameter and gradient such as
// the optimizer's step makes (LayerProfile::forward_step_start_ms).
std::vector<LayerTimes> time_layers(models::Model& model,
                                    std::vector<torch::nn::AnyModule*>& modules,
                                    const at::Tensor& input, const at::Tensor& target,
                                    MeasureBackend& backend, const ProfileOptions& options,
                                    std::int64_t cache_bytes) {
  LayerTimer timer(model, modules, input, target, backend);
  for (int r = 0; r < options.warmup + options.repeats; ++r) timer.repetition(r >= options.warmup);
  std::vector<std::uint8_t> flush(static_cast<std::size_t>(std::max<std::int64_t>(cache_bytes, 0)) *
                                  4);
  if (!flush.empty()) {
    for (int r = 0; r < options.repeats; ++r) timer.cold_pass(flush);
    for (int r = 0; r < options.repeats; ++r) timer.step_start_pass();
  }
  return timer.collect();
}

// How much slower a layer runs beside co-runners than alone (1: no slower).
struct Slowdown {
  double forward = 1.0, backward = 1.0;
};

// One forward and backward of a layer on its own copy of `previous`, as a co-runner or the
// timed thread runs it; `timed` brackets each half as a region of the backend.
template <typename Region>
void forward_backward(Runner& run, const at::Tensor& previous, Region&& region) {
  LayerInput in = layer_input(previous, run.input_wants_gradient);
  std::pair<at::Tensor, at::Tensor> pair;
  region(true, [&] { pair = run.forward(in.x); });
  if (!pair.first.requires_grad()) return;  // a first layer without parameters: no backward
  const at::Tensor seed = run.last ? at::Tensor() : at::ones_like(pair.first);
  region(false, [&] {
    if (run.last) {
      torch::autograd::backward({pair.first});
    } else {
      torch::autograd::backward({pair.first}, {seed});
    }
  });
}

// A copy of the layer for a co-runner, so that it has parameters and gradients of its own as
// another device would; a layer that cannot be cloned (a TorchScript one) is shared, its
// gradients then accumulated by both, which costs the same work.
torch::nn::AnyModule own_copy(torch::nn::AnyModule& layer) {
  try {
    return layer.clone();
  } catch (const std::exception&) {
    return layer;
  }
}

// The layer's forward and backward timed alone, then beside `co_runners` threads that each run
// their own copy of it in a loop with `threads` intra-op threads, as the other CPU devices of a
// pipeline do. Medians of `repeats` repetitions after `warmup`, alone and beside, back to back.
Slowdown measure_slowdown(Runner& run, const at::Tensor& previous, MeasureBackend& backend,
                          const ProfileOptions& options, int threads) {
  std::uint64_t next_region = 1;
  auto time_repetitions = [&]() {
    std::vector<std::uint64_t> forward_ids, backward_ids;
    for (int r = 0; r < options.warmup + options.repeats; ++r) {
      const bool timed = r >= options.warmup;
      forward_backward(run, previous, [&](bool forward, auto&& work) {
        const std::uint64_t id = next_region++;
        if (timed) backend.begin(id);
        work();
        if (timed) {
          backend.end(id);
          (forward ? forward_ids : backward_ids).push_back(id);
        }
      });
    }
    const auto times = backend.collect_ms();
    auto median = [&](const std::vector<std::uint64_t>& ids) {
      std::vector<double> v;
      for (auto id : ids) {
        auto it = times.find(id);
        v.push_back(it == times.end() ? 0.0 : it->second);
      }
      return statistics(v).median;
    };
    return std::pair{median(forward_ids), median(backward_ids)};
  };
  const auto [solo_forward, solo_backward] = time_repetitions();

  std::atomic<bool> stop{false};
  std::atomic<int> started{0};
  std::vector<std::exception_ptr> failures(static_cast<std::size_t>(options.co_runners));
  std::vector<std::thread> co_runners;
  for (int k = 0; k < options.co_runners; ++k) {
    co_runners.emplace_back([&, k] {
      try {
        at::set_num_threads(threads);  // with OpenMP: this thread's own pool, as a device's
        // A generator of its own, as every device's thread has: a script's random layers then
        // take turns on the global generator's lock beside the timed thread, as in a pipeline.
        at::Generator generator = at::globalContext().defaultGenerator(previous.device()).clone();
        models::ScopedGenerator draws(&generator);
        torch::nn::AnyModule mine = own_copy(run.layer);
        Runner copy{mine, run.model, run.last, run.target, run.input_wants_gradient};
        bool counted = false;
        while (!stop.load()) {
          forward_backward(copy, previous, [](bool, auto&& work) { work(); });
          if (!counted) {
            counted = true;
            started.fetch_add(1);
          }
        }
      } catch (...) {
        failures[static_cast<std::size_t>(k)] = std::current_exception();
        started.fetch_add(1);
      }
    });
  }
  // Timed once every co-runner is past its first round (its copy made, its memory allocated).
  while (started.load() < options.co_runners) std::this_thread::yield();
  std::pair<double, double> beside{0.0, 0.0};
  std::exception_ptr failure;
  try {
    beside = time_repetitions();
  } catch (...) {
    failure = std::current_exception();
  }
  stop.store(true);
  for (auto& t : co_runners) t.join();
  for (auto& f : failures) {
    if (!failure && f) failure = f;
  }
  if (failure) std::rethrow_exception(failure);
  Slowdown slowdown;
  if (solo_forward > 0) slowdown.forward = beside.first / solo_forward;
  if (solo_backward > 0) slowdown.backward = beside.second / solo_backward;
  return slowdown;
}

// One layer's memory at one size, counted by the device's allocator.
struct LayerMemory {
  at::Tensor output;  ///< detached: the next layer's input (none after the last layer)
  std::int64_t output_bytes = 0, saved = 0, workspace = 0, first_peak = 0, accumulate_peak = 0;
  std::int64_t inner_first_peak = 0, inner_accumulate_peak = 0;  ///< not the stage's last layer
  std::int64_t input_peak = 0, weight_peak = 0;                  ///< the split backward's I and W
  bool keeps_input = true, keeps_output = false, aliases = false;
  bool modifies = false;  ///< the layer changed its input in place (LayerProfile::modifies_input)
  /// Where the backend follows its levels: when the backward's peak is over (peak_release.hpp).
  std::optional<PeakRelease> release;
};

// What the allocator counts for a new tensor like `t` (its rounding included).
std::int64_t allocation_of(const at::Tensor& t, MeasureBackend& backend) {
  const std::int64_t before = backend.allocated();
  const at::Tensor probe = at::empty_like(t);
  return backend.allocated() - before;
}

// One backward, given the gradient of the output; returns the peak above its start. The last
// layer's output is not kept once the loss exists, as in the executor's last stage.
// At a stage's end the executor holds the output and the gradient it received for the whole
// backward. Inside a stage (`inside_stage`) nothing but autograd holds either: the gradient dies
// once the layer's first node has used it, the output once its last saved reference goes. There
// the gradient comes from a node after the layer (a negation: it saves nothing, and its backward
// makes nothing but that gradient), so the engine owns it, and the peak is given above a level
// that holds it, as the memory model's walk does.
// `levels` gets the allocator's record of the backward, where the backend keeps one.
std::int64_t backward_peak(Runner& run, std::pair<at::Tensor, at::Tensor> pair,
                           MeasureBackend& backend, bool inside_stage,
                           std::vector<LevelRecord>& levels) {
  if (run.last) pair.second = at::Tensor();
  if (!pair.first.requires_grad()) return 0;  // a first layer without parameters: no backward
  std::int64_t received = 0;
  if (inside_stage && !run.last) {
    received = allocation_of(pair.first, backend);
    pair.first = pair.first.neg();
    pair.second = at::Tensor();
  }
  at::Tensor seed_gradient = run.last ? at::Tensor() : at::ones_like(pair.first);
  const std::int64_t start = backend.allocated();
  backend.reset_peak();
  const auto began = HostClock::now();
  const bool following = backend.follows_levels();
  if (following) backend.follow_levels(began);
  if (run.last) {
    torch::autograd::backward({pair.first});
  } else {
    torch::autograd::backward({pair.first}, {seed_gradient});
  }
  if (following) {
    LevelRecord record;
    record.duration_ms = ms_between(began, HostClock::now());
    record.samples = backend.followed_levels();
    levels.push_back(std::move(record));
  }
  return std::max<std::int64_t>(0, backend.peak() - start - received);
}

// What autograd keeps of a forward: run it, let go of the input and the output, hold only the
// graph, and see which storages survive. What the allocator still counts beyond those is saved.
void measure_retention(Runner& run, const at::Tensor& previous, MeasureBackend& backend,
                       LayerMemory& out) {
  LayerInput in = layer_input(previous, run.input_wants_gradient);
  const std::int64_t input_bytes = static_cast<std::int64_t>(in.x.storage().nbytes());
  const std::int64_t before = backend.allocated();
  const auto version = in.x._version();
  auto [root, y] = run.forward(in.x);
  out.aliases = y.storage().unsafeGetStorageImpl() == in.x.storage().unsafeGetStorageImpl();
  out.modifies = in.x._version() != version;
  const auto input_storage = in.x.storage().getWeakStorageImpl();
  const auto output_storage = y.storage().getWeakStorageImpl();
  const std::int64_t output_bytes = bytes_of(y), loss_bytes = run.last ? bytes_of(root) : 0;
  // The graph: the loss holds it on the last layer; elsewhere the output's node does.
  std::shared_ptr<torch::autograd::Node> graph = run.last ? nullptr : y.grad_fn();
  if (!run.last) root = at::Tensor();
  y = at::Tensor();
  in.x = at::Tensor();
  const std::int64_t held = backend.allocated() - (before - input_bytes);
  out.keeps_input = !input_storage.expired();
  out.keeps_output = !out.aliases && !output_storage.expired();
  out.saved = std::max<std::int64_t>(0, held - (out.keeps_input ? input_bytes : 0) -
                                            (out.keeps_output ? output_bytes : 0) - loss_bytes);
}

// The backward's peaks, the first time (creating the parameter gradients) and a later time
// (adding into them), as at a stage's end or inside it.
void measure_backward_peaks(Runner& run, const at::Tensor& previous, bool inside_stage,
                            MeasureBackend& backend, std::int64_t& first_peak,
                            std::int64_t& accumulate_peak, std::vector<LevelRecord>& levels) {
  LayerInput in = layer_input(previous, run.input_wants_gradient);
  reset_gradients(*run.layer.ptr(), in);
  first_peak = backward_peak(run, run.forward(in.x), backend, inside_stage, levels);
  // The stage input is new each micro-batch (and a layer working in place has changed this
  // one), so is its gradient.
  const LayerInput again = layer_input(previous, run.input_wants_gradient);
  accumulate_peak = backward_peak(run, run.forward(again.x), backend, inside_stage, levels);
  reset_gradients(*run.layer.ptr(), in);
}

// The split backward's halves as zero-bubble schedules run them at a stage's end (the output and
// the gradient it receives held), each peak above its start: I, the input's gradient with the
// graph kept, so every saved tensor stays while the gradients inside the layer are made (none
// where the input needs no gradient); then W, the parameters' gradients from the same received
// gradient, returned at once while the graph is freed as it goes.
void measure_split_peaks(Runner& run, const at::Tensor& previous, MeasureBackend& backend,
                         LayerMemory& out) {
  LayerInput in = layer_input(previous, run.input_wants_gradient);
  reset_gradients(*run.layer.ptr(), in);
  auto [root, y] = run.forward(in.x);
  if (!root.requires_grad()) return;
  const std::vector<at::Tensor> seed =
      run.last ? std::vector<at::Tensor>{} : std::vector<at::Tensor>{at::ones_like(root)};
  const std::vector<at::Tensor> parameters = trainable_parameters(run.layer);
  at::Tensor input_gradient;  // held through W, as a stage's is until its copy is done
  if (in.leaf.defined()) {
    const std::int64_t start = backend.allocated();
    backend.reset_peak();
    input_gradient = torch::autograd::grad({root}, {in.leaf}, seed, /*retain_graph=*/true,
                                           /*create_graph=*/false, /*allow_unused=*/true)[0];
    out.input_peak = std::max<std::int64_t>(0, backend.peak() - start);
  }
  if (!parameters.empty()) {
    // The last layer's W starts from its output's gradient, which the executor's I made from
    // the loss and kept (and holds the output for): the loss's own backward is not run again.
    // Timed from the loss, its peak had two logits' worth more than a pipeline's W.
    std::vector<at::Tensor> from = {root}, with = seed;
    if (run.last && y.requires_grad()) {
      with = torch::autograd::grad({root}, {y}, {}, /*retain_graph=*/true);
      from = {y};
    }
    const std::int64_t start = backend.allocated();
    backend.reset_peak();
    (void)torch::autograd::grad(from, parameters, with, /*retain_graph=*/false,
                                /*create_graph=*/false, /*allow_unused=*/true);
    out.weight_peak = std::max<std::int64_t>(0, backend.peak() - start);
  }
}

LayerMemory measure_layer_memory(Runner& run, const at::Tensor& previous, MeasureBackend& backend) {
  LayerMemory out;
  {
    LayerInput in = layer_input(previous, run.input_wants_gradient);
    reset_gradients(*run.layer.ptr(), in);
    backend.reset_peak();
    auto [root, y] = run.forward(in.x);
    // The backward's peaks are measured on their own, so the workspace is the forward's.
    out.workspace = std::max<std::int64_t>(0, backend.peak() - backend.allocated());
    out.output_bytes = bytes_of(y);
    if (!run.last) out.output = y.detach();
  }
  std::vector<LevelRecord> levels;
  measure_backward_peaks(run, previous, false, backend, out.first_peak, out.accumulate_peak,
                         levels);
  if (run.last) {  // the model's last layer is always its stage's last
    out.inner_first_peak = out.first_peak;
    out.inner_accumulate_peak = out.accumulate_peak;
  } else {
    measure_backward_peaks(run, previous, true, backend, out.inner_first_peak,
                           out.inner_accumulate_peak, levels);
  }
  // One release for all four peaks: the memory model uses whichever fits the layer's place.
  if (backend.follows_levels()) out.release = peak_release(levels);
  measure_split_peaks(run, previous, backend, out);
  measure_retention(run, previous, backend, out);
  return out;
}

void append(LayerProfile& layer, const LayerTimes& times, const LayerMemory& memory,
            bool first_size) {
  layer.forward_ms.push_back(times.forward.median);
  layer.backward_ms.push_back(times.backward.median);
  layer.forward_nograd_ms.push_back(times.forward_nograd.median);
  layer.backward_input_ms.push_back(times.backward_input.median);
  layer.backward_weight_ms.push_back(times.backward_weight.median);
  layer.forward_ms_spread.push_back(times.forward.spread);
  layer.backward_ms_spread.push_back(times.backward.spread);
  layer.output_bytes.push_back(memory.output_bytes);
  layer.backward_peak_bytes.push_back(memory.first_peak);
  layer.backward_accumulate_peak_bytes.push_back(memory.accumulate_peak);
  layer.inner_backward_peak_bytes.push_back(memory.inner_first_peak);
  layer.inner_backward_accumulate_peak_bytes.push_back(memory.inner_accumulate_peak);
  layer.backward_input_peak_bytes.push_back(memory.input_peak);
  layer.backward_weight_peak_bytes.push_back(memory.weight_peak);
  if (memory.release) {
    layer.backward_peak_end.push_back(memory.release->share);
    layer.backward_peak_drop_bytes.push_back(memory.release->drop);
  }
  layer.saved_bytes.push_back(memory.saved);
  layer.workspace_bytes.push_back(memory.workspace);
  // One answer for every size, on the safe side should sizes disagree: kept if kept at any.
  layer.keeps_input = memory.keeps_input || (!first_size && layer.keeps_input);
  layer.keeps_output = memory.keeps_output || (!first_size && layer.keeps_output);
  layer.output_aliases_input = memory.aliases && (first_size || layer.output_aliases_input);
  layer.modifies_input = memory.modifies || (!first_size && layer.modifies_input);
}

}  // namespace

std::vector<std::int64_t> default_micro_batch_sizes(std::int64_t batch) {
  std::vector<std::int64_t> sizes;
  for (std::int64_t s = 1; s < batch; s *= 2) sizes.push_back(s);
  sizes.push_back(batch);
  return sizes;
}

// A batch of `size` as the profile runs it: the model's dtype for floating inputs, on `device`.
std::pair<at::Tensor, at::Tensor> batch_on(models::Model& model, std::int64_t size,
                                           at::ScalarType dtype, const c10::Device& device,
                                           std::uint64_t seed) {
  auto [input, target] = model.make_batch(size, 0, seed);
  if (at::isFloatingType(input.scalar_type())) input = input.to(dtype);
  return {input.to(device), target.to(device)};
}

// A GPU that has been idle runs its first milliseconds of work at low clocks, and the first call
// of each kernel loads its module: the whole model trains for a while before anything is timed,
// or the first layers of the first profile in a process come out slow (up to twice a second
// profile's times on an H100). A CPU has neither; it starts at once.
void warm_up_device(models::Model& model, MeasureBackend& backend, std::int64_t size,
                    at::ScalarType dtype, const ProfileOptions& options) {
  if (backend.device_type() == "cpu") return;
  const auto [input, target] = batch_on(model, size, dtype, backend.device(), options.seed);
  constexpr double kWarmSeconds = 0.5;
  constexpr int kMostPasses = 200;
  const auto started = std::chrono::steady_clock::now();
  for (int pass = 0; pass < kMostPasses; ++pass) {
    at::Tensor loss = model.loss(model.layers->forward(input), target);
    loss.backward();
    loss.item<double>();  // waits for the pass, so the clock below reads the device's time
    const std::chrono::duration<double> spent = std::chrono::steady_clock::now() - started;
    if (pass >= 1 && spent.count() >= kWarmSeconds) break;
  }
  for (auto& p : model.layers->parameters()) p.mutable_grad().reset();
}

namespace {

// What the device refuses of the options, before any work: co-runners and SM shares are of
// one kind of device each.
void check_device_options(const ProfileOptions& options, const MeasureBackend& backend) {
  if (options.co_runners > 0 && backend.device_type() != "cpu") {
    throw InputError(fmt::format(
        "co-runners: the co-run slowdown is measured on the CPU only; expected 0 with device {}",
        options.device));
  }
  if (options.sm_partitions > 0 && backend.device_type() != "cuda") {
    throw InputError(fmt::format("SM partitions: expected a CUDA device, got {}", options.device));
  }
}

// The intra-op threads the timed thread runs with (and each co-runner, as every CPU device of
// the pipeline has the same).
int measured_threads(const ProfileOptions& options) {
  return options.threads > 0 ? options.threads : at::get_num_threads();
}

// The model's dtype: its first parameter's (float for a model without any).
at::ScalarType dtype_of(models::Model& model) {
  for (auto& p : model.layers->parameters()) return p.scalar_type();
  return at::kFloat;
}

// Every size's device passes (CUPTI or events), then each layer's memory on its own, its input
// the previous layer's output, and, with no memory measured any more, the co-run slowdown on
// the same input. Returns the batches, which the host's passes reuse.
std::vector<std::pair<at::Tensor, at::Tensor>> profile_sizes(
    models::Model& model, std::vector<torch::nn::AnyModule*>& modules, MeasureBackend& backend,
    const ProfileOptions& options, const std::vector<std::int64_t>& sizes, at::ScalarType dtype,
    Profile& profile) {
  const ModelLayers layers(model, modules);
  const int layer_count = layers.count;
  const int threads = measured_threads(options);
  const std::size_t total = sizes.size() * static_cast<std::size_t>(layer_count);
  std::size_t done = 0;
  std::vector<std::pair<at::Tensor, at::Tensor>> batches;
  for (std::int64_t size : sizes) {
    batches.push_back(batch_on(model, size, dtype, backend.device(), options.seed));
    const auto& [input, target] = batches.back();
    profile.input_bytes.push_back(bytes_of(input));
    const std::vector<LayerTimes> times =
        time_layers(model, modules, input, target, backend, options, profile.device.cache_bytes);
    at::Tensor current = input;
    for (int l = 0; l < layer_count; ++l) {
      Runner run = layers.runner(l, target);
      LayerMemory memory = measure_layer_memory(run, current, backend);
      append(profile.layers[l], times[l], memory, size == sizes.front());
      if (profile.device.cache_bytes > 0) {
        profile.layers[l].forward_cold_ms.push_back(times[l].forward_cold.median);
        profile.layers[l].backward_cold_ms.push_back(times[l].backward_cold.median);
        profile.layers[l].forward_step_start_ms.push_back(times[l].forward_step_start.median);
      }
      if (options.co_runners > 0) {
        const Slowdown slowdown = measure_slowdown(run, current, backend, options, threads);
        LayerProfile& layer = profile.layers[l];
        layer.forward_corun_ms.push_back(times[l].forward.median * slowdown.forward);
        layer.backward_corun_ms.push_back(times[l].backward.median * slowdown.backward);
      }
      current = std::move(memory.output);
      if (options.progress) options.progress(++done, total);
    }
  }
  return batches;
}

// Each layer's launch times per size, the medians of the host's passes; returns the host's
// pace over them (0 when none was taken).
double add_launch_times(models::Model& model, std::vector<torch::nn::AnyModule*>& modules,
                        const std::vector<std::pair<at::Tensor, at::Tensor>>& batches,
                        MeasureBackend& backend, int repeats, Profile& profile) {
  std::vector<double> paces;
  const std::vector<HostTimes> host = time_host_calls(model, modules, batches, backend, repeats,
                                                      profile.device.backward_call_ms, paces);
  for (std::size_t l = 0; l < modules.size(); ++l) {
    LayerProfile& layer = profile.layers[l];
    for (const HostTimes& size : host) {
      layer.forward_launch_ms.push_back(statistics(size.forward[l]).median);
      layer.backward_launch_ms.push_back(statistics(size.backward[l]).median);
      layer.forward_nograd_launch_ms.push_back(statistics(size.nograd[l]).median);
    }
  }
  return statistics(paces).median;
}

// What a wait costs the work after it (sim/after_idle.hpp): the model's forward without
// autograd over the cheapest run of consecutive layers taking 2 ms or more (cheapest_run) (the
// extra is paid at most as fast as the work runs, so shorter work would hide it), timed right after
// the same work and after sleeping each of the waits. Each round takes the waits in a fresh order,
// so the machine's drift falls on all of them alike. A point's idle is its measured median (a sleep
// overshoots). Nothing where the cheapest such work takes over 50 ms: the extra, about a
// millisecond, is then a few percent of any task and below the noise of timing it.
std::vector<AfterIdlePoint> measure_after_idle(std::vector<torch::nn::AnyModule*>& modules,
                                               const at::Tensor& input, const Profile& profile,
                                               std::uint64_t seed) {
  constexpr std::array<double, 7> kWaitsMs{0.0, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0};
  // Rounds: as many as about 3 s allow, from 12 (a point's median is noisy below that) to 40
  // (its spread on a 2-vCPU VM, about 0.2 ms at 20 rounds, no longer falls much).
  constexpr double kBudgetMs = 3000.0;
  constexpr double kAfterIdleWorkMs = 2.0;
  constexpr double kLongestWorkMs = 50.0;
  std::vector<double> forward_ms;
  for (const LayerProfile& l : profile.layers) forward_ms.push_back(l.forward_ms.front());
  const LayerRun window = cheapest_run(forward_ms, kAfterIdleWorkMs);
  if (window.ms > kLongestWorkMs) return {};
  const double one_pass_ms = window.ms;
  const int passes = std::clamp(
      static_cast<int>(std::ceil(kAfterIdleWorkMs / std::max(one_pass_ms, 1e-3))), 1, 64);
  at::NoGradGuard no_grad;
  at::Tensor window_input = input;
  for (std::size_t l = 0; l < window.first; ++l) window_input = modules[l]->forward(window_input);
  auto work = [&] {
    for (int p = 0; p < passes; ++p) {
      at::Tensor x = window_input;
      for (std::size_t l = window.first; l < window.end; ++l) x = modules[l]->forward(x);
    }
  };
  for (int w = 0; w < 3; ++w) work();
  const double round_ms = std::accumulate(kWaitsMs.begin(), kWaitsMs.end(), 0.0) +
                          2.0 * static_cast<double>(kWaitsMs.size() * passes) * one_pass_ms;
  const int rounds = std::clamp(static_cast<int>(kBudgetMs / round_ms), 12, 40);
  std::vector<std::vector<double>> took(kWaitsMs.size()), waited(kWaitsMs.size());
  std::vector<std::size_t> order(kWaitsMs.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937_64 shuffle(seed);
  for (int r = 0; r < rounds; ++r) {
    std::shuffle(order.begin(), order.end(), shuffle);
    for (const std::size_t k : order) {
      work();
      const auto idle_from = HostClock::now();
      if (kWaitsMs[k] > 0)
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(kWaitsMs[k]));
      const auto started = HostClock::now();
      work();
      took[k].push_back(ms_between(started, HostClock::now()));
      waited[k].push_back(ms_between(idle_from, started));
    }
  }
  std::vector<double> idle_ms;
  for (std::size_t k = 0; k < kWaitsMs.size(); ++k)
    idle_ms.push_back(k == 0 ? 0.0 : statistics(waited[k]).median);
  // Sleeps that overshoot into one another would break the points' order; keep it strict.
  for (std::size_t k = 1; k < idle_ms.size(); ++k)
    idle_ms[k] = std::max(idle_ms[k], std::nextafter(idle_ms[k - 1], 1e300));
  return fit_after_idle(idle_ms, took);
}

// How the profile was measured; model_spec lets the GUI and validate run the same model.
std::string profile_meta(const models::Model& model, const MeasureBackend& backend,
                         const ProfileOptions& options, bool launches, double host_pace_us) {
  const int threads = measured_threads(options);
  nlohmann::ordered_json meta = {
      {"profiler", "pipetune"},     {"timer", backend.timer_name()}, {"warmup", options.warmup},
      {"repeats", options.repeats}, {"launch_times", launches},      {"threads", threads},
      {"model_spec", model.spec},   {"seed", options.seed},          {"torch", TORCH_VERSION}};
  if (options.co_runners > 0) meta["co_runner_threads"] = threads;
  // The pace the launch times were taken at, to set beside a run's (host_pace.hpp).
  if (host_pace_us > 0) meta["host_pace_us"] = host_pace_us;
  return meta.dump();
}

// A device profiled on one of `count` equal shares of its GPU's SMs says so.
void name_sm_share(ProfileDevice& device, const exec::SmPartitions& shares, int count) {
  device.name +=
      fmt::format(" ({} of {} SMs: 1 of {} shares)", shares.sms.front(), shares.device_sms, count);
  device.sm_shares = count;
}

// The backend's warnings, and the smallest micro-batch the model trains on where above one.
std::vector<std::string> profile_warnings(MeasureBackend& backend,
                                          const models::TrainableSize& least) {
  std::vector<std::string> warnings;
  for (auto& w : backend.take_warnings()) warnings.push_back(w);
  if (least.samples > 1) {
    warnings.push_back(fmt::format(
        "micro-batches of at least {} samples (min_micro_batch): {}; plans splitting the batch "
        "finer are refused",
        least.samples, least.reason));
  }
  return warnings;
}

}  // namespace

ProfileResult profile_model(models::Model& model, const ProfileOptions& options) {
  // Batch norm cannot train on one value per channel: a net whose last maps are 1 x 1 cannot
  // train on single samples, and the profile then starts where the layers can.
  const std::vector<std::int64_t> asked = checked_sizes(options);
  const models::TrainableSize least =
      models::smallest_trainable_micro_batch(model, options.batch_size);
  const std::vector<std::int64_t> sizes = trainable_sizes(asked, options, least);
  if (options.co_runners < 0) {
    throw InputError(fmt::format("co-runners: expected 0 or more, got {}", options.co_runners));
  }
  std::unique_ptr<MeasureBackend> backend = make_backend(options);
  check_device_options(options, *backend);
  const bool launches = options.launch_times == "on" ||
                        (options.launch_times == "auto" && backend->launches_asynchronously());
  const c10::Device device = backend->device();
  const at::ScalarType dtype = dtype_of(model);
  model.layers->to(device);
  model.layers->train();
  // On a share of the SMs, every call below runs on the share's stream (autograd runs each
  // backward on its forward's stream).
  const exec::SmPartitions* shares =
      options.sm_partitions > 0
          ? &exec::sm_partitions(device.has_index() ? device.index() : 0, options.sm_partitions)
          : nullptr;
  std::optional<c10::StreamGuard> on_share;
  if (shares) on_share.emplace(shares->streams.front());
  Profile profile = empty_profile(model, *backend, dtype, options, sizes);
  profile.min_micro_batch = least.samples;
  if (shares) name_sm_share(profile.device, *shares, options.sm_partitions);
  profile.co_runners = options.co_runners;
  // A CPU device's threads each have their core's private cache.
  if (options.cold_times && device.is_cpu())
    profile.device.cache_bytes = private_cache_bytes() * measured_threads(options);
  // Library bytes: what the allocator gains from here without a tensor to show for it. A
  // pipeline's device has two threads running cuBLAS on its stream, the compute thread and
  // autograd's device thread, each with its own 32 MiB workspace (measured on an H100); so has
  // this profile, once the spin-up (this thread) and the warm-up's backward (autograd's) ran.
  const std::int64_t before_any_work = backend->allocated();
  backend->spin_up();
  warm_up_device(model, *backend, sizes.back(), dtype, options);
  if (launches)
    profile.device.backward_call_ms = measure_backward_call_ms(*backend, options.repeats);

  std::vector<torch::nn::AnyModule*> modules;
  for (auto it = model.layers->begin(); it != model.layers->end(); ++it) modules.push_back(&*it);
  // The layers draw as the executor's do (executor/models/layers.hpp): from a generator the
  // thread sets, and a script's random layers under the global generator's lock.
  at::Generator generator = at::globalContext().defaultGenerator(device).clone();
  models::ScopedGenerator draws(&generator);
  std::vector<std::pair<at::Tensor, at::Tensor>> batches =
      profile_sizes(model, modules, *backend, options, sizes, dtype, profile);
  const double host_pace_us =
      launches ? add_launch_times(model, modules, batches, *backend, options.repeats, profile)
               : 0.0;
  if (options.after_idle && device.is_cpu()) {
    profile.device.after_idle =
        measure_after_idle(modules, batches.front().first, profile, options.seed);
  }
  batches.clear();
  // What stays allocated once the work is done and every tensor is gone: the libraries'
  // workspaces (cuBLAS keeps one per thread and stream), which every pipeline device holds too.
  for (auto& p : model.layers->parameters()) p.mutable_grad().reset();
  profile.device.library_bytes = std::max<std::int64_t>(0, backend->allocated() - before_any_work);

  ProfileResult result;
  result.warnings = profile_warnings(*backend, least);
  model.layers->to(at::kCPU);
  profile.meta_json = profile_meta(model, *backend, options, launches, host_pace_us);
  result.profile = std::move(profile);
  return result;
}

}  // namespace pipetune::profiler
