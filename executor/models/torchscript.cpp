// Bring-your-own models: a TorchScript file whose top level is a Sequential, split by its
// children. Each child becomes one layer; its parameters and buffers are shared with the
// scripted module, so moving or training the layer moves and trains the script. The data is a
// batch file (batch_file.hpp) or random: floats, or token ids with a target per token.

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/script.h>

#include <filesystem>

#include "executor/models/batch_file.hpp"
#include "executor/models/loss.hpp"
#include "executor/models/model.hpp"
#include "executor/models/spec.hpp"
#include "sim/error.hpp"

namespace pipetune::models {

namespace {

class ScriptLayerImpl : public torch::nn::Module {
 public:
  explicit ScriptLayerImpl(torch::jit::Module module) : module_(std::move(module)) {
    // Names may not contain dots in a torch::nn::Module.
    auto clean = [](std::string name) {
      for (auto& c : name) {
        if (c == '.') c = '_';
      }
      return name;
    };
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
      register_parameter(clean(p.name), p.value, p.value.requires_grad());
    }
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) {
      register_buffer(clean(b.name), b.value);
    }
  }
  at::Tensor forward(const at::Tensor& x) { return module_.forward({x}).toTensor(); }
  void train(bool on = true) override {
    torch::nn::Module::train(on);
    module_.train(on);
  }

 private:
  torch::jit::Module module_;
};
TORCH_MODULE(ScriptLayer);

// "3x32x32" or "long:128": the dtype and shape of one sample of random inputs.
struct SampleShape {
  bool tokens = false;  // int64 token ids rather than floats
  std::vector<std::int64_t> dims;
};

SampleShape parse_input(const std::string& text) {
  SampleShape shape;
  std::string dims = text;
  if (const auto colon = text.find(':'); colon != std::string::npos) {
    const std::string dtype = text.substr(0, colon);
    if (dtype == "long" || dtype == "int64") {
      shape.tokens = true;
    } else if (dtype != "float") {
      throw InputError(
          Input::Model,
          fmt::format(
              "torchscript: input: expected float or long before the dimensions, got \"{}\"",
              text));
    }
    dims = text.substr(colon + 1);
  }
  std::size_t at = 0;
  while (at <= dims.size()) {
    const auto x = dims.find('x', at);
    const std::string part = dims.substr(at, x == std::string::npos ? std::string::npos : x - at);
    char* end = nullptr;
    const long long v = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || v < 1) {
      throw InputError(Input::Model,
                       fmt::format("torchscript: input: expected dimensions such as 3x32x32 or "
                                   "long:128, got \"{}\"",
                                   text));
    }
    shape.dims.push_back(v);
    if (x == std::string::npos) break;
    at = x + 1;
  }
  return shape;
}

}  // namespace

Model build_torchscript_model(Spec& spec, const ModelOptions&) {
  spec.allow_only({"path", "batch", "input", "classes", "vocab", "loss"});
  const std::string path = spec.text("path", "");
  if (path.empty()) throw InputError(Input::Model, "torchscript: path: expected the .pt file");
  if (!std::filesystem::exists(path)) {
    throw InputError(Input::Model, fmt::format("{}: no such file", path));
  }
  Model m;
  if (spec.has("batch")) {
    for (const char* key : {"input", "classes", "vocab"}) {
      if (spec.has(key)) {
        throw InputError(
            Input::Model,
            fmt::format("torchscript: {}: only for random data; the batch file gives the "
                        "inputs and targets",
                        key));
      }
    }
    auto file = std::make_shared<BatchFile>(load_batch_file(spec.text("batch", "")));
    m.samples = file->samples();
    m.make_batch = [file](std::int64_t batch, std::int64_t step, std::uint64_t) {
      return take_samples(*file, batch, step);
    };
  } else {
    const SampleShape input = parse_input(spec.text("input", "32"));
    std::int64_t vocab = 0;
    if (input.tokens) {
      if (!spec.has("vocab"))
        throw InputError(Input::Model,
                         "torchscript: vocab: expected the number of token ids for input=long:…");
      vocab = spec.positive("vocab", 1);
    } else if (spec.has("vocab")) {
      throw InputError(Input::Model, "torchscript: vocab: only for token inputs (input=long:…)");
    }
    // Token inputs have one target per token unless classes asks for one per sample.
    const std::int64_t classes =
        input.tokens && !spec.has("classes") ? 0 : spec.positive("classes", 10);
    m.make_batch = [input, vocab, classes](std::int64_t batch, std::int64_t step,
                                           std::uint64_t seed) {
      auto g = at::detail::createCPUGenerator(seed * 1000003 + static_cast<std::uint64_t>(step));
      std::vector<std::int64_t> shape{batch};
      shape.insert(shape.end(), input.dims.begin(), input.dims.end());
      at::Tensor x = input.tokens ? at::randint(vocab, shape, g) : at::randn(shape, g);
      at::Tensor y = classes > 0 ? at::randint(classes, {batch}, g) : at::randint(vocab, shape, g);
      return std::make_pair(x, y);
    };
  }
  const LossKind loss =
      spec.has("loss") ? parse_loss(spec.text("loss", "")) : LossKind::CrossEntropy;
  m.loss = [loss](const at::Tensor& output, const at::Tensor& target) {
    return loss_of(loss, output, target);
  };

  torch::jit::Module script;
  try {
    script = torch::jit::load(path);
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw InputError(Input::Model, fmt::format("{}: not a TorchScript file ({})", path,
                                               what.substr(0, what.find('\n'))));
  }
  m.name = std::filesystem::path(path).stem().string();
  for (const auto& child : script.named_children()) {
    m.layer_names.push_back(child.name);
    m.layers->push_back(std::string(child.name), ScriptLayer(child.value));
  }
  if (m.layer_names.empty()) {
    throw InputError(
        Input::Model,
        fmt::format(
            "{}: the scripted module has no children to split (its top level must be a Sequential)",
            path));
  }
  return m;
}

}  // namespace pipetune::models
