// The built-in models. Each layer (child of the top-level Sequential) is a block whose first
// operation keeps its input for backward, so the profile's saved/output bytes compose exactly
// across stage boundaries (docs/formats.md).

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/pooling.h>
#include <torch/utils.h>

#include <cmath>

#include "executor/models/layers.hpp"
#include "executor/models/loss.hpp"
#include "executor/models/model.hpp"
#include "executor/models/out_of_memory.hpp"
#include "executor/models/spec.hpp"
#include "sim/error.hpp"

namespace pipetune::models {

Model build_torchscript_model(Spec& spec, const ModelOptions& options);  // torchscript.cpp

namespace {

// Appends the layer `make` builds, named `name`. An allocation that fails while it is built
// names the layer, so that a model too large for the machine says which one.
template <class Make>
void add_layer(Model& m, std::string name, Make&& make) {
  const Activity building(fmt::format("building layer \"{}\" of {}", name, m.name));
  m.layer_names.push_back(name);
  m.layers->push_back(std::move(name), make());
}

// --- MLP -----------------------------------------------------------------------------------

class MlpBlockImpl : public torch::nn::Module {
 public:
  MlpBlockImpl(std::int64_t in, std::int64_t out, double dropout)
      : fc(register_module("fc", torch::nn::Linear(in, out))),
        drop(register_module("drop", StageDropout(dropout))) {}
  at::Tensor forward(const at::Tensor& x) { return drop(torch::relu(fc(x))); }
  torch::nn::Linear fc;
  StageDropout drop;
};
TORCH_MODULE(MlpBlock);

Model build_mlp(Spec& spec) {
  spec.allow_only({"layers", "width", "input", "classes", "dropout"});
  const auto layers = spec.positive("layers", 8);
  const auto width = spec.positive("width", 1024);
  const auto input = spec.positive("input", width);
  const auto classes = spec.positive("classes", 10);
  const double dropout = spec.fraction("dropout", 0.0);
  Model m;
  m.name = fmt::format("mlp-{}x{}", layers, width);
  for (std::int64_t l = 0; l < layers; ++l) {
    add_layer(m, fmt::format("block{}", l),
              [&] { return MlpBlock(l == 0 ? input : width, width, dropout); });
  }
  add_layer(m, "head", [&] { return torch::nn::Linear(width, classes); });
  m.loss = cross_entropy;
  m.make_batch = [input, classes](std::int64_t batch, std::int64_t step, std::uint64_t seed) {
    auto g = at::detail::createCPUGenerator(seed * 1000003 + static_cast<std::uint64_t>(step));
    return std::make_pair(at::randn({batch, input}, g), at::randint(classes, {batch}, g));
  };
  return m;
}

// --- GPT-style Transformer ------------------------------------------------------------------

class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(std::int64_t vocab, std::int64_t width, std::int64_t seq, double dropout)
      : token(register_module("token", torch::nn::Embedding(vocab, width))),
        drop(register_module("drop", StageDropout(dropout))) {
    position = register_parameter("position", at::randn({seq, width}) * 0.02);
  }
  at::Tensor forward(const at::Tensor& tokens) { return drop(token(tokens) + position); }
  torch::nn::Embedding token;
  at::Tensor position;
  StageDropout drop;
};
TORCH_MODULE(Embedding);

class TransformerBlockImpl : public torch::nn::Module {
 public:
  TransformerBlockImpl(std::int64_t width, std::int64_t heads, double dropout)
      : heads_(heads),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        qkv(register_module("qkv", torch::nn::Linear(width, 3 * width))),
        proj(register_module("proj", torch::nn::Linear(width, width))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        fc1(register_module("fc1", torch::nn::Linear(width, 4 * width))),
        fc2(register_module("fc2", torch::nn::Linear(4 * width, width))),
        attention_drop(register_module("attention_drop", StageDropout(dropout))),
        residual_drop(register_module("residual_drop", StageDropout(dropout))) {}

  at::Tensor forward(const at::Tensor& x) {
    const auto n = x.size(0), s = x.size(1), width = x.size(2), head = width / heads_;
    auto split = [&](const at::Tensor& t) { return t.view({n, s, heads_, head}).transpose(1, 2); };
    const auto parts = qkv(ln1(x)).chunk(3, -1);
    const at::Tensor q = split(parts[0]), k = split(parts[1]), v = split(parts[2]);
    // Causal self-attention written out, so it runs in float64 on any device.
    at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head));
    const at::Tensor future = at::ones({s, s}, x.options().dtype(at::kBool)).triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
    const at::Tensor attended = at::matmul(attention_drop(at::softmax(scores, -1)), v);
    const at::Tensor h = x + residual_drop(proj(attended.transpose(1, 2).reshape({n, s, width})));
    return h + residual_drop(fc2(torch::gelu(fc1(ln2(h)))));
  }

  std::int64_t heads_;
  torch::nn::LayerNorm ln1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc1, fc2;
  StageDropout attention_drop, residual_drop;
};
TORCH_MODULE(TransformerBlock);

class LanguageHeadImpl : public torch::nn::Module {
 public:
  LanguageHeadImpl(std::int64_t width, std::int64_t vocab)
      : ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        out(register_module("out", torch::nn::Linear(width, vocab))) {}
  at::Tensor forward(const at::Tensor& x) { return out(ln(x)); }
  torch::nn::LayerNorm ln;
  torch::nn::Linear out;
};
TORCH_MODULE(LanguageHead);

Model build_gpt(Spec& spec) {
  spec.allow_only({"layers", "width", "heads", "seq", "vocab", "dropout"});
  const auto layers = spec.positive("layers", 4);
  const auto width = spec.positive("width", 256);
  const auto heads = spec.positive("heads", 4);
  const auto seq = spec.positive("seq", 64);
  const auto vocab = spec.positive("vocab", 1000);
  const double dropout = spec.fraction("dropout", 0.0);
  if (width % heads != 0) {
    throw InputError(Input::Model, fmt::format("gpt: heads: expected a divisor of width {}, got {}",
                                               width, heads));
  }
  Model m;
  m.name = fmt::format("gpt-{}x{}", layers, width);
  add_layer(m, "embed", [&] { return Embedding(vocab, width, seq, dropout); });
  for (std::int64_t l = 0; l < layers; ++l) {
    add_layer(m, fmt::format("block{}", l),
              [&] { return TransformerBlock(width, heads, dropout); });
  }
  add_layer(m, "head", [&] { return LanguageHead(width, vocab); });
  m.loss = cross_entropy;
  m.make_batch = [seq, vocab](std::int64_t batch, std::int64_t step, std::uint64_t seed) {
    auto g = at::detail::createCPUGenerator(seed * 1000003 + static_cast<std::uint64_t>(step));
    return std::make_pair(at::randint(vocab, {batch, seq}, g), at::randint(vocab, {batch, seq}, g));
  };
  return m;
}

// --- ResNet-style CNN -----------------------------------------------------------------------

std::shared_ptr<torch::nn::Module> batch_norm(std::int64_t channels, bool deferred) {
  if (deferred) return DeferredBatchNorm2d(channels).ptr();
  return torch::nn::BatchNorm2d(channels).ptr();
}

at::Tensor normalize(const std::shared_ptr<torch::nn::Module>& m, const at::Tensor& x) {
  if (auto* d = m->as<DeferredBatchNorm2dImpl>()) return d->forward(x);
  return m->as<torch::nn::BatchNorm2dImpl>()->forward(x);
}

torch::nn::Conv2d conv3x3(std::int64_t in, std::int64_t out) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1).bias(false));
}

class StemImpl : public torch::nn::Module {
 public:
  StemImpl(std::int64_t channels, bool deferred)
      : conv(register_module("conv", conv3x3(3, channels))),
        bn(register_module("bn", batch_norm(channels, deferred))) {}
  at::Tensor forward(const at::Tensor& x) { return torch::relu(normalize(bn, conv(x))); }
  torch::nn::Conv2d conv;
  std::shared_ptr<torch::nn::Module> bn;
};
TORCH_MODULE(Stem);

class ResidualBlockImpl : public torch::nn::Module {
 public:
  ResidualBlockImpl(std::int64_t channels, bool deferred)
      : conv1(register_module("conv1", conv3x3(channels, channels))),
        bn1(register_module("bn1", batch_norm(channels, deferred))),
        conv2(register_module("conv2", conv3x3(channels, channels))),
        bn2(register_module("bn2", batch_norm(channels, deferred))) {}
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = torch::relu(normalize(bn1, conv1(x)));
    return torch::relu(x + normalize(bn2, conv2(h)));
  }
  torch::nn::Conv2d conv1;
  std::shared_ptr<torch::nn::Module> bn1;
  torch::nn::Conv2d conv2;
  std::shared_ptr<torch::nn::Module> bn2;
};
TORCH_MODULE(ResidualBlock);

class ClassifierImpl : public torch::nn::Module {
 public:
  ClassifierImpl(std::int64_t channels, std::int64_t classes)
      : fc(register_module("fc", torch::nn::Linear(channels, classes))) {}
  at::Tensor forward(const at::Tensor& x) { return fc(x.mean({2, 3})); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Classifier);

Model build_resnet(Spec& spec, const ModelOptions& options) {
  spec.allow_only({"blocks", "channels", "image", "classes"});
  const auto blocks = spec.positive("blocks", 4);
  const auto channels = spec.positive("channels", 32);
  const auto image = spec.positive("image", 32);
  const auto classes = spec.positive("classes", 10);
  Model m;
  m.name = fmt::format("resnet-{}x{}", blocks, channels);
  add_layer(m, "stem", [&] { return Stem(channels, options.deferred_batch_norm); });
  for (std::int64_t b = 0; b < blocks; ++b) {
    add_layer(m, fmt::format("block{}", b),
              [&] { return ResidualBlock(channels, options.deferred_batch_norm); });
  }
  add_layer(m, "head", [&] { return Classifier(channels, classes); });
  m.loss = cross_entropy;
  m.make_batch = [image, classes](std::int64_t batch, std::int64_t step, std::uint64_t seed) {
    auto g = at::detail::createCPUGenerator(seed * 1000003 + static_cast<std::uint64_t>(step));
    return std::make_pair(at::randn({batch, 3, image, image}, g), at::randint(classes, {batch}, g));
  };
  return m;
}

bool looks_like_file(const std::string& name) {
  return name.ends_with(".pt") || name.ends_with(".pth") || name.find('/') != std::string::npos;
}

// Floating parameters and buffers in `dtype`, the others as they are, as Python's Module.to(dtype)
// does: libtorch's Module::to(dtype) converts every tensor, and an int64 buffer made float breaks
// the layer that indexes with it (the position and token-type ids transformers' BERT keeps).
void floating_to(torch::nn::Module& module, at::ScalarType dtype) {
  for (auto tensors : {module.parameters(), module.buffers()}) {
    for (at::Tensor& t : tensors) {
      if (t.defined() && at::isFloatingType(t.scalar_type()) && t.scalar_type() != dtype)
        t.set_data(t.detach().to(dtype));
    }
  }
}

}  // namespace

std::string model_catalogue() {
  return "mlp[:layers=8,width=1024,input=1024,classes=10,dropout=0], "
         "gpt[:layers=4,width=256,heads=4,seq=64,vocab=1000,dropout=0], "
         "resnet[:blocks=4,channels=32,image=32,classes=10], "
         "torchscript:path=FILE.pt,batch=BATCH.pt[,loss=cross_entropy|mse] or "
         "torchscript:path=FILE.pt,input=[long:]3x32x32,classes=10|vocab=V (a scripted "
         "nn.Sequential)";
}

Model build_model(const std::string& text, const ModelOptions& options) {
  Spec spec = Spec::parse(text);
  if (looks_like_file(spec.name())) {
    // "model.pt:input=3x32x32,classes=10" is short for "torchscript:path=model.pt,…".
    const auto colon = text.find(':');
    spec = Spec::parse("torchscript:path=" + spec.name() +
                       (colon == std::string::npos ? "" : "," + text.substr(colon + 1)));
  }
  // Asked for and not done would be silent: the running statistics would move per micro-batch.
  if (options.deferred_batch_norm && spec.name() != "resnet") {
    throw InputError(
        Input::Model,
        spec.name() == "torchscript"
            ? "torchscript: deferred batch norm is only the zoo's resnet's: a TorchScript model's "
              "batch norms update their running statistics per micro-batch, as in torch"
            : fmt::format(
                  "{}: deferred batch norm: it has no batch norm (only the zoo's resnet has)",
                  spec.name()));
  }
  torch::manual_seed(options.seed);
  Model m;
  if (spec.name() == "mlp") {
    m = build_mlp(spec);
  } else if (spec.name() == "gpt") {
    m = build_gpt(spec);
  } else if (spec.name() == "resnet") {
    m = build_resnet(spec, options);
  } else if (spec.name() == "torchscript") {
    m = build_torchscript_model(spec, options);
  } else {
    throw InputError(Input::Model, fmt::format("unknown model \"{}\" (expected {})", spec.name(),
                                               model_catalogue()));
  }
  m.spec = spec.canonical();
  floating_to(*m.layers, options.dtype);
  // Floating data in the model's dtype; token ids and class indices as they are.
  m.make_batch = [make = std::move(m.make_batch), dtype = options.dtype](
                     std::int64_t batch, std::int64_t step, std::uint64_t seed) {
    auto [x, y] = make(batch, step, seed);
    if (at::isFloatingType(x.scalar_type())) x = x.to(dtype);
    if (at::isFloatingType(y.scalar_type())) y = y.to(dtype);
    return std::make_pair(x, y);
  };
  return m;
}

}  // namespace pipetune::models
