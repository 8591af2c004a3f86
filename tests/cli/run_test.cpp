// `pipetune run` as a user runs it: reports, JSON, traces, bad input, Ctrl-C.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sim/hardware.hpp"
#include "sim/plan.hpp"
#include "sim/profile.hpp"
#include "sim/simulator.hpp"
#include "sim/trace.hpp"
#include "sim/units.hpp"
#include "tests/support/run_command.hpp"
#include "tests/support/scratch_dir.hpp"

namespace pipetune {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  return testing::scratch_file("run_test", name);
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
  const auto r = testing::run_command({PIPETUNE_CLI, "run", "--model", "mlp:layers=5,width=64",
                                       "--plan", plan.string(), "--batch", "8", "--steps", "3",
                                       "--seed", "5", "--json", "--trace", trace.string()});
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
  const auto again = testing::run_command({PIPETUNE_CLI, "run", "--model", "mlp:layers=5,width=64",
                                           "--plan", plan.string(), "--batch", "8", "--steps", "3",
                                           "--seed", "5", "--json"});
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
            "pipetune: error: plan: balance: expected layer counts summing to 4 (the layers of "
            "mlp-3x1024), got 6\n");
  EXPECT_EQ(error({"--model", "mlp:layers=5", "--plan", plan.string(), "--batch", "2"}),
            "pipetune: error: plan: chunks: expected 1 to 2 (the batch size), got 4\n");
  EXPECT_EQ(error({"--model", "vgg", "--plan", plan.string()})
                .rfind("pipetune: error: --model: unknown model \"vgg\"", 0),
            0u);
  if (!fs::exists("/dev/nvidia0")) {
    EXPECT_EQ(error({"--model", "mlp:layers=5", "--plan", plan.string(), "--device", "cuda"}),
              "pipetune: error: --device cuda: no CUDA device on this machine\n");
  }
}

TEST(CliRun, APlanPredictedNotToFitIsRefusedUnlessForced) {
  const fs::path plan =
      write_plan("fit.json", R"({"format": "pipetune.plan/1", "balance": [3, 3], "chunks": 2,
    "checkpoint": "never", "schedule": "gpipe"})");
  const fs::path profile = scratch("fit.profile.json");
  ASSERT_EQ(
      testing::run_command({PIPETUNE_CLI, "profile", "--model", "mlp:layers=5,width=64", "--batch",
                            "8", "-o", profile.string(), "--repeats", "1", "--warmup", "0"})
          .exit_code,
      0);
  // The bytes the refusal names are the simulator's prediction from that profile.
  const Profile p = load_profile(profile.string());
  Hardware hw = replicate_device(p.device, 2);
  hw.devices[0].name = "cpu:0";
  hw.devices[1].name = "cpu:1";
  const auto predicted = Simulator(p, hw).run(load_plan(plan.string())).devices;
  const std::vector<std::string> args{
      PIPETUNE_CLI, "run",         "--model",   "mlp:layers=5,width=64",
      "--plan",     plan.string(), "--batch",   "8",
      "--steps",    "1",           "--profile", profile.string(),
      "--memory",   "20KiB"};
  const auto refused = testing::run_command(args);
  EXPECT_EQ(refused.exit_code, 1) << refused.err;
  EXPECT_EQ(refused.err,
            "pipetune: error: " + plan.string() + ": the plan does not fit: cpu:0 needs " +
                format_bytes(predicted[0].peak_memory_bytes) + " (" +
                std::to_string(predicted[0].peak_memory_bytes) +
                " bytes) predicted, has 20.0 KiB (20480 " + "bytes); cpu:1 needs " +
                format_bytes(predicted[1].peak_memory_bytes) + " (" +
                std::to_string(predicted[1].peak_memory_bytes) +
                " bytes) predicted, has 20.0 KiB (20480 bytes) (--force runs it anyway)\n");
  EXPECT_TRUE(refused.out.empty());  // refused before any step
  // Forced: it runs, and says what it was told.
  std::vector<std::string> forced = args;
  forced.push_back("--force");
  const auto ran = testing::run_command(forced);
  EXPECT_EQ(ran.exit_code, 0) << ran.err;
  EXPECT_THAT(ran.err, ::testing::HasSubstr("running it anyway (--force)"));
  // Enough memory, and without a profile (a quick one is taken): it runs.
  const auto roomy =
      testing::run_command({PIPETUNE_CLI, "run", "--model", "mlp:layers=5,width=64", "--plan",
                            plan.string(), "--batch", "8", "--steps", "1", "--memory", "1GiB"});
  EXPECT_EQ(roomy.exit_code, 0) << roomy.err;
}

// A profile timed at one intra-op thread a device, run at two: said, since its times are not the
// run's. At one thread each step says how much of their tasks' time the compute threads ran;
// at two (the pool's other thread doing part of the work) it cannot be told, and is not said.
TEST(CliRun, AProfileTimedAtAnotherThreadCountIsNotedAndOneThreadCountsCpuTime) {
  const fs::path plan = write_plan("threads.json", kTwoStages);
  const fs::path profile = scratch("threads.profile.json");
  ASSERT_EQ(
      testing::run_command({PIPETUNE_CLI, "profile", "--model", "mlp:layers=5,width=64", "--batch",
                            "8", "-o", profile.string(), "--repeats", "1", "--warmup", "0",
                            "--threads", "1", "--co-runners", "0", "--no-after-idle"})
          .exit_code,
      0);
  auto run = [&](const std::string& threads) {
    return testing::run_command({PIPETUNE_CLI, "run", "--model", "mlp:layers=5,width=64", "--plan",
                                 plan.string(), "--batch", "8", "--steps", "3", "--json",
                                 "--profile", profile.string(), "--threads", threads});
  };
  const auto one = run("1");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_THAT(one.err, ::testing::Not(::testing::HasSubstr("intra-op")));
  const auto shares = nlohmann::json::parse(one.out).at("cpu_share");
  ASSERT_EQ(shares.size(), 3u);
  for (const auto& share : shares) {
    EXPECT_GT(share.get<double>(), 0.0);
    EXPECT_LE(share.get<double>(), 1.05);
  }
  const auto two = run("2");
  ASSERT_EQ(two.exit_code, 0) << two.err;
  EXPECT_THAT(two.err, ::testing::HasSubstr("note: " + profile.string() +
                                            " was timed at 1 intra-op thread a device and this "
                                            "run uses 2: its times are not this run's (--threads "
                                            "1 runs as it was timed)"));
  EXPECT_FALSE(nlohmann::json::parse(two.out).contains("cpu_share"));
}

TEST(CliRun, AnOutputThatCannotBeWrittenIsRefusedBeforeAnyWork) {
  const fs::path plan = write_plan("two.json", kTwoStages);
  const auto r =
      testing::run_command({PIPETUNE_CLI, "run", "--model", "mlp:layers=5,width=64", "--plan",
                            plan.string(), "--batch", "8", "--trace", "/no/such/folder/t.json"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "pipetune: error: --trace: /no/such/folder/t.json: cannot write: no folder "
            "/no/such/folder\n");
  EXPECT_TRUE(r.out.empty());
  const auto folder =
      testing::run_command({PIPETUNE_CLI, "run", "--model", "mlp:layers=5,width=64", "--plan",
                            plan.string(), "--batch", "8", "--trace", scratch("").string()});
  EXPECT_EQ(folder.exit_code, 2);
  EXPECT_THAT(folder.err, ::testing::HasSubstr("cannot write: is a directory"));
  const auto profile =
      testing::run_command({PIPETUNE_CLI, "profile", "--model", "mlp:layers=2,width=8", "--batch",
                            "4", "-o", "/no/such/folder/p.json"});
  EXPECT_EQ(profile.exit_code, 2);
  EXPECT_EQ(profile.err,
            "pipetune: error: --output: /no/such/folder/p.json: cannot write: no folder "
            "/no/such/folder\n");
}

// torch's CSV, as simulate writes it, runs the same programmes as the plan it came from: the
// same losses step by step, the I and W tasks in the trace.
TEST(CliRun, AScheduleCsvFromSimulateRunsAsItsPlan) {
  const std::string model = "mlp:layers=5,width=32";
  const fs::path profile = scratch("csv.profile.json");
  ASSERT_EQ(testing::run_command({PIPETUNE_CLI, "profile", "--model", model, "--batch", "8", "-o",
                                  profile.string(), "--repeats", "1", "--warmup", "0"})
                .exit_code,
            0);
  const fs::path plan =
      write_plan("zb.json", R"({"format": "pipetune.plan/1", "balance": [2, 1, 2, 1], "chunks": 4,
    "checkpoint": "never", "schedule": "interleaved-zb", "stages_per_device": 2})");
  const fs::path csv = scratch("zb.csv");
  const auto simulated =
      testing::run_command({PIPETUNE_CLI, "simulate", "--profile", profile.string(), "--plan",
                            plan.string(), "--write-schedule-csv", csv.string()});
  ASSERT_EQ(simulated.exit_code, 0) << simulated.err;
  const std::vector<std::string> common{"--model", model,    "--batch", "8",     "--steps",
                                        "3",       "--seed", "4",       "--json"};
  std::vector<std::string> by_plan{PIPETUNE_CLI, "run", "--plan", plan.string()};
  by_plan.insert(by_plan.end(), common.begin(), common.end());
  const fs::path trace = scratch("zb.trace.json");
  std::vector<std::string> by_csv{PIPETUNE_CLI, "run",     "--schedule-csv", csv.string(),
                                  "--balance",  "2,1,2,1", "--trace",        trace.string()};
  by_csv.insert(by_csv.end(), common.begin(), common.end());
  const auto a = testing::run_command(by_plan), b = testing::run_command(by_csv);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const auto plan_losses = nlohmann::json::parse(a.out)["losses"],
             csv_losses = nlohmann::json::parse(b.out)["losses"];
  ASSERT_EQ(plan_losses.size(), 3u);
  ASSERT_EQ(csv_losses.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_NEAR(csv_losses[k].get<double>(), plan_losses[k].get<double>(),
                1e-6 * std::abs(plan_losses[k].get<double>()))
        << "step " << k;
  }
  EXPECT_EQ(nlohmann::json::parse(b.out)["devices"], (nlohmann::json{"cpu:0", "cpu:1"}));
  int input_halves = 0, weight_halves = 0;
  for (const auto& t : load_trace(trace.string()).tasks) {
    input_halves += t.kind == TaskKind::InputGrad ? 1 : 0;
    weight_halves += t.kind == TaskKind::WeightGrad ? 1 : 0;
  }
  EXPECT_EQ(input_halves, 4 * 4);  // every stage, every micro-batch
  EXPECT_EQ(weight_halves, 4 * 4);
  // Without a plan the CSV needs the layers per stage.
  const auto no_balance =
      testing::run_command({PIPETUNE_CLI, "run", "--model", model, "--schedule-csv", csv.string()});
  EXPECT_EQ(no_balance.exit_code, 2);
  EXPECT_EQ(no_balance.err,
            "pipetune: error: no plan: give --plan FILE, or --schedule-csv FILE with --balance "
            "N,N,... (layers per "
            "stage)\n");
}

TEST(CliRun, CtrlCStopsCleanlyAndKeepsTheTraceOfCompletedSteps) {
  const fs::path plan = write_plan("two.json", kTwoStages);
  const fs::path trace = scratch("interrupted.json");
  fs::remove(trace);
  const auto r = testing::run_command_signalled(
      {PIPETUNE_CLI, "run", "--model", "mlp:layers=5,width=256", "--plan", plan.string(), "--batch",
       "8", "--steps", "100000", "--warmup", "0", "--progress", "lines", "--trace", trace.string()},
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
