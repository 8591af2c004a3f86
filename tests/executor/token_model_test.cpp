// A language model brought as users bring one: a GPT-like Sequential exported by
// scripts/export_model.py with a batch of next-token data (int64 ids in, a target per token).
// Trained pipelined it must give the losses of one stage with one micro-batch, and of plain
// LibTorch training of the whole script written out here, step after step, with Adam.

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>
#include <torch/script.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "executor/executor.hpp"
#include "executor/models/model.hpp"
#include "sim/error.hpp"
#include "tests/support/run_command.hpp"
#include "tests/support/scratch_dir.hpp"

namespace pipetune {
namespace {

namespace fs = std::filesystem;

constexpr std::int64_t kBatch = 8;  // the file holds 20 samples: step 2 wraps around
constexpr int kSteps = 4;
constexpr double kLearningRate = 0.01;

// The exported model and batch, once for every test here.
struct Exported {
  fs::path model, batch;
  std::string spec;
};

const Exported& exported() {
  static const Exported e = [] {
    const fs::path dir = testing::scratch_dir() / "token_model";
    fs::create_directories(dir);
    const auto r = testing::run_command({PIPETUNE_PYTHON, PIPETUNE_EXPORT_MODEL,
                                         std::string(PIPETUNE_TOKEN_MODEL) + ":build", "--out",
                                         (dir / "gpt").string()});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    Exported out{dir / "gpt.pt", dir / "gpt.batch.pt", ""};
    // The spec is the exporter's last line.
    std::string text = r.out;
    while (!text.empty() && text.back() == '\n') text.pop_back();
    out.spec = text.substr(text.rfind('\n') + 1);
    return out;
  }();
  return e;
}

models::Model load(const std::string& spec) {
  models::ModelOptions o;
  o.dtype = at::kDouble;
  return models::build_model(spec, o);
}

std::vector<double> pipelined_losses(const Plan& plan) {
  models::Model model = load(exported().spec);
  exec::ExecutorOptions options;
  for (int s = 0; s < static_cast<int>(plan.balance.size()); ++s)
    options.devices.push_back(fmt::format("cpu:{}", s));
  options.threads_per_cpu_device = 1;
  options.optimizer = exec::OptimizerKind::Adam;
  options.learning_rate = kLearningRate;
  exec::Pipeline pipeline(model, plan, kBatch, options);
  std::vector<double> losses;
  for (int k = 0; k < kSteps; ++k) {
    auto [input, target] = model.make_batch(kBatch, k, 0);
    losses.push_back(pipeline.step(input, target).loss);
  }
  return losses;
}

Plan plan_of(std::vector<int> balance, int chunks, CheckpointMode mode, ScheduleKind schedule) {
  Plan p;
  p.balance = std::move(balance);
  p.chunks = chunks;
  p.checkpoint = mode;
  p.schedule = schedule;
  return p;
}

TEST(TokenModel, ExporterPrintsTheSpec) {
  EXPECT_EQ(exported().spec, "torchscript:path=" + exported().model.string() +
                                 ",batch=" + exported().batch.string());
  const models::Model model = load(exported().spec);
  EXPECT_EQ(model.layer_names, (std::vector<std::string>{"embed", "block0", "block1", "head"}));
  EXPECT_EQ(model.samples, 20);
}

TEST(TokenModel, StepsTakeTheNextSamplesWrappingAround) {
  models::Model model = load(exported().spec);
  const auto [all_inputs, all_targets] = model.make_batch(20, 0, 0);
  ASSERT_EQ(all_inputs.scalar_type(), at::kLong);
  ASSERT_EQ(all_inputs.sizes(), (std::vector<std::int64_t>{20, 16}));
  // The exporter's data: each target is the token after its input.
  EXPECT_TRUE(at::equal(all_inputs.narrow(1, 1, 15), all_targets.narrow(1, 0, 15)));
  const auto [inputs, targets] = model.make_batch(kBatch, 2, 0);  // samples 16..19, then 0..3
  EXPECT_TRUE(at::equal(inputs.narrow(0, 0, 4), all_inputs.narrow(0, 16, 4)));
  EXPECT_TRUE(at::equal(inputs.narrow(0, 4, 4), all_inputs.narrow(0, 0, 4)));
  EXPECT_TRUE(at::equal(targets.narrow(0, 4, 4), all_targets.narrow(0, 0, 4)));
}

// Plain LibTorch: the whole script, the file read by hand, Adam, cross entropy per token.
std::vector<double> trained_by_hand() {
  torch::jit::Module script = torch::jit::load(exported().model.string());
  script.to(at::kDouble);
  script.train();
  std::ifstream in(exported().batch, std::ios::binary);
  const std::vector<char> bytes{std::istreambuf_iterator<char>(in),
                                std::istreambuf_iterator<char>()};
  const auto pair = torch::jit::pickle_load(bytes).toTuple();
  const at::Tensor tokens = pair->elements()[0].toTensor(), next = pair->elements()[1].toTensor();
  std::vector<at::Tensor> parameters;
  for (const auto& p : script.parameters()) parameters.push_back(p);
  torch::optim::Adam adam(parameters, torch::optim::AdamOptions(kLearningRate));
  std::vector<double> losses;
  for (int k = 0; k < kSteps; ++k) {
    std::vector<at::Tensor> x, y;
    for (std::int64_t i = 0; i < kBatch; ++i) {
      const std::int64_t sample = (k * kBatch + i) % tokens.size(0);
      x.push_back(tokens[sample]);
      y.push_back(next[sample]);
    }
    adam.zero_grad();
    const at::Tensor logits = script.forward({at::stack(x)}).toTensor();
    const at::Tensor loss = torch::nn::functional::cross_entropy(
        logits.reshape({-1, logits.size(-1)}), at::stack(y).reshape({-1}));
    loss.backward();
    adam.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

TEST(TokenModel, PipelinedEqualsOneStageAndPlainTraining) {
  const std::vector<double> one_stage =
      pipelined_losses(plan_of({4}, 1, CheckpointMode::Never, ScheduleKind::GPipe));
  const std::vector<double> by_hand = trained_by_hand();
  ASSERT_EQ(one_stage.size(), by_hand.size());
  for (int k = 0; k < kSteps; ++k)
    EXPECT_NEAR(one_stage[k], by_hand[k], 1e-10 * by_hand[k]) << "step " << k;
  EXPECT_LT(by_hand.back(), by_hand.front());  // it learns

  const std::vector<Plan> plans = {
      plan_of({1, 3}, 2, CheckpointMode::ExceptLast, ScheduleKind::GPipe),
      plan_of({2, 2}, 4, CheckpointMode::Always, ScheduleKind::OneFOneB),
      plan_of({3, 1}, 3, CheckpointMode::Never,
              ScheduleKind::OneFOneB),  // micro-batches of 3, 3, 2
      plan_of({1, 1, 2}, 8, CheckpointMode::Always, ScheduleKind::GPipe),
      plan_of({1, 1, 1, 1}, 4, CheckpointMode::ExceptLast, ScheduleKind::OneFOneB),
      plan_of({2, 2}, 1, CheckpointMode::Never, ScheduleKind::GPipe),
  };
  for (const Plan& plan : plans) {
    const std::vector<double> losses = pipelined_losses(plan);
    for (int k = 0; k < kSteps; ++k) {
      EXPECT_NEAR(losses[k], one_stage[k], 1e-10 * one_stage[k])
          << describe_plan(plan) << " step " << k;
    }
  }
}

TEST(TokenModel, BadBatchesAreRefusedBeforeTraining) {
  models::Model model = load(exported().spec);
  try {
    models::check_model_batch(model, 21);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "batch size 21: the model's batch file holds only 20 samples");
    EXPECT_EQ(e.naming_input_as("--batch"),
              "--batch 21: the model's batch file holds only 20 samples");
  }
  EXPECT_NO_THROW(models::check_model_batch(model, 20));
  EXPECT_TRUE(model.layers->is_training());  // the check leaves the mode as it was
}

}  // namespace
}  // namespace pipetune
