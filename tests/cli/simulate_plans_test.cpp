// `simulate --plans`: many plans in one process. Each answer must be what `simulate --json`
// answers for that plan alone, in the order of the lines, and a bad line must not stop the rest.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/support/run_command.hpp"
#include "tests/support/scratch_dir.hpp"

namespace pipetune {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kProfile = "tests/data/tiny.profile.json";

testing::CommandResult pipetune(std::vector<std::string> args) {
  args.insert(args.begin(), PIPETUNE_CLI);
  return testing::run_command(args, PIPETUNE_SOURCE_DIR);
}

std::vector<json> json_lines(const std::string& out) {
  std::vector<json> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  return lines;
}

fs::path write_lines(const std::string& name, const std::vector<std::string>& lines) {
  const fs::path path = testing::scratch_dir() / name;
  std::ofstream out(path);
  for (const auto& l : lines) out << l << "\n";
  return path;
}

TEST(SimulatePlans, EachLineAnswersAsSimulateDoesForThatPlanAlone) {
  const std::vector<std::string> plans{
      R"({"format": "pipetune.plan/1", "balance": [3, 3], "chunks": 4, "checkpoint": "never", "schedule": "gpipe"})",
      R"({"balance": [2, 2, 2], "chunks": 8, "checkpoint": "always", "schedule": "1f1b"})",
      R"({"balance": [1, 2, 1, 2], "chunks": 4, "checkpoint": "never", "schedule": "interleaved-1f1b", "stages_per_device": 2})",
  };
  const fs::path file = write_lines("pipetune-plans-ok.jsonl", plans);
  const auto batch = pipetune({"simulate", "--profile", kProfile, "--plans", file.string()});
  ASSERT_EQ(batch.exit_code, 0) << batch.err;
  const std::vector<json> answers = json_lines(batch.out);
  ASSERT_EQ(answers.size(), plans.size()) << batch.out;
  for (std::size_t k = 0; k < plans.size(); ++k) {
    json plan = json::parse(plans[k]);
    plan["format"] = "pipetune.plan/1";
    const fs::path one = write_lines("pipetune-plan-one.json", {plan.dump()});
    const auto alone =
        pipetune({"simulate", "--profile", kProfile, "--plan", one.string(), "--json"});
    ASSERT_EQ(alone.exit_code, 0) << alone.err;
    json expected = json::parse(alone.out);
    json got = answers[k];
    EXPECT_EQ(got["line"], k + 1);
    got.erase("line");
    EXPECT_EQ(got, expected) << "line " << k + 1;
  }
}

// A profile with its layers' spreads: each line carries the plan's interval, as --json does.
TEST(SimulatePlans, ALineCarriesItsPlansIntervalAsSimulateDoes) {
  std::ifstream in(fs::path(PIPETUNE_SOURCE_DIR) / "traces" / "cpu-mlp.plan.json");
  json plan = json::parse(in);
  const fs::path file = write_lines("pipetune-plans-interval.jsonl", {plan.dump()});
  const std::string profile = "traces/cpu-mlp.profile.json";
  const auto batch = pipetune({"simulate", "--profile", profile, "--plans", file.string()});
  ASSERT_EQ(batch.exit_code, 0) << batch.err;
  const std::vector<json> answers = json_lines(batch.out);
  ASSERT_EQ(answers.size(), 1u);
  const auto alone =
      pipetune({"simulate", "--profile", profile, "--plan", "traces/cpu-mlp.plan.json", "--json"});
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  json got = answers[0];
  got.erase("line");
  EXPECT_TRUE(got.contains("interval_central")) << batch.out;
  EXPECT_EQ(got, json::parse(alone.out));
}

TEST(SimulatePlans, ABadLineIsAnsweredInItsPlaceAndTheRestStillRun) {
  const fs::path file = write_lines(
      "pipetune-plans-bad.jsonl",
      {R"({"balance": [3, 3], "chunks": 4, "checkpoint": "never", "schedule": "gpipe"})", "",
       R"({"balance": [3, 2], "chunks": 4, "checkpoint": "never", "schedule": "gpipe"})",
       "not json",
       R"({"balance": [3, 3], "chunks": 2, "checkpoint": "never", "schedule": "1f1b"})"});
  const auto r = pipetune({"simulate", "--profile", kProfile, "--plans", file.string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "note: no --hardware: for each plan as many as it needs of the profile's device (cpu, "
            "hand-made) with ideal links\n"
            "pipetune: error: 2 of 4 plans refused (their lines say why)\n");
  const std::vector<json> answers = json_lines(r.out);
  ASSERT_EQ(answers.size(), 4u) << r.out;  // the blank line is skipped, not answered
  EXPECT_EQ(answers[0]["line"], 1);
  EXPECT_TRUE(answers[0].contains("iteration_ms"));
  EXPECT_EQ(answers[1]["line"], 3);
  EXPECT_NE(answers[1]["error"].get<std::string>().find("line 3"), std::string::npos) << answers[1];
  EXPECT_EQ(answers[2]["line"], 4);
  EXPECT_NE(answers[2]["error"].get<std::string>().find("line 4"), std::string::npos) << answers[2];
  EXPECT_EQ(answers[3]["line"], 5);
  EXPECT_TRUE(answers[3].contains("iteration_ms"));
}

TEST(SimulatePlans, PlanFlagsBesideThePlansAreRefused) {
  const fs::path file = write_lines("pipetune-plans-one.jsonl", {"{}"});
  const auto r =
      pipetune({"simulate", "--profile", kProfile, "--plans", file.string(), "--chunks", "2"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("--plans"), std::string::npos) << r.err;
}

// A layer that changes its input in place (`modifies_input`) cannot start a stage after the
// first on torch's runtime: `simulate` says so of such a plan, and `plan` answers none.
TEST(TorchRuntime, AStageStartingByChangingItsInputInPlaceIsSaidAndNotPlanned) {
  std::ifstream in(fs::path(PIPETUNE_SOURCE_DIR) / kProfile);
  json profile = json::parse(in);
  profile["layers"][1]["output_aliases_input"] = true;
  profile["layers"][1]["modifies_input"] = true;
  const fs::path file = write_lines("pipetune-in-place.profile.json", {profile.dump()});
  const std::string torch = "tests/data/hardware-2-torch.json";
  const auto refused = pipetune({"simulate", "--profile", file.string(), "--hardware", torch,
                                 "--balance", "1,5", "--chunks", "2", "--checkpoint", "never"});
  ASSERT_EQ(refused.exit_code, 0) << refused.err;
  EXPECT_NE(refused.err.find("torch cannot run this plan: stage 1 starts with layer '" +
                             profile["layers"][1]["name"].get<std::string>() +
                             "', which changes its input in place"),
            std::string::npos)
      << refused.err;
  const auto fine = pipetune({"simulate", "--profile", file.string(), "--hardware", torch,
                              "--balance", "2,4", "--chunks", "2", "--checkpoint", "never"});
  EXPECT_EQ(fine.err.find("torch cannot run"), std::string::npos) << fine.err;
  const auto planned =
      pipetune({"plan", "--profile", file.string(), "--hardware", torch, "--json", "--top", "20"});
  ASSERT_EQ(planned.exit_code, 0) << planned.err;
  const json answer = json::parse(planned.out);
  ASSERT_FALSE(answer["plans"].empty());
  for (const json& plan : answer["plans"]) {
    int first = 0;
    const auto balance = plan["balance"].get<std::vector<int>>();
    for (std::size_t s = 0; s + 1 < balance.size(); ++s) {
      first += balance[s];
      EXPECT_NE(first, 1) << plan.dump();  // no stage after the first starts at layer 1
    }
  }
  EXPECT_NE(answer["search_space"].get<std::string>().find("do not start by changing"),
            std::string::npos);
}

// Under zero bubble torch's I detaches each stage's output in place, which a view refuses: a
// middle stage ending with a view is said by simulate and kept out of plan.
TEST(TorchRuntime, AZeroBubbleMiddleStageEndingWithAViewIsSaidAndNotPlanned) {
  std::ifstream in(fs::path(PIPETUNE_SOURCE_DIR) / kProfile);
  json profile = json::parse(in);
  profile["layers"][2]["output_aliases_input"] = true;  // a Flatten
  const fs::path file = write_lines("pipetune-view.profile.json", {profile.dump()});
  const std::string torch = "tests/data/hardware-2-torch.json";
  const auto simulate = [&](const std::string& balance) {
    return pipetune({"simulate", "--profile", file.string(), "--hardware", torch, "--balance",
                     balance, "--chunks", "2", "--checkpoint", "never", "--schedule",
                     "interleaved-zb", "--stages-per-device", "2"});
  };
  const auto refused = simulate("1,2,1,2");
  ASSERT_EQ(refused.exit_code, 0) << refused.err;
  EXPECT_NE(refused.err.find("torch cannot run this plan: stage 1 ends with layer '" +
                             profile["layers"][2]["name"].get<std::string>() +
                             "', whose output is a view of its input"),
            std::string::npos)
      << refused.err;
  const auto fine = simulate("1,1,2,2");
  ASSERT_EQ(fine.exit_code, 0) << fine.err;
  EXPECT_EQ(fine.err.find("torch cannot run"), std::string::npos) << fine.err;
  const auto planned = pipetune({"plan", "--profile", file.string(), "--hardware", torch,
                                 "--schedule", "interleaved-zb", "--json", "--top", "20"});
  ASSERT_EQ(planned.exit_code, 0) << planned.err;
  const json answer = json::parse(planned.out);
  ASSERT_FALSE(answer["plans"].empty());
  for (const json& plan : answer["plans"]) {
    const auto balance = plan["balance"].get<std::vector<int>>();
    int end = 0;
    for (std::size_t s = 0; s + 1 < balance.size(); ++s) {
      end += balance[s];
      if (s > 0) EXPECT_NE(end, 3) << plan.dump();  // no middle stage ends with layer 2
    }
  }
  EXPECT_NE(answer["search_space"].get<std::string>().find("do not end with a view"),
            std::string::npos)
      << answer["search_space"];
}

}  // namespace
}  // namespace pipetune
