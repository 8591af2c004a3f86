// `pipetune run` as a user runs it: reports, JSON, traces, bad input, Ctrl-C.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sim/trace.hpp"
#include "tests/support/run_command.hpp"

namespace pipetune {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("pipetune_run_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

fs::path write_plan(const std::string& name, const std::string& json) {
  const fs::path p = scratch(name);
  std::ofstream(p) << json;
  return p;
}

const std::string kTwoStages =
    R"({"format": "pipetune.plan/1", "balance": [3, 3], "chunks": 4, "checkpoint": "except_last", "schedule": "1f1b"})";

TEST(CliRun, JsonHasOneLossTimeAndPeakPerStepAndDevice) {
  const fs::path plan = write_plan("two.json", kTwoStages);
  const fs::path trace = scratch("measured.json");
  const auto r = testing::run_command({PIPETUNE_CLI, "run", "--model", "mlp:layers=5,width=64", "--plan", plan.string(),
                                       "--batch", "8", "--steps", "3", "--seed", "5", "--json", "--trace", trace.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["losses"].size(), 3u);
  EXPECT_EQ(out["step_ms"].size(), 3u);
  EXPECT_EQ(out["peak_memory_bytes"].size(), 2u);
  EXPECT_GT(out["peak_memory_bytes"][0].get<std::int64_t>(), 0);
  // The measured trace is a valid trace of the plan's programme.
  const Trace t = load_trace(trace.string());
  EXPECT_EQ(t.kind, "measured");
  ASSERT_TRUE(t.plan);
  EXPECT_EQ(t.plan->balance, (std::vector<int>{3, 3}));
  int compute = 0;
  for (const auto& task : t.tasks) compute += is_compute(task.kind) ? 1 : 0;
  EXPECT_EQ(compute, 2 * (4 + 4 + 3));  // two stages: 4 forwards, 4 backwards, 3 recomputes
  // --seed makes a run repeatable.
  const auto again = testing::run_command({PIPETUNE_CLI, "run", "--model", "mlp:layers=5,width=64", "--plan",
                                           plan.string(), "--batch", "8", "--steps", "3", "--seed", "5", "--json"});
  EXPECT_EQ(nlohmann::json::parse(again.out)["losses"], out["losses"]);
}

TEST(CliRun, BadInputIsOneLine) {
  const fs::path plan = write_plan("two.json", kTwoStages);
  auto error = [&](std::vector<std::string> args) {
    std::vector<std::string> argv{PIPETUNE_CLI, "run"};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto r = testing::run_command(argv);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    return r.err;
  };
  EXPECT_EQ(error({"--model", "mlp:layers=3", "--plan", plan.string()}),
            "pipetune: error: plan: balance: expected layer counts summing to 4 (the layers of mlp-3x1024), got 6\n");
  EXPECT_EQ(error({"--model", "mlp:layers=5", "--plan", plan.string(), "--batch", "2"}),
            "pipetune: error: plan: chunks: expected 1 to 2 (the batch size), got 4\n");
  EXPECT_EQ(error({"--model", "vgg", "--plan", plan.string()}).rfind("pipetune: error: --model: unknown model \"vgg\"", 0), 0u);
  if (!fs::exists("/dev/nvidia0")) {
    EXPECT_EQ(error({"--model", "mlp:layers=5", "--plan", plan.string(), "--device", "cuda"}),
              "pipetune: error: --device cuda: no CUDA device on this machine\n");
  }
}

TEST(CliRun, CtrlCStopsCleanlyAndKeepsTheTraceOfCompletedSteps) {
  const fs::path plan = write_plan("two.json", kTwoStages);
  const fs::path trace = scratch("interrupted.json");
  fs::remove(trace);
  const auto r = testing::run_command_signalled(
      {PIPETUNE_CLI, "run", "--model", "mlp:layers=5,width=256", "--plan", plan.string(), "--batch", "8", "--steps",
       "100000", "--warmup", "0", "--progress", "lines", "--trace", trace.string()},
      "progress 3 ", SIGINT);
  EXPECT_EQ(r.exit_code, 130) << r.err;
  EXPECT_THAT(r.err, ::testing::HasSubstr("interrupted after"));
  ASSERT_TRUE(fs::exists(trace));
  EXPECT_EQ(load_trace(trace.string()).kind, "measured");
  // Nothing half-written beside it.
  for (const auto& entry : fs::directory_iterator(trace.parent_path())) {
    EXPECT_EQ(entry.path().string().find(".tmp."), std::string::npos) << entry.path();
  }
}

}  // namespace
}  // namespace pipetune
