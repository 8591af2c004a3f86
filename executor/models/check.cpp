// What would fail in a model's first step, found before any work: the data against the layers
// and the loss, on a couple of samples.

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include "executor/models/eval_guard.hpp"
#include "executor/models/loss.hpp"
#include "executor/models/model.hpp"
#include "executor/models/out_of_memory.hpp"
#include "executor/models/torch_reason.hpp"
#include "sim/error.hpp"

namespace pipetune::models {

std::string torch_reason(const std::exception& e) {
  std::string what = e.what();
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e))
    what = c10_error->what_without_backtrace();
  if (const auto at = what.rfind("RuntimeError: "); at != std::string::npos) {
    what = what.substr(at + 14);
  } else if (what.starts_with("The following operation failed in the TorchScript interpreter")) {
    // A Python exception the script raised ("builtins.ValueError: ..."): its last line.
    while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
    if (const auto end = what.rfind('\n'); end != std::string::npos) what = what.substr(end + 1);
  }
  while (!what.empty() && what.front() == '\n') what.erase(0, 1);
  return what.substr(0, what.find('\n'));
}

namespace {

// Puts back every buffer (running statistics) and the CPU generator's state when it goes.
class KeepState {
 public:
  explicit KeepState(torch::nn::Module& module)
      : generator_(at::globalContext().defaultGenerator(c10::Device(c10::DeviceType::CPU))) {
    for (const auto& b : module.buffers()) buffers_.emplace_back(b, b.clone());
    std::lock_guard<std::mutex> lock(generator_.mutex());
    state_ = generator_.get_state();
  }
  ~KeepState() {
    at::NoGradGuard no_grad;
    for (auto& [buffer, value] : buffers_) buffer.copy_(value);
    std::lock_guard<std::mutex> lock(generator_.mutex());
    generator_.set_state(state_);
  }
  KeepState(const KeepState&) = delete;
  KeepState& operator=(const KeepState&) = delete;

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> buffers_;
  at::Generator generator_;
  at::Tensor state_;
};

// The layers run on `x` in turn. The first that throws is handed, with its input, to
// `on_failure`, which throws or lets the walk stop there (the output is then undefined).
at::Tensor forward_layer_by_layer(
    Model& model, at::Tensor x,
    const std::function<void(std::size_t layer, const at::Tensor& input, const std::exception&)>&
        on_failure) {
  std::size_t l = 0;
  for (auto it = model.layers->begin(); it != model.layers->end(); ++it, ++l) {
    try {
      x = it->forward(x);
    } catch (const std::exception& e) {
      on_failure(l, x, e);
      return {};
    }
  }
  return x;
}

// Why the layers cannot take a training-mode forward of `size` samples, or "" when they can.
std::string training_refusal(Model& model, std::int64_t size) {
  auto [x, y] = model.make_batch(size, 0, 0);
  KeepState keep(*model.layers);
  at::NoGradGuard no_grad;
  std::string why;
  forward_layer_by_layer(model, x, [&](std::size_t l, const at::Tensor&, const std::exception& e) {
    if (refused_allocation_bytes(e)) return;  // memory, not the size: check_model_batch's
    why = fmt::format("layer {} (\"{}\") cannot train on {} sample{}: {}", l,
                      model.layer_names.at(l), size, size == 1 ? "" : "s", torch_reason(e));
  });
  return why;
}

}  // namespace

TrainableSize smallest_trainable_micro_batch(Model& model, std::int64_t batch) {
  TrainableSize out;
  for (std::int64_t size = 1; size <= batch; ++size) {
    std::string why = training_refusal(model, size);
    if (why.empty()) {
      out.samples = size;
      return out;
    }
    if (out.reason.empty()) out.reason = std::move(why);
  }
  throw InputError(Input::Model, out.reason);
}

void check_trains_on(Model& model, std::int64_t samples, const std::string& what) {
  // From one sample up, stopping at the first size that trains: a micro-batch holding more
  // trains too (batch norm's rule), and a forward of a sample or two costs nothing at start-up
  // where one of `samples` (a whole batch, in one chunk) would. The refusal told is `samples`'s.
  for (std::int64_t size = 1; size <= samples; ++size) {
    if (std::string why = training_refusal(model, size); why.empty()) {
      return;
    } else if (size == samples) {
      throw InputError(fmt::format("{}: {}", what, why));
    }
  }
}

void check_model_batch(Model& model, std::int64_t batch) {
  if (batch < 1)
    throw InputError(Input::BatchSize, fmt::format("expected a positive integer, got {}", batch));
  if (model.samples > 0 && batch > model.samples) {
    throw InputError(Input::BatchSize, std::to_string(batch),
                     fmt::format("the model's batch file holds only {} samples", model.samples));
  }
  auto [x, y] = model.make_batch(std::min<std::int64_t>(batch, 2), 0, 0);
  at::NoGradGuard no_grad;
  EvalGuard eval(*model.layers);
  const at::Tensor h = forward_layer_by_layer(
      model, x, [&](std::size_t l, const at::Tensor& input, const std::exception& e) {
        if (const auto bytes = refused_allocation_bytes(e)) {
          throw out_of_memory(fmt::format("layer {} (\"{}\") on input {}", l,
                                          model.layer_names.at(l), describe(input)),
                              *bytes);
        }
        throw InputError(Input::Model,
                         fmt::format("layer {} (\"{}\") rejects its input {}: {}", l,
                                     model.layer_names.at(l), describe(input), torch_reason(e)));
      });
  try {
    model.loss(h, y);
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    throw InputError(
        fmt::format("loss: output {}, targets {}: {}", describe(h), describe(y), torch_reason(e)));
  }
}

}  // namespace pipetune::models
