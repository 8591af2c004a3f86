// Golden-output tests of the CLI: the exact text, JSON and error lines users see.
// Regenerate after an intended change with PIPETUNE_UPDATE_GOLDEN=1 and review the diff.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/support/run_command.hpp"
#include "tests/support/scratch_dir.hpp"

namespace pipetune {
namespace {

namespace fs = std::filesystem;

struct GoldenCase {
  const char* name;
  std::vector<std::string> args;
};

std::string render(const testing::CommandResult& r) {
  return r.out + "--- stderr ---\n" + r.err + "--- exit " + std::to_string(r.exit_code) + " ---\n";
}

class CliGolden : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(CliGolden, MatchesGoldenFile) {
  const GoldenCase& c = GetParam();
  std::vector<std::string> argv{PIPETUNE_CLI};
  argv.insert(argv.end(), c.args.begin(), c.args.end());
  const std::string actual = render(testing::run_command(argv, PIPETUNE_SOURCE_DIR));
  const fs::path golden =
      fs::path(PIPETUNE_SOURCE_DIR) / "tests" / "cli" / "golden" / (std::string(c.name) + ".txt");
  if (std::getenv("PIPETUNE_UPDATE_GOLDEN")) {
    std::ofstream(golden) << actual;
    GTEST_SKIP() << "rewrote " << golden;
  }
  std::ifstream in(golden);
  ASSERT_TRUE(in) << "no golden file " << golden << "; run with PIPETUNE_UPDATE_GOLDEN=1";
  std::stringstream expected;
  expected << in.rdbuf();
  EXPECT_EQ(actual, expected.str());
}

const std::string kProfile = "tests/data/tiny.profile.json";
const std::string kPlan = "tests/data/plan-2x4.json";
const std::string kHardware = "tests/data/hardware-2.json";

INSTANTIATE_TEST_SUITE_P(
    Reports, CliGolden,
    ::testing::Values(
        GoldenCase{"simulate_text", {"simulate", "--profile", kProfile, "--plan", kPlan}},
        // A profile with its layers' spreads: the iteration's 80 % interval.
        GoldenCase{"simulate_interval",
                   {"simulate", "--profile", "traces/cpu-mlp.profile.json", "--plan",
                    "traces/cpu-mlp.plan.json", "--json"}},
        // The first and the last layer tied: where each plan puts the tensor, and its copies.
        GoldenCase{"simulate_tied",
                   {"simulate", "--profile", "tests/data/tied.profile.json", "--plan", kPlan}},
        GoldenCase{"plan_tied_json",
                   {"plan", "--profile", "tests/data/tied.profile.json", "--devices", "2", "--top",
                    "2", "--json"}},
        // The first two layers frozen (a fine-tuned model's stem): what trains, and no gradient
        // copy into the stem.
        GoldenCase{"simulate_frozen",
                   {"simulate", "--profile", "tests/data/frozen.profile.json", "--plan", kPlan,
                    "--optimizer-state-factor", "2"}},
        GoldenCase{"plan_frozen",
                   {"plan", "--profile", "tests/data/frozen.profile.json", "--devices", "2",
                    "--top", "2"}},
        GoldenCase{"simulate_hardware_json",
                   {"simulate", "--profile", kProfile, "--plan", kPlan, "--hardware", kHardware,
                    "--json"}},
        // The same devices for torch.distributed.pipelining: its kept buffers and outputs.
        GoldenCase{"simulate_torch_runtime_json",
                   {"simulate", "--profile", kProfile, "--plan", kPlan, "--hardware",
                    "tests/data/hardware-2-torch.json", "--json"}},
        // Planning for torch: only chunk counts that split the batch evenly, never or always.
        GoldenCase{"plan_torch_runtime",
                   {"plan", "--profile", kProfile, "--hardware", "tests/data/hardware-2-torch.json",
                    "--top", "2"}},
        GoldenCase{"simulate_sm_shares",
                   {"simulate", "--profile", kProfile, "--plan", kPlan, "--hardware",
                    "tests/data/hardware-shares-2.json"}},
        GoldenCase{"simulate_sm_shares_json",
                   {"simulate", "--profile", kProfile, "--plan", kPlan, "--hardware",
                    "tests/data/hardware-shares-2.json", "--json"}},
        GoldenCase{"simulate_inline_shared_device",
                   {"simulate", "--profile", kProfile, "--balance", "2,2,2", "--chunks", "8",
                    "--checkpoint", "never", "--schedule", "1f1b", "--devices", "2",
                    "--stage-devices", "cpu:0,cpu:1,cpu:0", "--bandwidth", "1e8"}},
        GoldenCase{
            "simulate_interleaved_zb",
            {"simulate", "--profile", kProfile, "--balance", "2,1,2,1", "--chunks", "4",
             "--checkpoint", "never", "--schedule", "interleaved-zb", "--stages-per-device", "2"}},
        GoldenCase{
            "sweep_table",
            {"sweep", "--profile", kProfile, "--devices", "2,3", "--chunks", "1,3,8",
             "--checkpoint", "never,always", "--schedule", "all", "--bandwidth", "ideal,1e7"}},
        GoldenCase{"plan_explain", {"plan", "--profile", kProfile, "--devices", "2", "--explain"}},
        // Ranked by the intervals' upper ends: the third and fourth change places.
        GoldenCase{"plan_objective_p90",
                   {"plan", "--profile", "traces/cpu-mlp.profile.json", "--devices", "2", "--top",
                    "4", "--objective", "p90"}},
        GoldenCase{
            "plan_json_hardware",
            {"plan", "--profile", kProfile, "--hardware", kHardware, "--top", "3", "--json"}},
        GoldenCase{"plan_memory_order_worst",
                   {"plan", "--profile", kProfile, "--devices", "2", "--memory", "48.4MiB",
                    "--memory-order", "worst", "--top", "3", "--explain"}},
        GoldenCase{"plan_nothing_fits_worst_order",
                   {"plan", "--profile", kProfile, "--devices", "2", "--memory", "40.3MiB",
                    "--memory-order", "worst"}},
        GoldenCase{"plan_nothing_fits",
                   {"plan", "--profile", kProfile, "--devices", "2", "--memory", "30MiB"}},
        // The gap, and where it comes from.
        GoldenCase{
            "plan_budget_spent",
            {"plan", "--profile", kProfile, "--devices", "3", "--budget", "100", "--top", "2"}},
        // Plans fit (the default budget finds [1,1,1,5]), but a budget of one step ends before
        // one is found: not "no plan fits".
        GoldenCase{"plan_budget_ends_before_a_fit",
                   {"plan", "--profile", "tests/data/shares-tight.profile.json", "--hardware",
                    "tests/data/hardware-shares-tight-4.json", "--budget", "1"}},
        GoldenCase{"plan_budget_ends_before_a_fit_json",
                   {"plan", "--profile", "tests/data/shares-tight.profile.json", "--hardware",
                    "tests/data/hardware-shares-tight-4.json", "--budget", "1", "--json"}},
        GoldenCase{"sweep_csv",
                   {"sweep", "--profile", kProfile, "--hardware", kHardware, "--chunks", "2,4",
                    "--checkpoint", "except_last", "--format", "csv"}}),
    [](const auto& info) { return std::string(info.param.name); });

INSTANTIATE_TEST_SUITE_P(
    BadInput, CliGolden,
    ::testing::Values(
        GoldenCase{"error_no_subcommand", {}},
        GoldenCase{"error_devices_zero", {"plan", "--profile", kProfile, "--devices", "0"}},
        GoldenCase{"error_chunks_not_a_number",
                   {"simulate", "--profile", kProfile, "--balance", "3,3", "--chunks", "two"}},
        GoldenCase{"error_duplicate_layer_names",
                   {"simulate", "--profile", "tests/data/bad/duplicate_layer_names.json",
                    "--balance", "3,3"}},
        GoldenCase{"error_schedule_csv_stage_on_two_rows",
                   {"simulate", "--profile", kProfile, "--balance", "2,1,2,1", "--chunks", "2",
                    "--schedule-csv", "tests/data/bad/schedule_stage_on_two_rows.csv"}},
        GoldenCase{"error_unknown_flag",
                   {"simulate", "--profile", kProfile, "--plan", kPlan, "--chunk", "3"}},
        GoldenCase{"error_missing_profile_flag", {"simulate", "--plan", kPlan}},
        GoldenCase{"error_missing_file",
                   {"simulate", "--profile", "nowhere.json", "--plan", kPlan}},
        GoldenCase{"error_no_plan", {"simulate", "--profile", kProfile}},
        GoldenCase{"error_balance_sum", {"simulate", "--profile", kProfile, "--balance", "3,2"}},
        GoldenCase{"error_zero_stage", {"simulate", "--profile", kProfile, "--balance", "6,0"}},
        GoldenCase{"error_chunks_above_batch",
                   {"simulate", "--profile", kProfile, "--plan", kPlan, "--chunks", "9"}},
        GoldenCase{
            "error_unknown_checkpoint",
            {"simulate", "--profile", kProfile, "--plan", kPlan, "--checkpoint", "sometimes"}},
        GoldenCase{"error_unknown_schedule",
                   {"simulate", "--profile", kProfile, "--plan", kPlan, "--schedule", "zb"}},
        GoldenCase{"error_malformed_profile",
                   {"simulate", "--profile", "tests/data/bad/malformed.json", "--plan", kPlan}},
        GoldenCase{"error_negative_cost",
                   {"simulate", "--profile", "tests/data/bad/negative_cost.json", "--plan", kPlan}},
        GoldenCase{"error_plan_field_type",
                   {"simulate", "--profile", kProfile, "--plan",
                    "tests/data/bad/plan_chunks_string.json"}},
        GoldenCase{"error_hardware_and_devices",
                   {"simulate", "--profile", kProfile, "--plan", kPlan, "--hardware", kHardware,
                    "--devices", "2"}},
        GoldenCase{"error_too_many_stages",
                   {"simulate", "--profile", kProfile, "--plan", kPlan, "--devices", "1"}},
        GoldenCase{"error_sweep_no_devices", {"sweep", "--profile", kProfile}},
        GoldenCase{"error_plan_no_devices", {"plan", "--profile", kProfile}},
        GoldenCase{"error_plan_chunks",
                   {"plan", "--profile", kProfile, "--devices", "2", "--chunks", "0,4"}},
        GoldenCase{"error_plan_too_many_stages", {"plan", "--profile", kProfile, "--devices", "7"}},
        GoldenCase{"error_bad_bandwidth",
                   {"sweep", "--profile", kProfile, "--devices", "2", "--bandwidth", "fast"}},
        // The ceilings of sim/limits.hpp (docs/formats.md): 1e300 ms used to predict a 300-digit
        // iteration and exit 0.
        GoldenCase{"error_time_above_ceiling",
                   {"simulate", "--profile", "tests/data/bad/huge_time.json", "--plan", kPlan}},
        GoldenCase{"error_plan_time_above_ceiling",
                   {"plan", "--profile", "tests/data/bad/huge_time.json", "--devices", "2"}},
        GoldenCase{"error_memory_above_ceiling",
                   {"simulate", "--profile", kProfile, "--plan", kPlan, "--memory", "65TiB"}},
        GoldenCase{"error_latency_above_ceiling",
                   {"simulate", "--profile", kProfile, "--plan", kPlan, "--latency-ms", "1e10"}},
        GoldenCase{"error_bandwidth_below_floor",
                   {"simulate", "--profile", kProfile, "--plan", kPlan, "--bandwidth", "0.4"}},
        GoldenCase{"error_objective_p90_without_spreads",
                   {"plan", "--profile", kProfile, "--devices", "2", "--objective", "p90"}},
        GoldenCase{"error_chunks_above_ceiling",
                   {"simulate", "--profile", kProfile, "--plan", kPlan, "--chunks", "5000"}}),
    [](const auto& info) { return std::string(info.param.name); });

// --trace writes a valid Chrome trace; its summary agrees with --json.
TEST(CliSimulate, TraceMatchesJsonSummary) {
  const fs::path trace = testing::scratch_dir() / "cli_trace.json";
  const auto r = testing::run_command({PIPETUNE_CLI, "simulate", "--profile", kProfile, "--plan",
                                       kPlan, "--json", "--trace", trace.string()},
                                      PIPETUNE_SOURCE_DIR);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto summary = nlohmann::json::parse(r.out);
  std::ifstream in(trace);
  const auto doc = nlohmann::json::parse(in);
  EXPECT_NEAR(doc["pipetune"]["summary"]["iteration_ms"].get<double>(),
              summary["iteration_ms"].get<double>(), 1e-6);
  EXPECT_GT(doc["traceEvents"].size(), 10u);
  fs::remove(trace);
}

// A trace path that cannot be written: one error line, exit 2, nothing half-written.
TEST(CliSimulate, UnwritableTracePath) {
  const auto r = testing::run_command({PIPETUNE_CLI, "simulate", "--profile", kProfile, "--plan",
                                       kPlan, "--trace", "/nonexistent-dir/t.json"},
                                      PIPETUNE_SOURCE_DIR);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(r.err.ends_with(
      "\npipetune: error: /nonexistent-dir/t.json: cannot write: No such file or directory\n"))
      << r.err;
}

// An unproven answer lists the configurations left open, the lowest bound first: the first is the
// answer's bound, and each one's bound stays below what that configuration alone, searched to
// the end, reaches. A proven answer lists none.
TEST(CliPlan, OpenConfigurationsSayWhereTheGapIs) {
  auto plan = [&](std::vector<std::string> args) {
    std::vector<std::string> argv{PIPETUNE_CLI, "plan", "--profile", "traces/cpu-mlp.profile.json",
                                  "--devices",  "4",    "--json"};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto r = testing::run_command(argv, PIPETUNE_SOURCE_DIR);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  const auto cut_short = plan({"--budget", "1"});
  ASSERT_FALSE(cut_short["proven_optimal"].get<bool>());
  ASSERT_FALSE(cut_short["plans"].empty());
  const auto& open = cut_short["open_configurations"];
  ASSERT_GE(open.size(), 3u);
  EXPECT_DOUBLE_EQ(cut_short["lower_bound_ms"].get<double>(),
                   std::min(open[0]["lower_bound_ms"].get<double>(),
                            cut_short["plans"][0]["iteration_ms"].get<double>()));
  for (std::size_t k = 1; k < open.size(); ++k)
    EXPECT_LE(open[k - 1]["lower_bound_ms"].get<double>(), open[k]["lower_bound_ms"].get<double>());
  for (std::size_t k = 0; k < 3; ++k) {
    const auto& c = open[k];
    std::vector<std::string> alone_args{"--chunks",     std::to_string(c["chunks"].get<int>()),
                                        "--checkpoint", c["checkpoint"].get<std::string>(),
                                        "--schedule",   c["schedule"].get<std::string>()};
    if (const int v = c["stages_per_device"].get<int>(); v > 1) {
      alone_args.push_back("--stages-per-device");
      alone_args.push_back(std::to_string(v));
    }
    const auto alone = plan(alone_args);
    ASSERT_FALSE(alone["plans"].empty()) << c.dump();
    EXPECT_LE(c["lower_bound_ms"].get<double>(),
              alone["plans"][0]["iteration_ms"].get<double>() * (1.0 + 1e-9))
        << c.dump();
  }
  const auto proven = plan({"--schedule", "gpipe"});
  ASSERT_TRUE(proven["proven_optimal"].get<bool>());
  EXPECT_FALSE(proven.contains("open_configurations"));
}

// --optimizer-state-factor of plan and sweep: NaN and out-of-range values are one line, exit 2
// (CLI11's NonNegativeNumber used to let NaN through to the planner).
TEST(CliPlan, OptimizerStateFactorMustBeAFiniteNumberInRange) {
  for (const std::string sub : {"plan", "sweep"}) {
    for (const std::string value : {"nan", "-1", "1001", "inf", "2x"}) {
      std::vector<std::string> argv{
          PIPETUNE_CLI, sub, "--profile", kProfile, "--devices", "2", "--optimizer-state-factor",
          value};
      const auto r = testing::run_command(argv, PIPETUNE_SOURCE_DIR);
      EXPECT_EQ(r.exit_code, 2) << sub << " " << value << ": " << r.err;
      EXPECT_NE(r.err.find("expected a number from 0 to 1000, got \"" + value + "\""),
                std::string::npos)
          << sub << " " << value << ": " << r.err;
    }
    std::vector<std::string> ok{
        PIPETUNE_CLI, sub, "--profile", kProfile, "--devices", "2", "--optimizer-state-factor",
        "2"};
    EXPECT_EQ(testing::run_command(ok, PIPETUNE_SOURCE_DIR).exit_code, 0) << sub;
  }
}

}  // namespace
}  // namespace pipetune
