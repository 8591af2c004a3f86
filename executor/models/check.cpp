// What would fail in a model's first step, found before any work: the data against the layers
// and the loss, on a couple of samples.

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>

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
  if (const auto at = what.rfind("RuntimeError: "); at != std::string::npos)
    what = what.substr(at + 14);
  while (!what.empty() && what.front() == '\n') what.erase(0, 1);
  return what.substr(0, what.find('\n'));
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
  at::Tensor h = x;
  std::size_t l = 0;
  for (auto it = model.layers->begin(); it != model.layers->end(); ++it, ++l) {
    try {
      h = it->forward(h);
    } catch (const std::exception& e) {
      if (const auto bytes = refused_allocation_bytes(e)) {
        throw out_of_memory(
            fmt::format("layer {} (\"{}\") on input {}", l, model.layer_names.at(l), describe(h)),
            *bytes);
      }
      throw InputError(Input::Model,
                       fmt::format("layer {} (\"{}\") rejects its input {}: {}", l,
                                   model.layer_names.at(l), describe(h), torch_reason(e)));
    }
  }
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
