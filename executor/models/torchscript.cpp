// Bring-your-own models: a TorchScript file whose top level is a Sequential, split by its
// children. Each child becomes one layer; its parameters and buffers are shared with the
// scripted module, so moving or training the layer moves and trains the script. The data is a
// batch file (batch_file.hpp) or random: floats, or token ids with a target per token.

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/library.h>
#include <torch/script.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_set>
#include <vector>

#include "executor/models/batch_file.hpp"
#include "executor/models/layers.hpp"
#include "executor/models/loss.hpp"
#include "executor/models/model.hpp"
#include "executor/models/script_random.hpp"
#include "executor/models/spec.hpp"
#include "sim/error.hpp"

namespace pipetune::models {

namespace {

// Fused attention draws its dropout inside the kernel: random unless its dropout_p (the fifth
// input) is the constant 0. Libraries (transformers, timm) call it with their attention dropout.
bool attention_dropout(const torch::jit::Node* node) {
  if (std::string(node->kind().toQualString()) != "aten::scaled_dot_product_attention") {
    return false;
  }
  if (node->inputs().size() < 5) return true;
  const std::optional<c10::IValue> p = torch::jit::toIValue(node->input(4));
  return !(p && p->isDouble() && p->toDouble() == 0.0);
}

// Dropout and its kin (input, p, train) draw nothing when p is the constant 0 or train the
// constant false: ATen returns the input. Libraries leave many such in their blocks (timm's ViT
// and a Llama from transformers have nothing else), and a layer counted as random holds a lock
// for its forward (ScriptLayerImpl): two devices' forwards would take turns for nothing.
bool draws_nothing(const torch::jit::Node* node) {
  if (node->inputs().size() < 3) return false;
  const std::optional<c10::IValue> p = torch::jit::toIValue(node->input(1));
  const std::optional<c10::IValue> train = torch::jit::toIValue(node->input(2));
  return (p && p->isDouble() && p->toDouble() == 0.0) ||
         (train && train->isBool() && !train->toBool());
}

const c10::Symbol& generator_for_symbol() {
  static const c10::Symbol symbol = c10::Symbol::fromQualString("pipetune::generator_for");
  return symbol;
}

// The input a node takes its `Generator? generator` argument at, if its schema has one.
std::optional<std::size_t> generator_input(const torch::jit::Node* node) {
  const c10::FunctionSchema* schema = node->maybeSchema();
  if (schema == nullptr) return std::nullopt;
  const auto& arguments = schema->arguments();
  for (std::size_t k = 0; k < arguments.size() && k < node->inputs().size(); ++k) {
    if (arguments[k].name() == "generator") return k;
  }
  return std::nullopt;
}

// A sampler rewritten by draw_from_the_threads_generator: its generator is the thread's.
bool samples_with_the_threads_generator(const torch::jit::Node* node) {
  const auto k = generator_input(node);
  return k && node->input(*k)->node()->kind() == generator_for_symbol();
}

// Whether a graph (its blocks included) draws random numbers: dropout and its kin, sampling.
bool draws_random(const torch::jit::Block* block) {
  static const std::unordered_set<std::string> kinds = {"aten::dropout",
                                                        "aten::dropout_",
                                                        "aten::feature_dropout",
                                                        "aten::feature_dropout_",
                                                        "aten::alpha_dropout",
                                                        "aten::alpha_dropout_",
                                                        "aten::feature_alpha_dropout",
                                                        "aten::feature_alpha_dropout_",
                                                        "aten::native_dropout",
                                                        "aten::bernoulli",
                                                        "aten::bernoulli_",
                                                        "aten::rand",
                                                        "aten::rand_like",
                                                        "aten::randn",
                                                        "aten::randn_like",
                                                        "aten::randint",
                                                        "aten::randint_like",
                                                        "aten::randperm",
                                                        "aten::multinomial",
                                                        "aten::normal",
                                                        "aten::normal_",
                                                        "aten::uniform_",
                                                        "aten::rrelu",
                                                        "aten::rrelu_",
                                                        "aten::exponential_",
                                                        "aten::geometric_",
                                                        "aten::cauchy_",
                                                        "aten::log_normal_",
                                                        "aten::random_"};
  for (const torch::jit::Node* node : block->nodes()) {
    const std::string kind = node->kind().toQualString();
    if (kinds.count(kind) != 0 &&
        !(kind.find("dropout") != std::string::npos && draws_nothing(node)) &&
        !samples_with_the_threads_generator(node))
      return true;
    if (attention_dropout(node)) return true;
    for (const torch::jit::Block* inner : node->blocks()) {
      if (draws_random(inner)) return true;
    }
  }
  return false;
}

}  // namespace

bool script_draws_random(const torch::jit::Module& module) {
  auto graph = module.get_method("forward").graph()->copy();
  torch::jit::Inline(*graph);  // the submodules' calls, so that their dropout shows
  return draws_random(graph->block());
}

namespace {

// A script's aten::dropout, rewritten (draw_from_the_threads_generator): the mask drawn from the
// generator the executor sets for the micro-batch on this thread (ScopedGenerator), the global
// one without. The mask is kept as bool, as ATen's own dropout keeps it.
at::Tensor seeded_dropout(const at::Tensor& input, double p, bool train) {
  if (!train || p == 0.0) return input;
  if (p == 1.0) return input * at::zeros({}, input.options());
  std::optional<at::Generator> generator;
  if (at::Generator* mine = ScopedGenerator::current()) generator = *mine;
  const at::Tensor keep =
      at::empty(input.sizes(), input.options().dtype(at::kBool)).bernoulli_(1.0 - p, generator);
  return input * keep * (1.0 / (1.0 - p));
}

// The generator a sampler working on `like` (bernoulli_, uniform_, rand_like, …) draws from: the
// thread's (ScopedGenerator) while the executor or the profiler runs a micro-batch, the global one
// (none given) otherwise. A draw on another kind of device than the thread's generator's (a CPU
// tensor sampled inside a stage on a GPU) is refused: from the global generator it would draw
// other numbers in a recompute.
std::optional<at::Generator> generator_for(const at::Tensor& like) {
  at::Generator* mine = ScopedGenerator::current();
  if (mine == nullptr) return std::nullopt;
  if (mine->device().type() != like.device().type()) {
    throw std::runtime_error(fmt::format(
        "a random draw on a {} tensor inside a stage whose generator is on {}: not supported",
        c10::DeviceTypeName(like.device().type(), true),
        c10::DeviceTypeName(mine->device().type(), true)));
  }
  return *mine;
}

// Registered on first use and never unregistered: a static registration's destructor runs at
// exit after the dispatcher's own (another library's static), which ThreadSanitizer reports as
// an unlock of a destroyed mutex. Composite: autograd records the ATen calls inside, so no
// backward of its own is needed.
void register_seeded_dropout() {
  // Kept on purpose (scripts/lsan.supp names this function).
  static torch::Library* const schema = [] {
    auto* library =
        new torch::Library(torch::Library::DEF, "pipetune", std::nullopt, __FILE__, __LINE__);
    library->def("dropout(Tensor input, float p, bool train) -> Tensor");
    library->def("generator_for(Tensor like) -> Generator?");
    return library;
  }();
  static torch::Library* const kernel = [] {
    auto* library =
        new torch::Library(torch::Library::IMPL, "pipetune",
                           c10::DispatchKey::CompositeImplicitAutograd, __FILE__, __LINE__);
    library->impl("dropout", &seeded_dropout);
    library->impl("generator_for", &generator_for);
    return library;
  }();
  (void)schema;
  (void)kernel;
}

void collect_dropouts(torch::jit::Block* block, std::vector<torch::jit::Node*>& found) {
  for (torch::jit::Node* node : block->nodes()) {
    if (std::string(node->kind().toQualString()) == "aten::dropout" && node->inputs().size() == 3)
      found.push_back(node);
    for (torch::jit::Block* inner : node->blocks()) collect_dropouts(inner, found);
  }
}

// Samplers that take a generator (none given) and a tensor first, which fixes the device they
// draw on: torchvision's stochastic depth and timm's drop path (`bernoulli_`), `uniform_`,
// `rand_like`, `multinomial`, …. Factory functions (`rand`, `randn`, `randperm`) have no such
// tensor and keep the global generator.
void collect_samplers(torch::jit::Block* block, std::vector<torch::jit::Node*>& found) {
  for (torch::jit::Node* node : block->nodes()) {
    const auto k = generator_input(node);
    if (k && node->input(*k)->mustBeNone() && !node->inputs().empty() &&
        node->input(0)->type()->kind() == c10::TypeKind::TensorType)
      found.push_back(node);
    for (torch::jit::Block* inner : node->blocks()) collect_samplers(inner, found);
  }
}

// Replaces the forward's aten::dropout (its submodules' inlined) with pipetune::dropout, and
// gives every sampler of a tensor (bernoulli_, uniform_, …) the generator pipetune::generator_for
// returns: both draw from the thread's own generator, so such layers need no lock (below) and
// run on every device at once. Children of one class share their forward; the rewrite leaves
// nothing for a second pass to find.
void draw_from_the_threads_generator(torch::jit::Module& module) {
  register_seeded_dropout();
  const std::shared_ptr<torch::jit::Graph> graph = module.get_method("forward").graph();
  torch::jit::Inline(*graph);
  std::vector<torch::jit::Node*> found;
  collect_dropouts(graph->block(), found);
  static const c10::Symbol ours = c10::Symbol::fromQualString("pipetune::dropout");
  for (torch::jit::Node* node : found) {
    torch::jit::WithInsertPoint here(node);
    torch::jit::Node* replacement = graph->insertNode(graph->create(ours, node->inputs(), 1));
    replacement->output()->setType(node->output()->type());
    node->output()->replaceAllUsesWith(replacement->output());
    node->destroy();
  }
  std::vector<torch::jit::Node*> samplers;
  collect_samplers(graph->block(), samplers);
  for (torch::jit::Node* node : samplers) {
    torch::jit::WithInsertPoint here(node);
    torch::jit::Node* generator =
        graph->insertNode(graph->create(generator_for_symbol(), {node->input(0)}, 1));
    generator->output()->setType(c10::OptionalType::create(c10::GeneratorType::get()));
    node->replaceInput(*generator_input(node), generator->output());
  }
}

// What else draws from the global generator (fused attention's dropout, factory functions such as
// rand and randperm, in-place and channel dropout), which every stage's thread shares: left alone,
// a recomputed micro-batch would draw other numbers than its forward did (wrong gradients under
// checkpointing) and concurrent stages would interleave their draws. So while the executor runs a
// micro-batch (ScopedGenerator set), such a layer holds this lock for its forward and draws from
// the global generator seeded for (micro-batch, layer): the same numbers on a recompute, whatever
// ran meanwhile. The price: these layers' forwards do not overlap across stages.
std::mutex global_generator_lock;

class ScriptLayerImpl : public torch::nn::Module {
 public:
  ScriptLayerImpl(torch::jit::Module module, std::uint64_t salt)
      : module_(std::move(module)), salt_(salt) {
    draw_from_the_threads_generator(module_);
    random_ = script_draws_random(module_);
    // Names may not contain dots in a torch::nn::Module.
    auto clean = [](std::string name) {
      for (auto& c : name) {
        if (c == '.') c = '_';
      }
      return name;
    };
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
      register_parameter(clean(p.name), p.value, p.value.requires_grad());
      script_names_.emplace(clean(p.name), p.name);
    }
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) {
      register_buffer(clean(b.name), b.value);
    }
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Generator* mine = ScopedGenerator::current();
    if (!random_ || mine == nullptr) return module_.forward({x}).toTensor();
    std::lock_guard<std::mutex> lock(global_generator_lock);
    at::Generator global = at::globalContext().defaultGenerator(x.device());
    at::Tensor saved;
    {
      std::lock_guard<std::mutex> g(global.mutex());
      saved = global.get_state();
      global.set_current_seed(mine->current_seed() ^ (salt_ * 0x9E3779B97F4A7C15ULL));
    }
    at::Tensor out = module_.forward({x}).toTensor();
    std::lock_guard<std::mutex> g(global.mutex());
    global.set_state(saved);
    return out;
  }
  void train(bool on = true) override {
    torch::nn::Module::train(on);
    module_.train(on);
  }

  // The script reads its parameters from its own slots, so both the slot and this wrapper's
  // entry must change for the forward to see `tensor`.
  bool repoint(const std::string& name, const at::Tensor& tensor) {
    const auto it = script_names_.find(name);
    if (it == script_names_.end()) return false;
    torch::jit::Module owner = module_;
    std::string path = it->second;
    for (auto dot = path.find('.'); dot != std::string::npos; dot = path.find('.')) {
      owner = owner.attr(path.substr(0, dot)).toModule();
      path = path.substr(dot + 1);
    }
    owner.register_parameter(path, tensor, /*is_buffer=*/false);
    parameters_[name] = tensor;
    return true;
  }
  bool holds(const std::string& name) const { return script_names_.count(name) > 0; }

 private:
  torch::jit::Module module_;
  std::map<std::string, std::string> script_names_;  // this wrapper's name -> the script's
  std::uint64_t salt_;  // the layer's index plus one: its masks differ from its neighbours'
  bool random_ = false;
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
    m.layers->push_back(std::string(child.name), ScriptLayer(child.value, m.layer_names.size()));
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

bool can_repoint(torch::nn::Module& layer, const std::string& name) {
  const auto* script = dynamic_cast<ScriptLayerImpl*>(&layer);
  return script != nullptr && script->holds(name);
}

bool repoint_parameter(torch::nn::Module& layer, const std::string& name,
                       const at::Tensor& tensor) {
  auto* script = dynamic_cast<ScriptLayerImpl*>(&layer);
  return script != nullptr && script->repoint(name, tensor);
}

}  // namespace pipetune::models
