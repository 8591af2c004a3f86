// Bring-your-own models: a TorchScript Sequential, written by the torch wheel's Python, split by
// its children and run pipelined exactly like the zoo's.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/script.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <utility>
#include <vector>

#include "executor/executor.hpp"
#include "executor/models/layers.hpp"
#include "executor/models/script_random.hpp"
#include "sim/error.hpp"
#include "tests/executor/reference.hpp"
#include "tests/support/run_command.hpp"
#include "tests/support/scratch_dir.hpp"

namespace pipetune {
namespace {

// One step of `plan` over a fresh float64 build of `spec` on `devices`, without an optimizer, at
// dropout seed `seed`: the loss and every parameter's gradient.
struct Step {
  double loss = 0.0;
  std::map<std::string, at::Tensor> gradients;
};
Step step_of(const std::string& spec, const Plan& plan, std::vector<std::string> devices,
             std::int64_t batch, std::uint64_t seed) {
  models::ModelOptions o;
  o.dtype = at::kDouble;
  models::Model model = models::build_model(spec, o);
  auto [x, y] = model.make_batch(batch, 1, 0);
  exec::ExecutorOptions options;
  options.devices = std::move(devices);
  options.optimizer = exec::OptimizerKind::None;
  options.seed = seed;
  exec::Pipeline pipeline(model, plan, batch, options);
  const double loss = pipeline.step(x, y).loss;
  return {loss, testing::gradients(model)};
}

// One step of `plan` over `model` (a float64 build of `spec`) on two devices, without an
// optimizer, against the independent truth: plain autograd over another build of `spec`, one
// micro-batch after another (a batch of 6). The same loss and every gradient.
void expect_trains_as_reference(models::Model& model, const std::string& spec, const Plan& plan) {
  models::ModelOptions o;
  o.dtype = at::kDouble;
  models::Model reference = models::build_model(spec, o);
  auto [x, y] = reference.make_batch(6, 1, 0);
  const double expected = testing::reference_step(reference, x, y, plan.chunks);
  exec::ExecutorOptions options;
  options.devices = {"cpu:0", "cpu:1"};
  options.optimizer = exec::OptimizerKind::None;
  exec::Pipeline pipeline(model, plan, 6, options);
  const std::string what = describe_plan(plan);
  EXPECT_NEAR(pipeline.step(x, y).loss, expected, 1e-12) << what;
  const auto want = testing::gradients(reference), got = testing::gradients(model);
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, g] : want)
    EXPECT_TRUE(at::allclose(got.at(name), g, 1e-10, 1e-12)) << what << ": " << name;
}

// The same training, but for the order in which gradients were added up (1e-17 apart).
void expect_same_step(const Step& got, const Step& want, const Plan& plan) {
  const std::string what = describe_plan(plan);
  EXPECT_NEAR(got.loss, want.loss, 1e-12) << what;
  for (const auto& [name, g] : want.gradients) {
    EXPECT_TRUE(at::allclose(got.gradients.at(name), g, 1e-10, 1e-14))
        << what << " " << name << ": " << (got.gradients.at(name) - g).abs().max().item<double>();
  }
}

TEST(TorchScript, ScriptedSequentialRunsPipelinedLikeTheZoo) {
  const auto path = testing::scratch_dir() / "script.pt";
  const auto made = testing::run_command({PIPETUNE_PYTHON, PIPETUNE_MAKE_SCRIPT, path.string()});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const std::string spec = path.string() + ":input=8,classes=4";
  models::ModelOptions o;
  o.dtype = at::kDouble;
  models::Model model = models::build_model(spec, o);
  EXPECT_EQ(model.layer_names, (std::vector<std::string>{"0", "1", "2", "3", "4"}));
  Plan plan;
  plan.balance = {2, 3};
  plan.chunks = 3;
  plan.checkpoint = CheckpointMode::Always;
  expect_trains_as_reference(model, spec, plan);
  std::filesystem::remove(path);
}

// A split before a layer that changes its input in place (torchvision's ReLU(inplace=True), or a
// block's `x += …`): autograd refuses that change on the leaf that collects the stage input's
// gradient, and a checkpointed forward, without autograd, would change the input its recompute
// reads again. The stage's layers run on a copy: the loss and every gradient are one device's
// (plain autograd over the whole model), with and without checkpointing, and with the backward
// split as zero-bubble schedules run it.
TEST(TorchScript, AStageThatStartsWithALayerChangingItsInputInPlaceTrainsAsOneDevice) {
  const auto path = testing::scratch_dir() / "inplace.pt";
  const auto made =
      testing::run_command({PIPETUNE_PYTHON, PIPETUNE_MAKE_SCRIPT, path.string(), "--in-place"});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const std::string spec = path.string() + ":input=8,classes=4";
  models::ModelOptions o;
  o.dtype = at::kDouble;
  struct Case {
    std::vector<int> balance;
    CheckpointMode checkpoint;
    ScheduleKind schedule;
    int stages_per_device;
  };
  const Case cases[] = {{{1, 5}, CheckpointMode::Never, ScheduleKind::OneFOneB, 1},
                        {{2, 4}, CheckpointMode::Always, ScheduleKind::GPipe, 1},
                        {{1, 1, 2, 2}, CheckpointMode::Never, ScheduleKind::InterleavedZB, 2},
                        {{1, 1, 2, 2}, CheckpointMode::Always, ScheduleKind::Interleaved1F1B, 2}};
  for (const Case& c : cases) {
    models::Model model = models::build_model(spec, o);
    Plan plan;
    plan.balance = c.balance;
    plan.chunks = 3;
    plan.checkpoint = c.checkpoint;
    plan.schedule = c.schedule;
    plan.stages_per_device = c.stages_per_device;
    expect_trains_as_reference(model, spec, plan);
  }
  std::filesystem::remove(path);
}

// A script's dropout draws from torch's global generator, which the stages' threads share. A
// checkpointed micro-batch's recompute must draw the masks its forward drew, and concurrent
// stages must not interleave their draws: the same seed gives the same step with and without
// checkpointing, run after run (without the executor seeding the script's draws per micro-batch
// and layer, the recompute drew new masks and the gradients differed).
// Fused attention (scaled_dot_product_attention with dropout_p, as library blocks call it)
// draws inside the kernel, with no dropout node to find: the same must hold.
class DropoutInsideAScript : public ::testing::TestWithParam<std::string> {};

TEST_P(DropoutInsideAScript, DrawsTheSameMasksOnRecompute) {
  const auto path = testing::scratch_dir() / ("dropout" + GetParam() + ".pt");
  const auto made =
      testing::run_command({PIPETUNE_PYTHON, PIPETUNE_MAKE_SCRIPT, path.string(), GetParam()});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const std::string spec = path.string() + ":input=8,classes=4";
  models::ModelOptions o;
  o.dtype = at::kDouble;
  auto step = [&](CheckpointMode mode) {
    models::Model model = models::build_model(spec, o);
    auto [x, y] = model.make_batch(8, 1, 0);
    x = x.to(at::kDouble);
    Plan plan;
    plan.balance = {2, 3};
    plan.chunks = 4;
    plan.checkpoint = mode;
    plan.schedule = ScheduleKind::OneFOneB;
    exec::ExecutorOptions options;
    options.devices = {"cpu:0", "cpu:1"};
    options.optimizer = exec::OptimizerKind::None;
    options.seed = 5;
    exec::Pipeline pipeline(model, plan, 8, options);
    const double loss = pipeline.step(x, y).loss;
    return std::make_pair(loss, testing::gradients(model));
  };
  const auto never = step(CheckpointMode::Never);
  for (auto mode : {CheckpointMode::Never, CheckpointMode::Always, CheckpointMode::ExceptLast}) {
    const auto again = step(mode);
    EXPECT_EQ(again.first, never.first) << to_string(mode);
    for (const auto& [name, g] : never.second) {
      // Bit for bit but for the order of accumulation (1e-17 apart); other masks differ by 1e-2.
      EXPECT_TRUE(at::allclose(again.second.at(name), g, 1e-10, 1e-14))
          << to_string(mode) << " " << name << ": "
          << (again.second.at(name) - g).abs().max().item<double>();
    }
  }
  // And the masks are masks: dropout zeroed some of the first layer's outputs, so training mode
  // is on and the draws happened (a loss equal to the evaluation-mode loss would mean none).
  models::Model eval = models::build_model(spec, o);
  eval.layers->eval();
  auto [x, y] = eval.make_batch(8, 1, 0);
  const double eval_loss = eval.loss(eval.layers->forward(x.to(at::kDouble)), y).item<double>();
  EXPECT_NE(never.first, eval_loss);
  std::filesystem::remove(path);
}

// What a layer draws must not depend on where the plan cuts the model: a layer's draws are seeded
// from the step, the micro-batch and the layer's index in the model, so every split, schedule and
// checkpoint mode trains what one device trains (the one-stage run of the same seed), loss and
// gradients. Seeded per stage, as the executor once did, a split drew other masks (torchvision's
// and timm's models with dropout or stochastic depth trained 0.06-48 % other losses split).
TEST_P(DropoutInsideAScript, EverySplitDrawsWhatOneDeviceDraws) {
  const auto path = testing::scratch_dir() / ("split_draws" + GetParam() + ".pt");
  const auto made =
      testing::run_command({PIPETUNE_PYTHON, PIPETUNE_MAKE_SCRIPT, path.string(), GetParam()});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const std::string spec = path.string() + ":input=8,classes=4";
  Plan whole;
  whole.balance = {5};
  whole.chunks = 4;
  whole.checkpoint = CheckpointMode::Never;
  const Step one = step_of(spec, whole, {"cpu:0"}, 8, 5);
  struct Case {
    std::vector<int> balance;
    ScheduleKind schedule;
    int stages_per_device;
    CheckpointMode checkpoint;
  };
  const Case cases[] = {{{2, 3}, ScheduleKind::OneFOneB, 1, CheckpointMode::Never},
                        {{1, 4}, ScheduleKind::GPipe, 1, CheckpointMode::Always},
                        {{4, 1}, ScheduleKind::OneFOneB, 1, CheckpointMode::ExceptLast},
                        {{1, 1, 1, 2}, ScheduleKind::Interleaved1F1B, 2, CheckpointMode::Never},
                        {{2, 1, 1, 1}, ScheduleKind::InterleavedZB, 2, CheckpointMode::Always},
                        {{1, 2, 1, 1}, ScheduleKind::ZBV, 2, CheckpointMode::Never}};
  for (const Case& c : cases) {
    Plan plan = whole;
    plan.balance = c.balance;
    plan.schedule = c.schedule;
    plan.stages_per_device = c.stages_per_device;
    plan.checkpoint = c.checkpoint;
    expect_same_step(step_of(spec, plan, {"cpu:0", "cpu:1"}, 8, 5), one, plan);
  }
  std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(TorchScript, DropoutInsideAScript,
                         ::testing::Values("--dropout", "--attention", "--drop-path"),
                         [](const auto& info) {
                           std::string name = info.param.substr(2);
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// Only a draw holds the generator's lock: dropout with p = 0 (as timm's ViT and transformers'
// Llama leave in every block) draws nothing, so such layers' forwards run on every device at
// once; p > 0 and fused attention's dropout do draw.
TEST(TorchScript, DropoutWithZeroProbabilityDrawsNothing) {
  for (const auto& [flag, random] :
       std::vector<std::pair<std::string, bool>>{{"--dropout", true},
                                                 {"--attention", true},
                                                 {"--drop-path", true},
                                                 {"--zero-dropout", false},
                                                 {"", false}}) {
    const auto path = testing::scratch_dir() / ("random" + flag + ".pt");
    std::vector<std::string> command{PIPETUNE_PYTHON, PIPETUNE_MAKE_SCRIPT, path.string()};
    if (!flag.empty()) command.push_back(flag);
    const auto made = testing::run_command(command);
    ASSERT_EQ(made.exit_code, 0) << made.err;
    EXPECT_EQ(models::script_draws_random(torch::jit::load(path.string())), random) << flag;
    std::filesystem::remove(path);
  }
}

// A script's dropout, and its samplers of a tensor (drop path's bernoulli_), draw from the
// generator the thread sets (as the executor sets one per micro-batch), not from the global one
// that every device's thread shares: the same seed gives the same masks, the thread's generator
// moves on, and the global generator is left where it was. So no lock is needed and two devices'
// forwards run at once. (Under the lock, a script drew from the global generator seeded from the
// thread's, whose state never moved; torchvision's EfficientNet, its stochastic depth in every
// block, measured 2.2 times its prediction on 2 devices, its stages' forwards taking turns.)
class DrawsInsideAScript : public ::testing::TestWithParam<std::string> {};

TEST_P(DrawsInsideAScript, FromTheThreadsGenerator) {
  const auto path = testing::scratch_dir() / ("own_draws" + GetParam() + ".pt");
  const auto made =
      testing::run_command({PIPETUNE_PYTHON, PIPETUNE_MAKE_SCRIPT, path.string(), GetParam()});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  models::Model model = models::build_model(path.string() + ":input=8,classes=4");
  model.layers->train();
  const at::Tensor x = at::ones({64, 8});
  at::Generator global = at::globalContext().defaultGenerator(at::kCPU);
  const at::Tensor before = global.get_state();
  auto forward = [&](std::uint64_t seed) {
    at::Generator mine = at::detail::createCPUGenerator(seed);
    const at::Tensor fresh = mine.get_state();
    models::ScopedGenerator use(&mine);
    at::Tensor out = model.layers->forward(x);
    EXPECT_FALSE(at::equal(mine.get_state(), fresh));
    return out;
  };
  const at::Tensor a = forward(7), b = forward(7), c = forward(8);
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_FALSE(at::equal(a, c));
  EXPECT_TRUE(at::equal(global.get_state(), before));
  std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(TorchScript, DrawsInsideAScript,
                         ::testing::Values("--dropout", "--drop-path"), [](const auto& info) {
                           std::string name = info.param.substr(2);
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// torchvision's classifiers end with Dropout(inplace=True), which changes its input in training
// mode only, and after a Flatten it changes a view of the stage's input. A stage starting with
// either runs on a copy: autograd would refuse the change to the input's leaf ("a view of a leaf
// Variable that requires grad is being used in an in-place operation", as the executor failed
// when it probed the first layer alone and in evaluation mode). Every such split trains what one
// device trains.
TEST(TorchScript, AnInPlaceDropoutAfterAViewOfTheStageInputTrainsAsOneDevice) {
  const auto path = testing::scratch_dir() / "inplace_dropout.pt";
  const auto made = testing::run_command(
      {PIPETUNE_PYTHON, PIPETUNE_MAKE_SCRIPT, path.string(), "--in-place-dropout"});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const std::string spec = path.string() + ":input=8,classes=4";
  Plan whole;
  whole.balance = {5};
  whole.chunks = 3;
  whole.checkpoint = CheckpointMode::Never;
  const Step one = step_of(spec, whole, {"cpu:0"}, 6, 3);
  for (const auto& balance : {std::vector<int>{1, 4}, std::vector<int>{2, 3}}) {
    for (auto mode : {CheckpointMode::Never, CheckpointMode::Always}) {
      Plan plan = whole;
      plan.balance = balance;
      plan.checkpoint = mode;
      plan.schedule = ScheduleKind::OneFOneB;
      expect_same_step(step_of(spec, plan, {"cpu:0", "cpu:1"}, 6, 3), one, plan);
    }
  }
  std::filesystem::remove(path);
}

// A model's dtype applies to its floating tensors only (as Python's Module.to(dtype)): an int64
// buffer of indices stays int64 (made float, the gather that reads it refused to run, as
// transformers' BERT embeddings did), a float buffer takes the dtype, and the split model trains
// as the unsplit one.
TEST(TorchScript, BuffersThatAreNotFloatingKeepTheirType) {
  const auto path = testing::scratch_dir() / "index_buffer.pt";
  const auto made = testing::run_command(
      {PIPETUNE_PYTHON, PIPETUNE_MAKE_SCRIPT, path.string(), "--index-buffer"});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const std::string spec = path.string() + ":input=8,classes=4";
  models::ModelOptions o;
  o.dtype = at::kDouble;
  models::Model model = models::build_model(spec, o);
  std::map<std::string, at::Tensor> buffers;
  for (const auto& b : model.layers->named_buffers()) buffers[b.key()] = b.value();
  ASSERT_EQ(buffers.size(), 2u);
  EXPECT_EQ(buffers.at("1.order").scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(buffers.at("1.order"), at::arange(15, -1, -1, at::kLong)));
  EXPECT_EQ(buffers.at("1.scale").scalar_type(), at::kDouble);
  for (const auto& p : model.layers->parameters()) EXPECT_EQ(p.scalar_type(), at::kDouble);
  models::check_model_batch(model, 4);
  Plan plan;
  plan.balance = {1, 3};
  plan.chunks = 3;
  plan.checkpoint = CheckpointMode::Always;
  expect_trains_as_reference(model, spec, plan);
  std::filesystem::remove(path);
}

// Batch norm's running statistics are part of what a model trains (evaluation reads them). A
// checkpointed micro-batch's forward runs twice; the recompute must not update them again, nor
// count the micro-batch twice in num_batches_tracked. After one step, every running statistic is
// what plain training gives, one micro-batch after another.
TEST(TorchScript, ARecomputeDoesNotUpdateBatchNormsRunningStatisticsAgain) {
  const auto path = testing::scratch_dir() / "batch_norm.pt";
  const auto made =
      testing::run_command({PIPETUNE_PYTHON, PIPETUNE_MAKE_SCRIPT, path.string(), "--batch-norm"});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const std::string spec = path.string() + ":input=8,classes=4";
  models::ModelOptions o;
  o.dtype = at::kDouble;
  models::Model reference = models::build_model(spec, o);
  auto [x, y] = reference.make_batch(6, 1, 0);
  testing::reference_step(reference, x, y, 3);
  auto buffers = [](models::Model& m) {
    std::map<std::string, at::Tensor> out;
    for (const auto& b : m.layers->named_buffers()) out[b.key()] = b.value().detach().clone();
    return out;
  };
  const auto want = buffers(reference);
  ASSERT_EQ(want.size(), 6u);  // two batch norms: mean, variance, batches tracked
  struct Case {
    std::vector<int> balance;
    ScheduleKind schedule;
    int stages_per_device;
  };
  const Case cases[] = {{{2, 3}, ScheduleKind::OneFOneB, 1},
                        {{3, 2}, ScheduleKind::GPipe, 1},
                        {{1, 1, 2, 1}, ScheduleKind::Interleaved1F1B, 2}};
  for (const auto& c : cases) {
    for (auto mode : {CheckpointMode::Never, CheckpointMode::Always}) {
      models::Model model = models::build_model(spec, o);
      Plan plan;
      plan.balance = c.balance;
      plan.chunks = 3;
      plan.checkpoint = mode;
      plan.schedule = c.schedule;
      plan.stages_per_device = c.stages_per_device;
      exec::ExecutorOptions options;
      options.devices = {"cpu:0", "cpu:1"};
      options.optimizer = exec::OptimizerKind::None;
      exec::Pipeline pipeline(model, plan, 6, options);
      pipeline.step(x, y);
      const auto got = buffers(model);
      for (const auto& [name, b] : want) {
        EXPECT_TRUE(at::allclose(got.at(name), b, 1e-12, 1e-14))
            << describe_plan(plan) << " " << name << ": " << got.at(name) << " against " << b;
      }
    }
  }
  std::filesystem::remove(path);
}

// A script's BatchNorm1d over [N, 16] cannot train on one sample: torch's own check raises a
// Python ValueError inside the script. The fewest samples the layers train on is 2, the reason
// names the layer and torch's words (not the interpreter's "The following operation failed"),
// and trying leaves every running statistic where it was.
TEST(TorchScript, TheFewestSamplesAMicroBatchMayHoldIsFoundAndNothingMoves) {
  const auto path = testing::scratch_dir() / "least.pt";
  const auto made =
      testing::run_command({PIPETUNE_PYTHON, PIPETUNE_MAKE_SCRIPT, path.string(), "--batch-norm"});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  models::Model model = models::build_model(path.string() + ":input=8,classes=4");
  std::map<std::string, at::Tensor> before;
  for (const auto& b : model.layers->named_buffers()) before[b.key()] = b.value().clone();
  const models::TrainableSize least = models::smallest_trainable_micro_batch(model, 6);
  EXPECT_EQ(least.samples, 2);
  EXPECT_EQ(least.reason,
            "layer 1 (\"1\") cannot train on 1 sample: builtins.ValueError: Expected more than 1 "
            "value per channel when training, got input size [1, 16]");
  for (const auto& b : model.layers->named_buffers()) {
    EXPECT_TRUE(at::equal(b.value(), before.at(b.key()))) << b.key();
  }
  try {
    models::check_trains_on(model, 1, "plan.json: chunks");
    ADD_FAILURE() << "trained on one sample";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("plan.json: chunks: layer 1 (\"1\") cannot train", 0), 0u)
        << e.what();
  }
  EXPECT_NO_THROW(models::check_trains_on(model, 2, "plan.json: chunks"));
  std::filesystem::remove(path);
}

TEST(TorchScript, NotAScriptIsAClearError) {
  const auto path = testing::scratch_dir() / "not_a_script.pt";
  { std::ofstream(path) << "hello"; }
  try {
    models::build_model(path.string());
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(
        std::string(e.what()).rfind("model: " + path.string() + ": not a TorchScript file", 0), 0u)
        << e.what();
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace pipetune
