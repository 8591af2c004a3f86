// `pipetune validate` end to end on a small CPU model: the report, the traces it names, errors
// recomputed from those traces, calibration fitted on other plans and reused, thresholds.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "sim/hardware.hpp"
#include "sim/plan.hpp"
#include "sim/trace.hpp"
#include "tests/support/run_command.hpp"
#include "tests/support/scratch_dir.hpp"

namespace pipetune {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  return testing::scratch_file("validate_test", name);
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

std::string fmt_round(int k) {
  return "profile-" + std::to_string(k) + ".json";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

const std::vector<std::string> kModel{
    "--model", "mlp:layers=4,width=32", "--batch", "8", "--devices", "2"};

testing::CommandResult validate(const std::vector<std::string>& args) {
  std::vector<std::string> argv{PIPETUNE_CLI, "validate"};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::run_command(argv);
}

TEST(CliValidate, ReportTracesAndErrorsAgreeAndCalibrationIsFittedElsewhereThenReused) {
  const fs::path out = scratch("first");
  std::vector<std::string> args = kModel;
  args.insert(args.end(), {"--top", "2", "--steps", "3", "--rounds", "2", "--calibration-steps",
                           "2", "--out", out.string(), "--progress", "lines", "--json"});
  const auto r = validate(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json report = nlohmann::json::parse(r.out);
  EXPECT_EQ(report, read_json(out / "report.json"));  // printed and written alike
  EXPECT_TRUE(fs::exists(out / "report.md"));
  EXPECT_THAT(r.err, ::testing::HasSubstr("progress profile "));
  EXPECT_THAT(r.err, ::testing::HasSubstr("progress calibrate "));
  EXPECT_THAT(r.err, ::testing::HasSubstr("progress run "));
  EXPECT_EQ(report["format"], "pipetune.validation/1");
  // A calibration is fitted on plans that were not validated, and used only where it helps:
  // on timings this short, either may happen; the report says which, and why.
  const bool used = report["calibration"] == "fitted";
  if (!used) {
    EXPECT_EQ(report["calibration"], "none");
  }
  ASSERT_TRUE(report.contains("calibration_reason"));
  EXPECT_THAT(
      report["calibration_reason"].get<std::string>(),
      ::testing::MatchesRegex(used ? "used( \\((compute|copies) only\\))?: .*" : "not used: .*"));
  EXPECT_TRUE(report["profiled"]);
  ASSERT_EQ(report["plans"].size(), 2u);

  // The hardware file holds the calibration only when it is used.
  Hardware hw = load_hardware(report["hardware"].get<std::string>());
  EXPECT_EQ(hw.calibration.empty(), !used);
  ASSERT_EQ(report["calibration_runs"].size(), 2u);
  std::set<std::string> validated;
  for (const auto& p : report["plans"]) validated.insert(p["plan"].get<std::string>());
  for (const auto& c : report["calibration_runs"])
    EXPECT_EQ(validated.count(c["plan"].get<std::string>()), 0u);
  // The model's error here, for every interval: without a calibration in use, the root mean
  // square of the calibration runs' uncalibrated time errors (with one, of the out-of-sample
  // errors the report does not list: then only that it is known).
  if (!used) {
    double squares = 0.0;
    for (const auto& c : report["calibration_runs"]) {
      const double e = c["uncalibrated"]["time_error"].get<double>();
      squares += e * e;
    }
    EXPECT_NEAR(hw.model_error, std::sqrt(squares / 2.0), 1e-5);
  } else {
    EXPECT_GT(hw.model_error, 0.0);
  }
  // Every plan's interval holds the prediction and reports how many of its steps fell inside.
  for (const auto& p : report["plans"]) {
    ASSERT_TRUE(p.contains("interval"));
    const auto& interval = p["interval"];
    const double predicted = p[used ? "calibrated" : "uncalibrated"]["predicted_ms"].get<double>();
    EXPECT_LE(interval["low_ms"].get<double>(), predicted + 1e-6);
    EXPECT_GE(interval["high_ms"].get<double>(), predicted - 1e-6);
    std::size_t inside = 0;
    for (const auto& ms : p["measured_pipeline_ms"]) {
      const double t = ms.get<double>();
      inside += t >= interval["low_ms"].get<double>() - 1e-6 &&
                t <= interval["high_ms"].get<double>() + 1e-6;
    }
    EXPECT_EQ(interval["steps_inside"].get<std::size_t>(), inside);
  }

  for (const auto& p : report["plans"]) {
    // Every file the report names is there and valid; the traces are of the plan.
    const Plan plan = load_plan(p["plan_file"].get<std::string>());
    EXPECT_EQ(describe_plan(plan), p["plan"].get<std::string>());
    const Trace measured = load_trace(p["measured_trace"].get<std::string>());
    const Trace predicted = load_trace(p["predicted_trace"].get<std::string>());
    EXPECT_EQ(p.contains("calibrated_trace"), used);
    const Trace calibrated =
        load_trace(p[used ? "calibrated_trace" : "predicted_trace"].get<std::string>());
    EXPECT_EQ(measured.kind, "measured");
    EXPECT_EQ(predicted.kind, "predicted");
    ASSERT_TRUE(measured.plan && predicted.plan);
    EXPECT_EQ(measured.plan->balance, plan.balance);
    EXPECT_EQ(predicted.plan->balance, plan.balance);
    ASSERT_EQ(measured.devices.size(), 2u);

    // The errors, recomputed from the files: time against the median of the measured steps,
    // memory per device from the two traces' peaks.
    const auto steps = p["measured_pipeline_ms"].get<std::vector<double>>();
    ASSERT_EQ(steps.size(), 3u);
    // The host's pace, taken before each of the plan's two rounds.
    const auto paces = p["host_pace_us"].get<std::vector<double>>();
    ASSERT_EQ(paces.size(), 2u);
    for (double pace : paces) EXPECT_GT(pace, 0.0);
    const double measured_ms = median(steps);
    EXPECT_NEAR(p["measured_median_ms"].get<double>(), measured_ms, 1e-6);
    for (const auto& [key, trace] :
         {std::pair{"uncalibrated", &predicted}, std::pair{"calibrated", &calibrated}}) {
      const auto& c = p[key];
      EXPECT_NEAR(c["predicted_ms"].get<double>(), trace->iteration_ms, 1e-6) << key;
      EXPECT_NEAR(c["time_error"].get<double>(), (trace->iteration_ms - measured_ms) / measured_ms,
                  2e-6)
          << key;
      for (std::size_t d = 0; d < 2; ++d) {
        const double pb = static_cast<double>(trace->devices[d].peak_memory_bytes);
        const double mb = static_cast<double>(measured.devices[d].peak_memory_bytes);
        EXPECT_EQ(c["predicted_peak_bytes"][d].get<std::int64_t>(),
                  trace->devices[d].peak_memory_bytes);
        EXPECT_EQ(c["worst_order_peak_bytes"][d].get<std::int64_t>(),
                  trace->devices[d].worst_order_peak_bytes);
        EXPECT_GE(trace->devices[d].worst_order_peak_bytes, trace->devices[d].peak_memory_bytes);
        EXPECT_EQ(c["measured_peak_bytes"][d].get<std::int64_t>(),
                  measured.devices[d].peak_memory_bytes);
        EXPECT_NEAR(c["memory_error"][d].get<double>(), (pb - mb) / mb, 2e-6)
            << key << " device " << d;
      }
    }
    // The calibrated prediction is the uncalibrated one under the stored calibration: compute
    // tasks scaled alike.
    if (used) {
      EXPECT_NE(calibrated.iteration_ms, predicted.iteration_ms);
    }
  }

  // "runs", the contract of docs/cli.md: the plan as fields and the headline (calibrated)
  // comparison.
  ASSERT_EQ(report["runs"].size(), report["plans"].size());
  for (std::size_t k = 0; k < report["runs"].size(); ++k) {
    const auto& run = report["runs"][k];
    const auto& c = report["plans"][k]["calibrated"];
    const Plan plan = load_plan(report["plans"][k]["plan_file"].get<std::string>());
    EXPECT_EQ(run["plan"]["balance"].get<std::vector<int>>(), plan.balance);
    EXPECT_EQ(run["plan"]["chunks"].get<int>(), plan.chunks);
    EXPECT_EQ(run["plan"]["checkpoint"].get<std::string>(), to_string(plan.checkpoint));
    EXPECT_EQ(run["plan"]["schedule"].get<std::string>(), to_string(plan.schedule));
    EXPECT_EQ(run["predicted_ms"], c["predicted_ms"]);
    EXPECT_EQ(run["measured_ms"], c["measured_ms"]);
    EXPECT_EQ(run["time_error"], c["time_error"]);
    EXPECT_EQ(run["predicted_peak_memory_bytes"], c["predicted_peak_bytes"]);
    EXPECT_EQ(run["measured_peak_memory_bytes"], c["measured_peak_bytes"]);
    EXPECT_EQ(run["memory_error"], c["memory_error"]);
  }

  // Reused (a calibration of our own when this run's was not used): no profiling, no
  // calibration runs, the same calibration; a threshold no real run meets fails with exit 3 and
  // names the plan.
  std::string hardware_path = report["hardware"].get<std::string>();
  if (!used) {
    hw.calibration.compute_scale = {{2, 1.1}};
    hw.calibration.fitted_on = {"by hand"};
    hardware_path = scratch("calibrated.hardware.json").string();
    save_hardware(hw, hardware_path);
  }
  const fs::path again = scratch("again");
  std::vector<std::string> reuse = kModel;
  reuse.insert(reuse.end(), {"--profile", report["profile"].get<std::string>(), "--hardware",
                             hardware_path, "--top", "1", "--steps", "2", "--out", again.string(),
                             "--max-time-error", "0", "--max-memory-error", "1000"});
  const auto second = validate(reuse);
  EXPECT_EQ(second.exit_code, 3) << second.err;
  EXPECT_THAT(second.err, ::testing::HasSubstr("plan 1 ("));
  EXPECT_THAT(second.err, ::testing::HasSubstr("exceeds --max-time-error 0.0 %"));
  EXPECT_THAT(second.err, ::testing::Not(::testing::HasSubstr("memory")));
  EXPECT_THAT(second.out, ::testing::HasSubstr("(reused)"));
  const nlohmann::json second_report = read_json(again / "report.json");
  EXPECT_EQ(second_report["calibration"], "reused");
  EXPECT_FALSE(second_report["profiled"]);
  EXPECT_TRUE(second_report["calibration_runs"].empty());
  EXPECT_FALSE(second_report["passed"]);
  EXPECT_EQ(load_hardware(second_report["hardware"].get<std::string>()).calibration.compute_scale,
            hw.calibration.compute_scale);
}

TEST(CliValidate, AGivenPlanIsValidatedAlone) {
  const fs::path plan = scratch("plan.json");
  std::ofstream(plan)
      << R"({"format": "pipetune.plan/1", "balance": [2, 3], "chunks": 2, "checkpoint": "always",
                            "schedule": "gpipe"})";
  const fs::path out = scratch("given");
  std::vector<std::string> args = kModel;
  args.insert(args.end(), {"--plan", plan.string(), "--steps", "2", "--calibration-plans", "0",
                           "--out", out.string()});
  const auto r = validate(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("[2,3] x2 always gpipe"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("calibration none"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("one plan run: nothing to rank"));
  const nlohmann::json report = read_json(out / "report.json");
  EXPECT_EQ(report["calibration"], "none");
  ASSERT_EQ(report["plans"].size(), 1u);
  EXPECT_FALSE(report["plans"][0].contains("calibrated_trace"));
}

// --profiles 3: a profile before each of three rounds, the later ones at the sizes the plans'
// micro-batches take only (the validated plan's and the calibration plan's); profile.json is
// their pool (each time the median of the three, recomputed here from the round files), and
// every round ran every plan, the calibration plan too.
TEST(CliValidate, ProfileRoundsArePooledAndEachRoundRunsEveryPlan) {
  const fs::path plan = scratch("rounds-plan.json");
  std::ofstream(plan)
      << R"({"format": "pipetune.plan/1", "balance": [2, 3], "chunks": 2, "checkpoint": "never",
                            "schedule": "1f1b"})";
  const fs::path out = scratch("rounds");
  std::vector<std::string> args = kModel;
  args.insert(args.end(), {"--plan", plan.string(), "--steps", "4", "--profiles", "3",
                           "--calibration-plans", "1", "--out", out.string(), "--json"});
  const auto r = validate(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json report = read_json(out / "report.json");
  ASSERT_EQ(report["plans"].size(), 1u);
  ASSERT_EQ(report["calibration_runs"].size(), 1u);
  // The sizes tensor.chunk gives 8 samples in each plan's chunks: all measured by the first
  // profile (1, 2, 4, 8), so each is retimed itself.
  std::set<std::int64_t> sizes;
  for (const auto* run : {&report["plans"][0], &report["calibration_runs"][0]}) {
    const int chunks = read_json((*run)["plan_file"].get<std::string>())["chunks"];
    const int each = (8 + chunks - 1) / chunks;
    for (int left = 8; left > 0; left -= each) sizes.insert(std::min(each, left));
    // The host's pace is taken before each round of a plan's steps: three rounds.
    EXPECT_EQ((*run)["host_pace_us"].size(), 3u) << (*run)["plan"];
  }
  ASSERT_EQ(report["round_profiles"].size(), 3u);
  EXPECT_EQ(report["reprofiled_sizes"], nlohmann::json(sizes));
  EXPECT_EQ(report["profile"], (out / "profile.json").string());
  std::vector<nlohmann::json> rounds;
  for (int k = 1; k <= 3; ++k) {
    EXPECT_EQ(report["round_profiles"][k - 1], (out / fmt_round(k)).string());
    rounds.push_back(read_json(out / fmt_round(k)));
  }
  EXPECT_EQ(rounds[0]["micro_batch_sizes"], nlohmann::json::array({1, 2, 4, 8}));
  EXPECT_EQ(rounds[1]["micro_batch_sizes"], nlohmann::json(sizes));
  EXPECT_EQ(rounds[2]["micro_batch_sizes"], nlohmann::json(sizes));
  const nlohmann::json pooled = read_json(out / "profile.json");
  ASSERT_EQ(pooled["layers"].size(), rounds[0]["layers"].size());
  const std::vector<int> first_sizes{1, 2, 4, 8};
  for (std::size_t l = 0; l < pooled["layers"].size(); ++l) {
    for (const char* field : {"forward_ms", "backward_ms"}) {
      for (std::size_t k = 0; k < first_sizes.size(); ++k) {
        const auto later = std::find(sizes.begin(), sizes.end(), first_sizes[k]);
        const double first = rounds[0]["layers"][l][field][k].get<double>();
        const double got = pooled["layers"][l][field][k].get<double>();
        if (later == sizes.end()) {
          EXPECT_EQ(got, first) << field << " at " << first_sizes[k];  // not retimed
          continue;
        }
        const auto at = static_cast<std::size_t>(std::distance(sizes.begin(), later));
        EXPECT_DOUBLE_EQ(got, median({first, rounds[1]["layers"][l][field][at].get<double>(),
                                      rounds[2]["layers"][l][field][at].get<double>()}))
            << field << " at " << first_sizes[k];
      }
    }
    EXPECT_EQ(pooled["layers"][l]["saved_bytes"], rounds[0]["layers"][l]["saved_bytes"]);
  }
}

TEST(CliValidate, BadInputIsOneLine) {
  auto error = [&](std::vector<std::string> args) {
    const auto r = validate(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    return r.err;
  };
  // A profile of another model.
  const fs::path other = scratch("other-profile");
  std::vector<std::string> profile_args{"--model",
                                        "mlp:layers=3,width=16",
                                        "--batch",
                                        "8",
                                        "--out",
                                        other.string(),
                                        "--top",
                                        "1",
                                        "--steps",
                                        "1",
                                        "--calibration-plans",
                                        "0"};
  ASSERT_EQ(validate(profile_args).exit_code, 0);
  std::vector<std::string> args = kModel;
  args.insert(args.end(),
              {"--profile", (other / "profile.json").string(), "--out", scratch("x").string()});
  EXPECT_EQ(error(args), "pipetune: error: " + (other / "profile.json").string() +
                             ": \"model\" is \"mlp-3x16\", but the model builds \"mlp-4x32\"\n");
  // A plan that does not fit the model.
  const fs::path plan = scratch("bad-plan.json");
  std::ofstream(plan)
      << R"({"format": "pipetune.plan/1", "balance": [2, 2], "chunks": 2, "checkpoint": "never",
                            "schedule": "gpipe"})";
  args = kModel;
  args.insert(args.end(), {"--plan", plan.string(), "--out", scratch("y").string()});
  EXPECT_THAT(error(args), ::testing::HasSubstr(plan.string() +
                                                ": balance: expected layer counts summing to 5"));
  // A hardware file for torch's runtime: validate measures pipetune's executor. Refused before
  // anything is written.
  const std::string torch_hardware =
      std::string(PIPETUNE_SOURCE_DIR) + "/tests/data/hardware-2-torch.json";
  args = kModel;
  args.insert(args.end(), {"--hardware", torch_hardware, "--out", scratch("torch").string()});
  EXPECT_EQ(error(args),
            "pipetune: error: " + torch_hardware +
                ": runtime: \"torch.distributed.pipelining\": validate runs pipetune's "
                "executor, so its hardware file must be for it (no runtime field); "
                "check a plan on torch with scripts/torch_pipeline.py --trace and "
                "compare\n");
  EXPECT_FALSE(fs::exists(scratch("torch")));
  // Profile rounds: taken now, a step each at least, and in place of --rounds.
  args = kModel;
  args.insert(args.end(), {"--profiles", "2", "--profile", (other / "profile.json").string()});
  EXPECT_EQ(error(args),
            "pipetune: error: --profiles 2: profiles taken now, so not with --profile " +
                (other / "profile.json").string() + "\n");
  args = kModel;
  args.insert(args.end(), {"--profiles", "4", "--steps", "3"});
  EXPECT_EQ(error(args),
            "pipetune: error: --steps 3: at least one a profile round (--profiles 4)\n");
  args = kModel;
  args.insert(args.end(), {"--profiles", "2", "--rounds", "2"});
  EXPECT_THAT(error(args), ::testing::HasSubstr("--rounds excludes --profiles"));
  // --plan and --top exclude each other.
  args = kModel;
  args.insert(args.end(), {"--plan", plan.string(), "--top", "2"});
  EXPECT_THAT(error(args), ::testing::HasSubstr("--plan excludes --top"));
  // SM shares: only on a GPU, no more devices than shares, and a profile taken on one share.
  args = kModel;
  args.insert(args.end(), {"--sm-partitions", "2"});
  EXPECT_EQ(error(args),
            "pipetune: error: --sm-partitions: only with --device cuda, in one process\n");
  EXPECT_EQ(error({"--model", "mlp:layers=4,width=32", "--device", "cuda", "--sm-partitions", "2",
                   "--devices", "3"}),
            "pipetune: error: --devices 3: more than the 2 shares of --sm-partitions\n");
  EXPECT_EQ(error({"--model", "mlp:layers=3,width=16", "--batch", "8", "--device", "cuda",
                   "--sm-partitions", "2", "--profile", (other / "profile.json").string(), "--out",
                   scratch("z").string()}),
            "pipetune: error: " + (other / "profile.json").string() +
                ": taken on the whole device, but the plans run on 2 shares of the GPU's SMs: "
                "profile with --sm-partitions 2\n");
}

TEST(CliValidate, NoPlanFitsIsWorkNotDoneExitOne) {
  // Good input, impossible work: 4 KiB per device holds no plan of the model.
  const fs::path hardware = scratch("tiny.hardware.json");
  std::ofstream(hardware) << R"({"format": "pipetune.hardware/1",
    "devices": [{"name": "cpu:0", "memory_bytes": 4096}, {"name": "cpu:1", "memory_bytes": 4096}],
    "link": {"bandwidth_bytes_per_s": null, "latency_ms": 0}})";
  const auto r =
      validate({"--model", "mlp:layers=4,width=32", "--batch", "8", "--hardware", hardware.string(),
                "--out", scratch("nofit").string(), "--progress", "none"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err,
              ::testing::HasSubstr("pipetune: error: no plan of mlp-4x32 fits the memory of"));
}

TEST(CliDemo, RunsTheWholeLoopAndEndsWithTheSummaryAndTheGuiCommand) {
  const fs::path out = scratch("demo");
  const auto r = testing::run_command({PIPETUNE_CLI, "demo", "--model", "mlp:layers=4,width=64",
                                       "--batch", "16", "--steps", "4", "--out", out.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("summary: the plan chosen, "));
  EXPECT_THAT(r.out, ::testing::HasSubstr("iteration ms"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("peak memory cpu:1"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("pipetune-gui " + (out / "profile.json").string()));
  for (const char* name :
       {"profile.json", "hardware.json", "plan-1.plan.json", "plan-1.measured.trace.json",
        "plan-1.predicted.trace.json", "report.json", "report.md"}) {
    EXPECT_TRUE(fs::exists(out / name)) << name;
  }
  EXPECT_EQ(read_json(out / "report.json")["plans"].size(), 3u);
}

}  // namespace
}  // namespace pipetune
