// Bring-your-own models: a TorchScript Sequential, written by the torch wheel's Python, split by
// its children and run pipelined exactly like the zoo's.

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "sim/error.hpp"

#include "executor/executor.hpp"
#include "tests/executor/reference.hpp"
#include "tests/support/run_command.hpp"

namespace pipetune {
namespace {

TEST(TorchScript, ScriptedSequentialRunsPipelinedLikeTheZoo) {
  const auto path = std::filesystem::temp_directory_path() / ("pipetune_script_" + std::to_string(::getpid()) + ".pt");
  const auto made = testing::run_command({PIPETUNE_PYTHON, PIPETUNE_MAKE_SCRIPT, path.string()});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const std::string spec = path.string() + ":input=8,classes=4";
  models::ModelOptions o;
  o.dtype = at::kDouble;
  models::Model model = models::build_model(spec, o);
  EXPECT_EQ(model.layer_names, (std::vector<std::string>{"0", "1", "2", "3", "4"}));
  models::Model reference = models::build_model(spec, o);
  auto [x, y] = reference.make_batch(6, 1, 0);
  x = x.to(at::kDouble);
  const double expected = testing::reference_step(reference, x, y, 3);
  Plan plan;
  plan.balance = {2, 3};
  plan.chunks = 3;
  plan.checkpoint = CheckpointMode::Always;
  exec::ExecutorOptions options;
  options.devices = {"cpu:0", "cpu:1"};
  options.optimizer = exec::OptimizerKind::None;
  exec::Pipeline pipeline(model, plan, 6, options);
  EXPECT_NEAR(pipeline.step(x, y).loss, expected, 1e-12);
  const auto want = testing::gradients(reference), got = testing::gradients(model);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, g] : want) EXPECT_TRUE(at::allclose(got.at(name), g, 1e-10, 1e-12)) << name;
  std::filesystem::remove(path);
}

TEST(TorchScript, NotAScriptIsAClearError) {
  const auto path = std::filesystem::temp_directory_path() / "pipetune_not_a_script.pt";
  { std::ofstream(path) << "hello"; }
  try {
    models::build_model(path.string());
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("model: " + path.string() + ": not a TorchScript file", 0), 0u) << e.what();
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace pipetune
