#include "profiler/profiler.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/version.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "profiler/backend.hpp"
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

std::int64_t bytes_of(const at::Tensor& t) { return t.defined() ? static_cast<std::int64_t>(t.nbytes()) : 0; }

// A layer of the model and what running it means: its forward, plus the loss for the last one.
struct Runner {
  torch::nn::AnyModule& layer;
  models::Model& model;
  bool last;
  const at::Tensor& target;
  // Returns what backward starts from (the loss, or the output) and the output.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& x) {
    at::Tensor y = layer.forward(x);
    if (!last) return {y, y};
    return {model.loss(y, target), y};
  }
};

void reset_gradients(torch::nn::Module& module, at::Tensor& input) {
  for (auto& p : module.parameters()) p.mutable_grad().reset();
  if (input.defined() && input.requires_grad()) input.mutable_grad().reset();
}

}  // namespace

std::vector<std::int64_t> default_micro_batch_sizes(std::int64_t batch) {
  std::vector<std::int64_t> sizes;
  for (std::int64_t s = 1; s < batch; s *= 2) sizes.push_back(s);
  sizes.push_back(batch);
  return sizes;
}

ProfileResult profile_model(models::Model& model, const ProfileOptions& options) {
  if (options.batch_size < 1) {
    throw InputError(fmt::format("--batch: expected a positive integer, got {}", options.batch_size));
  }
  if (options.repeats < 1) throw InputError(fmt::format("--repeats: expected at least 1, got {}", options.repeats));
  std::vector<std::int64_t> sizes =
      options.micro_batch_sizes.empty() ? default_micro_batch_sizes(options.batch_size) : options.micro_batch_sizes;
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  for (auto s : sizes) {
    if (s < 1 || s > options.batch_size) {
      throw InputError(fmt::format("--micro-batch-sizes: expected sizes from 1 to {} (the batch size), got {}",
                                   options.batch_size, s));
    }
  }

  std::unique_ptr<MeasureBackend> backend;
  if (options.device == "cpu") {
    backend = make_cpu_backend(options.threads);
  } else if (options.device.rfind("cuda", 0) == 0) {
    const int index = options.device.size() > 5 ? std::stoi(options.device.substr(5)) : 0;
    backend = make_cuda_backend(index, options.timer);
  } else {
    throw InputError(fmt::format("--device: expected cpu or cuda, got \"{}\"", options.device));
  }
  const c10::Device device = backend->device();

  at::ScalarType dtype = at::kFloat;
  for (auto& p : model.layers->parameters()) {
    dtype = p.scalar_type();
    break;
  }
  model.layers->to(device);
  model.layers->train();

  const int layer_count = static_cast<int>(model.layer_names.size());
  Profile profile;
  profile.model = model.name;
  profile.device = {backend->device_type(), backend->device_name(), backend->memory_bytes()};
  profile.dtype = dtype == at::kDouble ? "float64" : dtype == at::kHalf ? "float16" : dtype == at::kBFloat16 ? "bfloat16" : "float32";
  profile.timer = backend->timer_name();
  profile.batch_size = options.batch_size;
  profile.micro_batch_sizes = sizes;
  profile.layers.resize(layer_count);
  auto layer = model.layers->begin();
  for (int l = 0; l < layer_count; ++l, ++layer) {
    profile.layers[l].name = model.layer_names[l];
    for (const auto& p : layer->ptr()->parameters()) profile.layers[l].param_bytes += bytes_of(p);
  }

  ProfileResult result;
  std::uint64_t next_region = 1;
  const std::size_t total = sizes.size() * static_cast<std::size_t>(layer_count);
  std::size_t done = 0;
  for (std::int64_t size : sizes) {
    auto [input, target] = model.make_batch(size, 0, options.seed);
    if (at::isFloatingType(input.scalar_type())) input = input.to(dtype);
    input = input.to(device);
    target = target.to(device);
    profile.input_bytes.push_back(bytes_of(input));
    std::vector<torch::nn::AnyModule*> modules;
    for (auto it = model.layers->begin(); it != model.layers->end(); ++it) modules.push_back(&*it);

    // Time, in context: each repetition is one forward pass through every layer and one
    // backward pass back, each layer timed on its own within it. Timing a layer alone, again and
    // again, would keep its weights in cache, which a pipeline streaming micro-batches through
    // many layers does not; small-batch layers are bound by memory, so that matters.
    // Layers are joined by detached tensors, so each backward can be timed by itself.
    std::vector<std::vector<std::uint64_t>> forward_ids(layer_count), backward_ids(layer_count),
        nograd_ids(layer_count);
    for (int r = 0; r < options.warmup + options.repeats; ++r) {
      const bool timed = r >= options.warmup;
      // First the forward a checkpointed micro-batch runs: no autograd, nothing saved.
      {
        at::NoGradGuard no_grad;
        at::Tensor current = input;
        for (int l = 0; l < layer_count; ++l) {
          Runner run{*modules[l], model, l + 1 == layer_count, target};
          const std::uint64_t id = next_region++;
          if (timed) backend->begin(id);
          current = run.forward(current).second;
          if (timed) {
            backend->end(id);
            nograd_ids[l].push_back(id);
          }
        }
      }
      std::vector<at::Tensor> inputs(layer_count), roots(layer_count);
      at::Tensor current = input;
      for (int l = 0; l < layer_count; ++l) {
        at::Tensor x = current.detach();
        if (l > 0 && at::isFloatingType(x.scalar_type())) x.requires_grad_(true);
        Runner run{*modules[l], model, l + 1 == layer_count, target};
        const std::uint64_t id = next_region++;
        if (timed) backend->begin(id);
        auto pair = run.forward(x);
        if (timed) {
          backend->end(id);
          forward_ids[l].push_back(id);
        }
        inputs[l] = x;
        roots[l] = pair.first;
        current = pair.second;
      }
      at::Tensor gradient;  // flowing back from the layer after
      for (int l = layer_count - 1; l >= 0; --l) {
        const bool last = l + 1 == layer_count;
        if (!roots[l].requires_grad()) break;  // nothing before can need a gradient either
        const std::uint64_t id = next_region++;
        if (timed) backend->begin(id);
        if (last) {
          torch::autograd::backward({roots[l]});
        } else {
          torch::autograd::backward({roots[l]}, {gradient});
        }
        if (timed) {
          backend->end(id);
          backward_ids[l].push_back(id);
        }
        gradient = inputs[l].requires_grad() ? inputs[l].grad() : at::Tensor();
        roots[l] = at::Tensor();
        if (!gradient.defined()) break;
      }
      // Parameter gradients stay allocated and accumulate, as in every backward of a stage but
      // its first.
    }
    const auto times = backend->collect_ms();
    auto pick = [&](const std::vector<std::uint64_t>& ids) {
      std::vector<double> v;
      for (auto id : ids) {
        auto it = times.find(id);
        v.push_back(it == times.end() ? 0.0 : it->second);  // no device work at all: 0
      }
      return statistics(v);
    };

    // Memory: each layer on its own, one forward and one backward, counted.
    at::Tensor current = input;
    for (int l = 0; l < layer_count; ++l) {
      LayerProfile& out = profile.layers[l];
      torch::nn::AnyModule& module = *modules[l];
      Runner run{module, model, l + 1 == layer_count, target};
      at::Tensor x = current.detach();
      if (l > 0 && at::isFloatingType(x.scalar_type())) x.requires_grad_(true);
      reset_gradients(*module.ptr(), x);
      std::int64_t output = 0, saved = 0, workspace = 0, first_peak = 0, accumulate_peak = 0;
      // One backward, given the gradient of the output; returns the peak above its start.
      // The last layer's output is not kept once the loss exists, as in the executor's last stage.
      auto measure_backward = [&](std::pair<at::Tensor, at::Tensor> pair) -> std::int64_t {
        if (run.last) pair.second = at::Tensor();
        if (!pair.first.requires_grad()) return 0;  // a first layer without parameters: no backward
        at::Tensor seed_gradient = run.last ? at::Tensor() : at::ones_like(pair.first);
        const std::int64_t start = backend->allocated();
        backend->reset_peak();
        if (run.last) {
          torch::autograd::backward({pair.first});
        } else {
          torch::autograd::backward({pair.first}, {seed_gradient});
        }
        return std::max<std::int64_t>(0, backend->peak() - start);
      };
      {
        backend->reset_peak();
        const std::int64_t before = backend->allocated();
        auto pair = run.forward(x);
        const std::int64_t after = backend->allocated();
        output = bytes_of(pair.second);
        saved = std::max<std::int64_t>(0, after - before - output - (run.last ? bytes_of(pair.first) : 0));
        // The backward's peaks are measured on their own, so the workspace is the forward's.
        workspace = std::max<std::int64_t>(0, backend->peak() - after);
        if (!run.last) {
          at::NoGradGuard no_grad;
          current = pair.second.detach();
        }
        // The first backward creates the parameters' gradients and keeps them.
        first_peak = measure_backward(std::move(pair));
        // A later one adds into them: the new gradients are transient. The stage input's
        // gradient is new each micro-batch, so it starts from nothing again.
        pair = {};
        if (x.requires_grad()) x.mutable_grad().reset();
        accumulate_peak = measure_backward(run.forward(x));
      }
      reset_gradients(*module.ptr(), x);

      const Statistics forward = pick(forward_ids[l]), backward = pick(backward_ids[l]);
      out.forward_ms.push_back(forward.median);
      out.backward_ms.push_back(backward.median);
      out.forward_nograd_ms.push_back(pick(nograd_ids[l]).median);
      out.forward_ms_spread.push_back(forward.spread);
      out.backward_ms_spread.push_back(backward.spread);
      out.output_bytes.push_back(output);
      out.backward_peak_bytes.push_back(first_peak);
      out.backward_accumulate_peak_bytes.push_back(accumulate_peak);
      out.saved_bytes.push_back(saved);
      out.workspace_bytes.push_back(workspace);
      if (options.progress) options.progress(++done, total);
    }
  }
  for (auto& w : backend->take_warnings()) result.warnings.push_back(w);
  model.layers->to(at::kCPU);

  // How it was measured; model_spec lets the GUI and validate run the same model.
  nlohmann::ordered_json meta = {{"profiler", "pipetune"},
                                 {"timer", backend->timer_name()},
                                 {"warmup", options.warmup},
                                 {"repeats", options.repeats},
                                 {"threads", options.threads > 0 ? options.threads : at::get_num_threads()},
                                 {"model_spec", model.spec},
                                 {"seed", options.seed},
                                 {"torch", TORCH_VERSION}};
  profile.meta_json = meta.dump();
  result.profile = std::move(profile);
  return result;
}

}  // namespace pipetune::profiler
