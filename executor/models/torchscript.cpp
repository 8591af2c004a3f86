// Bring-your-own models: a TorchScript file whose top level is a Sequential, split by its
// children. Each child becomes one layer; its parameters and buffers are shared with the
// scripted module, so moving or training the layer moves and trains the script.

#include <fmt/format.h>
#include <torch/nn/functional/loss.h>
#include <torch/script.h>

#include <ATen/ATen.h>
#include <filesystem>

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

std::vector<std::int64_t> parse_shape(const std::string& text) {
  std::vector<std::int64_t> dims;
  std::size_t at = 0;
  while (at < text.size()) {
    const auto x = text.find('x', at);
    const std::string part = text.substr(at, x == std::string::npos ? std::string::npos : x - at);
    char* end = nullptr;
    const long long v = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || v < 1) {
      throw InputError(fmt::format("--model: torchscript: input: expected dimensions such as 3x32x32, got \"{}\"", text));
    }
    dims.push_back(v);
    if (x == std::string::npos) break;
    at = x + 1;
  }
  if (dims.empty()) throw InputError("--model: torchscript: input: expected dimensions such as 3x32x32");
  return dims;
}

}  // namespace

Model build_torchscript_model(Spec& spec, const ModelOptions&) {
  spec.allow_only({"path", "input", "classes"});
  const std::string path = spec.text("path", "");
  if (path.empty()) throw InputError("--model: torchscript: path: expected the .pt file");
  if (!std::filesystem::exists(path)) {
    throw InputError(fmt::format("--model: {}: no such file", path));
  }
  const std::vector<std::int64_t> input = parse_shape(spec.text("input", "32"));
  const auto classes = spec.positive("classes", 10);
  torch::jit::Module script;
  try {
    script = torch::jit::load(path);
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw InputError(fmt::format("--model: {}: not a TorchScript file ({})", path, what.substr(0, what.find('\n'))));
  }
  Model m;
  m.name = std::filesystem::path(path).stem().string();
  for (const auto& child : script.named_children()) {
    m.layer_names.push_back(child.name);
    m.layers->push_back(std::string(child.name), ScriptLayer(child.value));
  }
  if (m.layer_names.empty()) {
    throw InputError(fmt::format("--model: {}: the scripted module has no children to split (its top level must be a Sequential)", path));
  }
  m.loss = [](const at::Tensor& output, const at::Tensor& target) {
    return torch::nn::functional::cross_entropy(output.reshape({-1, output.size(-1)}), target.reshape({-1}));
  };
  m.make_batch = [input, classes](std::int64_t batch, std::uint64_t seed) {
    auto g = at::detail::createCPUGenerator(seed);
    std::vector<std::int64_t> shape{batch};
    shape.insert(shape.end(), input.begin(), input.end());
    return std::make_pair(at::randn(shape, g), at::randint(classes, {batch}, g));
  };
  return m;
}

}  // namespace pipetune::models
