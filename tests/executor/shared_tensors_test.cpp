// Tied weights: two layers holding one tensor must train as one tensor, with one gradient summed
// over both uses and one update, or the plan is refused. The truth is a training loop written
// out by hand on the two raw tensors, independent of the executor.

#include "executor/models/shared_tensors.hpp"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/script.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <unordered_set>

#include "executor/executor.hpp"
#include "sim/error.hpp"
#include "tests/sim/fixtures.hpp"
#include "tests/support/run_command.hpp"
#include "tests/support/scratch_dir.hpp"
#include "tests/support/tied_head.hpp"

namespace pipetune {
namespace {

using ::testing::HasSubstr;

using testing::TiedHead;
using testing::TiedHeadImpl;

constexpr std::int64_t kBatch = 6;

enum class Head { Tied, Untied, View };

// pre (4 -> 4), embed (4 -> 6, weight W), act (tanh), head (6 -> 4: W itself, a copy of W, or a
// view of W's storage).
models::Model tied_model(Head head = Head::Tied) {
  torch::manual_seed(3);
  models::Model m;
  m.name = "tied";
  auto pre = torch::nn::Linear(torch::nn::LinearOptions(4, 4).bias(false));
  auto embed = torch::nn::Linear(torch::nn::LinearOptions(4, 6).bias(false));
  pre->to(at::kDouble);
  embed->to(at::kDouble);
  m.layer_names = {"pre", "embed", "act", "head"};
  m.layers->push_back("pre", pre);
  m.layers->push_back("embed", embed);
  m.layers->push_back("act", torch::nn::Tanh());
  const at::Tensor w = embed->weight;
  m.layers->push_back("head", TiedHead(head == Head::Tied     ? w
                                       : head == Head::Untied ? w.detach().clone()
                                                              : w.detach().view({6, 4})));
  m.loss = [](const at::Tensor& out, const at::Tensor& target) {
    return at::mse_loss(out, target);
  };
  m.make_batch = [](std::int64_t batch, std::int64_t step, std::uint64_t) {
    const auto gen = at::TensorOptions().dtype(at::kDouble);
    torch::manual_seed(100 + step);
    return std::pair{at::randn({batch, 4}, gen), at::randn({batch, 4}, gen)};
  };
  return m;
}

exec::ExecutorOptions cpu_devices(int n, exec::OptimizerKind optimizer, double lr) {
  exec::ExecutorOptions o;
  for (int d = 0; d < n; ++d) o.devices.push_back("cpu:" + std::to_string(d));
  o.threads_per_cpu_device = 1;
  o.optimizer = optimizer;
  o.learning_rate = lr;
  return o;
}

TEST(SharedTensors, FindsTheLayersThatHoldOneTensor) {
  models::Model m = tied_model();
  const auto shared = models::shared_tensors(m);
  ASSERT_EQ(shared.size(), 1u);
  EXPECT_EQ(shared[0].first_layer, 1u);
  EXPECT_EQ(shared[0].second_layer, 3u);
  EXPECT_TRUE(shared[0].parameter);
  EXPECT_EQ(models::describe(m, shared[0]),
            "layers 1 (\"embed\") and 3 (\"head\") share a parameter (embed.weight is "
            "head.weight)");
  // An untied copy of the same shapes shares nothing.
  models::Model untied = tied_model(Head::Untied);
  EXPECT_TRUE(models::shared_tensors(untied).empty());
}

TEST(SharedTensors, AViewOfAnotherLayersTensorCountsAsShared) {
  // The head holds a view of the embedding's storage, not the tensor itself.
  models::Model m = tied_model(Head::View);
  const auto shared = models::shared_tensors(m);
  ASSERT_EQ(shared.size(), 1u);
  EXPECT_EQ(shared[0].second_layer, 3u);
}

TEST(SharedTensors, APlanThatSplitsThemIsRefusedBeforeAnyWork) {
  const std::vector<std::pair<std::vector<int>, std::string>> cases{
      {{2, 2}, "on stages 0 and 1"}, {{1, 1, 2}, "on stages 1 and 2"}};
  for (const auto& [balance, stages] : cases) {
    models::Model m = tied_model();
    const at::Tensor before =
        m.layers->ptr(1)->as<torch::nn::LinearImpl>()->weight.detach().clone();
    try {
      exec::Pipeline pipeline(
          m, testing::make_plan(balance, 2, CheckpointMode::Never, ScheduleKind::GPipe), kBatch,
          cpu_devices(static_cast<int>(balance.size()), exec::OptimizerKind::Sgd, 0.1));
      ADD_FAILURE() << "a plan splitting the tied layers was accepted";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_THAT(what, HasSubstr("layers 1 (\"embed\") and 3 (\"head\") share a parameter"));
      EXPECT_THAT(what, HasSubstr(stages));
      EXPECT_EQ(what.find('\n'), std::string::npos);
    }
    EXPECT_TRUE(at::equal(m.layers->ptr(1)->as<torch::nn::LinearImpl>()->weight, before));
  }
}

struct HandWritten {
  at::Tensor pre, tied;
};

// The model written out on its two raw tensors, one update each per step.
double hand_written_loss(const HandWritten& h, const at::Tensor& x, const at::Tensor& y) {
  const at::Tensor hidden = at::tanh(x.matmul(h.pre.t()).matmul(h.tied.t()));
  return at::mse_loss(hidden.matmul(h.tied), y).item<double>();
}

class OneStageTrainsOneTensor
    : public ::testing::TestWithParam<std::tuple<exec::OptimizerKind, CheckpointMode, int>> {};

TEST_P(OneStageTrainsOneTensor, LossesAndWeightsEqualTheHandWrittenLoop) {
  const auto [kind, checkpoint, chunks] = GetParam();
  constexpr double kLr = 0.05;
  models::Model m = tied_model();
  // The tied pair on stage 1, "pre" on stage 0: two devices, the tie on one stage.
  exec::Pipeline pipeline(m, testing::make_plan({1, 3}, chunks, checkpoint, ScheduleKind::OneFOneB),
                          kBatch, cpu_devices(2, kind, kLr));
  auto* embed = m.layers->ptr(1)->as<torch::nn::LinearImpl>();
  auto* pre = m.layers->ptr(0)->as<torch::nn::LinearImpl>();
  HandWritten h{pre->weight.detach().clone().requires_grad_(),
                embed->weight.detach().clone().requires_grad_()};
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (kind == exec::OptimizerKind::Adam) {
    optimizer = std::make_unique<torch::optim::Adam>(std::vector<at::Tensor>{h.pre, h.tied},
                                                     torch::optim::AdamOptions(kLr));
  } else {
    optimizer = std::make_unique<torch::optim::SGD>(std::vector<at::Tensor>{h.pre, h.tied},
                                                    torch::optim::SGDOptions(kLr));
  }
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = m.make_batch(kBatch, step, 0);
    const exec::StepRecord record = pipeline.step(x, y);
    EXPECT_NEAR(record.loss, hand_written_loss(h, x, y), 1e-12) << "step " << step;
    optimizer->zero_grad();
    const at::Tensor hidden = at::tanh(x.matmul(h.pre.t()).matmul(h.tied.t()));
    at::mse_loss(hidden.matmul(h.tied), y).backward();
    optimizer->step();
    EXPECT_TRUE(at::allclose(embed->weight, h.tied, 1e-10, 1e-12)) << "step " << step;
    EXPECT_TRUE(at::allclose(pre->weight, h.pre, 1e-10, 1e-12)) << "step " << step;
  }
  // The two layers still hold one tensor.
  EXPECT_TRUE(m.layers->ptr(3)->as<TiedHeadImpl>()->weight.is_same(embed->weight));
}

INSTANTIATE_TEST_SUITE_P(
    SgdAndAdam, OneStageTrainsOneTensor,
    ::testing::Combine(::testing::Values(exec::OptimizerKind::Sgd, exec::OptimizerKind::Adam),
                       ::testing::Values(CheckpointMode::Never, CheckpointMode::Always),
                       ::testing::Values(1, 3)));

// A TorchScript model made by make_torchscript.py with OPTION, written once per test program.
std::string script_spec(const std::string& option) {
  static std::map<std::string, std::string> made;
  if (auto it = made.find(option); it != made.end()) return it->second;
  const auto path = testing::scratch_dir() / (option.substr(2) + ".pt");
  const auto run =
      testing::run_command({PIPETUNE_PYTHON, PIPETUNE_MAKE_SCRIPT, path.string(), option});
  if (run.exit_code != 0) throw std::runtime_error(run.err);
  return made[option] = path.string() + ":input=8,classes=4";
}

// --tied: the first child and the fourth hold one weight: 8 -> 6 (W), tanh, 6 -> 6, 6 -> 8 (W
// again), 8 -> 4. --shared-block: 8 -> 6, then one Linear 6 -> 6 (weight and bias) with tanh at
// children 1 to 4, then 6 -> 4.
models::Model script_model(const std::string& option) {
  models::ModelOptions o;
  o.dtype = at::kDouble;
  return models::build_model(script_spec(option), o);
}

struct TiedSplit {
  std::string name;
  std::vector<int> balance;
  int chunks;
  ScheduleKind schedule;
  int stages_per_device = 1;
  std::string model = "--tied";
};

void PrintTo(const TiedSplit& split, std::ostream* out) {
  *out << split.name;
}

// Every schedule, the tie (layers 0 and 3) on two stages of two devices, or of three.
const TiedSplit kTiedSplits[] = {
    {"gpipe_2", {2, 3}, 2, ScheduleKind::GPipe},
    {"gpipe_3", {1, 2, 2}, 3, ScheduleKind::GPipe},
    {"onefoneb_2", {3, 2}, 3, ScheduleKind::OneFOneB},
    {"onefoneb_3", {1, 2, 2}, 2, ScheduleKind::OneFOneB},
    {"interleaved", {1, 1, 1, 2}, 2, ScheduleKind::Interleaved1F1B, 2},
    {"interleaved_zb", {1, 1, 1, 2}, 3, ScheduleKind::InterleavedZB, 2},
    {"looped_bfs", {1, 1, 1, 2}, 2, ScheduleKind::LoopedBFS, 2},
    {"zbv", {1, 1, 2, 1}, 2, ScheduleKind::ZBV, 2},
    {"dualpipev", {1, 1, 2, 1}, 6, ScheduleKind::DualPipeV, 2},
    // One tie of four holders: two of them on one stage, stages holding it on one device.
    {"shared_gpipe_3", {1, 2, 3}, 2, ScheduleKind::GPipe, 1, "--shared-block"},
    {"shared_onefoneb_3", {2, 2, 2}, 3, ScheduleKind::OneFOneB, 1, "--shared-block"},
    {"shared_interleaved", {2, 1, 1, 2}, 2, ScheduleKind::Interleaved1F1B, 2, "--shared-block"},
    {"shared_interleaved_zb", {1, 2, 1, 2}, 3, ScheduleKind::InterleavedZB, 2, "--shared-block"},
    {"shared_looped_bfs", {2, 1, 1, 2}, 2, ScheduleKind::LoopedBFS, 2, "--shared-block"},
    {"shared_zbv", {1, 2, 2, 1}, 2, ScheduleKind::ZBV, 2, "--shared-block"},
    {"shared_dualpipev", {1, 2, 2, 1}, 6, ScheduleKind::DualPipeV, 2, "--shared-block"},
};

// The same script trained by plain LibTorch, written out here: the whole batch at once, the
// tied tensor listed once in the optimizer (the truth for the one-device update).
class HandWrittenScript {
 public:
  HandWrittenScript(const std::string& spec, exec::OptimizerKind kind, double lr)
      : module_(torch::jit::load(spec.substr(0, spec.find(':')))) {
    module_.to(at::kDouble);
    module_.train();
    std::vector<at::Tensor> parameters;
    std::unordered_set<const void*> seen;
    for (const auto& p : module_.parameters()) {
      if (seen.insert(p.unsafeGetTensorImpl()).second) parameters.push_back(p);
    }
    if (kind == exec::OptimizerKind::Adam) {
      optimizer_ = std::make_unique<torch::optim::Adam>(parameters, torch::optim::AdamOptions(lr));
    } else {
      optimizer_ = std::make_unique<torch::optim::SGD>(parameters, torch::optim::SGDOptions(lr));
    }
  }
  double step(const at::Tensor& x, const at::Tensor& y) {
    optimizer_->zero_grad();
    const at::Tensor loss = at::cross_entropy_loss(module_.forward({x}).toTensor(), y);
    loss.backward();
    optimizer_->step();
    return loss.item<double>();
  }
  std::map<std::string, at::Tensor> parameters() const {
    std::map<std::string, at::Tensor> out;
    for (const auto& p : module_.named_parameters()) out[p.name] = p.value;
    return out;
  }

 private:
  torch::jit::Module module_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

class TiedSplitTrainsAsOneDevice
    : public ::testing::TestWithParam<std::tuple<TiedSplit, CheckpointMode, exec::OptimizerKind>> {
};

// Two truths: the same file trained on one device and one stage by the executor, and by plain
// LibTorch; every split must give their losses step after step and their weights at the end,
// and leave the two layers holding one tensor again.
TEST_P(TiedSplitTrainsAsOneDevice, LossesAndWeightsEqualOneDeviceAndPlainLibTorch) {
  const auto& [split, checkpoint, kind] = GetParam();
  constexpr double kLr = 0.05;
  models::Model reference = script_model(split.model);
  models::Model model = script_model(split.model);
  const auto ties = models::tied_parameters(model);
  ASSERT_EQ(ties.size(), split.model == "--tied" ? 1u : 2u);
  HandWrittenScript by_hand(script_spec(split.model), kind, kLr);
  Plan plan = testing::make_plan(split.balance, split.chunks, checkpoint, split.schedule);
  plan.stages_per_device = split.stages_per_device;
  const int devices = plan.stages() / split.stages_per_device;
  const int layers = static_cast<int>(model.layer_names.size());
  {
    exec::Pipeline one(reference, testing::make_plan({layers}, 1, CheckpointMode::Never), kBatch,
                       cpu_devices(1, kind, kLr));
    exec::Pipeline pipeline(model, plan, kBatch, cpu_devices(devices, kind, kLr));
    for (int step = 0; step < 3; ++step) {
      auto [x, y] = reference.make_batch(kBatch, step, 0);
      x = x.to(at::kDouble);
      const double want = by_hand.step(x, y);
      EXPECT_NEAR(one.step(x, y).loss, want, 1e-10 * std::abs(want)) << "step " << step;
      EXPECT_NEAR(pipeline.step(x, y).loss, want, 1e-10 * std::abs(want)) << "step " << step;
    }
  }
  const auto want = reference.layers->named_parameters(), got = model.layers->named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (const auto& p : want) {
    EXPECT_TRUE(at::allclose(got[p.key()], p.value(), 1e-10, 1e-12)) << p.key();
  }
  // The plain loop's weights, every name (a tied tensor under each of its holders' names); a
  // script layer names a child's parameter "1.linear_weight" for the script's "1.linear.weight".
  for (const auto& [script_name, tensor] : by_hand.parameters()) {
    std::string name = script_name;
    std::replace(name.begin() + static_cast<std::ptrdiff_t>(name.find('.') + 1), name.end(), '.',
                 '_');
    ASSERT_TRUE(got.contains(name)) << name;
    EXPECT_TRUE(at::allclose(got[name], tensor, 1e-10, 1e-12)) << name;
  }
  // Every holder holds the one tensor again.
  for (const auto& tie : models::tied_parameters(model)) {
    for (std::size_t layer : tie.layers) {
      bool holds = false;
      for (const auto& p : model.layers->ptr(layer)->named_parameters()) {
        holds = holds || p.value().is_same(tie.tensor);
      }
      EXPECT_TRUE(holds) << tie.name << " in layer " << layer;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    EverySchedule, TiedSplitTrainsAsOneDevice,
    ::testing::Combine(::testing::ValuesIn(kTiedSplits),
                       ::testing::Values(CheckpointMode::Never, CheckpointMode::ExceptLast,
                                         CheckpointMode::Always),
                       ::testing::Values(exec::OptimizerKind::Sgd, exec::OptimizerKind::Adam)),
    [](const auto& info) {
      return std::get<0>(info.param).name + "_" + std::string(to_string(std::get<1>(info.param))) +
             (std::get<2>(info.param) == exec::OptimizerKind::Adam ? "_adam" : "_sgd");
    });

// A tie held by a C++ module cannot be given a copy of its own: a split is still refused.
TEST(SharedTensors, ACxxModulesTieSplitIsRefusedNamingWhy) {
  models::Model m = tied_model();
  try {
    exec::Pipeline pipeline(m, testing::make_plan({2, 2}, 2, CheckpointMode::Never), kBatch,
                            cpu_devices(2, exec::OptimizerKind::Sgd, 0.1));
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("is not a TorchScript layer"));
  }
}

}  // namespace
}  // namespace pipetune
