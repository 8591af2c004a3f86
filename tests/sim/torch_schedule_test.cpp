// The multi-stage generators against torch.distributed.pipelining's own: the project's Python
// (torch 2.11) prints each schedule's pipeline_order (tests/sim/torch_schedules.py) and every
// programme must equal ours action for action (idle steps aside); where torch refuses a
// combination, make_schedule must refuse it too. Then the CSV round trip and its refusals.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "sim/error.hpp"
#include "sim/schedule.hpp"
#include "sim/schedule_csv.hpp"
#include "tests/support/run_command.hpp"
#include "tests/support/scratch_dir.hpp"

namespace pipetune {
namespace {

struct Case {
  ScheduleKind kind;
  int ranks, per_rank, micro_batches;
  std::string request() const {
    return std::string(to_string(kind)) + ":" + std::to_string(ranks) + ":" +
           std::to_string(per_rank) + ":" + std::to_string(micro_batches);
  }
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (auto kind :
       {ScheduleKind::Interleaved1F1B, ScheduleKind::InterleavedZB, ScheduleKind::LoopedBFS}) {
    for (int ranks : {1, 2, 3, 4}) {
      for (int per_rank : {1, 2, 3}) {
        for (int m = 1; m <= 12; ++m) out.push_back({kind, ranks, per_rank, m});
      }
    }
  }
  for (auto kind : {ScheduleKind::ZBV, ScheduleKind::DualPipeV}) {
    for (int ranks : {1, 2, 3, 4, 5}) {
      for (int m = 1; m <= 12; ++m) out.push_back({kind, ranks, 2, m});
    }
  }
  return out;
}

// torch's answer per request: its rows (CSV cells), or "error ..." as the only row.
std::map<std::string, std::vector<std::string>> torch_schedules(const std::vector<Case>& all) {
  std::vector<std::string> argv{PIPETUNE_PYTHON, PIPETUNE_TORCH_SCHEDULES};
  for (const Case& c : all) argv.push_back(c.request());
  const auto result = testing::run_command(argv, {}, 600.0);
  if (result.exit_code != 0) return {};
  std::map<std::string, std::vector<std::string>> out;
  std::istringstream lines(result.out);
  std::string line, current;
  while (std::getline(lines, line)) {
    if (line.rfind("case ", 0) == 0) {
      current = line.substr(5);
      out[current];
    } else if (!current.empty()) {
      out[current].push_back(line);
    }
  }
  return out;
}

TEST(TorchSchedules, GeneratorsEqualTorchActionForAction) {
  if (!std::filesystem::exists(PIPETUNE_PYTHON)) GTEST_SKIP() << "no venv at " << PIPETUNE_PYTHON;
  const auto all = cases();
  const auto torch = torch_schedules(all);
  ASSERT_EQ(torch.size(), all.size()) << "the venv's Python did not answer every request";
  int compared = 0, refused = 0;
  for (const Case& c : all) {
    const auto& rows = torch.at(c.request());
    ASSERT_FALSE(rows.empty()) << c.request();
    const int stages = c.ranks * c.per_rank;
    if (rows.front().rfind("error", 0) == 0) {
      EXPECT_THROW(
          make_schedule(c.kind, stages, c.micro_batches, CheckpointMode::Never, c.per_rank),
          std::invalid_argument)
          << c.request() << ": torch refuses (" << rows.front() << ")";
      ++refused;
      continue;
    }
    const Schedule ours =
        make_schedule(c.kind, stages, c.micro_batches, CheckpointMode::Never, c.per_rank);
    ASSERT_EQ(ours.ranks(), c.ranks) << c.request();
    ASSERT_EQ(static_cast<int>(rows.size()), c.ranks) << c.request();
    for (int r = 0; r < c.ranks; ++r) {
      std::string mine;
      for (const Action& a : ours.per_rank[r]) mine += (mine.empty() ? "" : ",") + to_string(a);
      // torch's cells without the idle ones, DualPipeV's "(0F3;3B1)OVERLAP_F_B" pairs as their
      // two actions in order (torch's runtime runs them one after the other).
      std::string theirs;
      std::istringstream cells(rows[r]);
      for (std::string cell; std::getline(cells, cell, ',');) {
        if (cell.empty()) continue;
        if (cell.front() == '(') cell = cell.substr(1, cell.find(')') - 1);
        std::replace(cell.begin(), cell.end(), ';', ',');
        theirs += (theirs.empty() ? "" : ",") + cell;
      }
      EXPECT_EQ(mine, theirs) << c.request() << " rank " << r;
    }
    // The programme a stage is on is torch's stage-to-rank mapping.
    for (int s = 0; s < stages; ++s) {
      for (const Action& a : ours.per_rank[ours.stage_rank[s]]) {
        if (a.stage == s) goto found;
      }
      ADD_FAILURE() << c.request() << ": stage " << s << " not on its programme";
    found:;
    }
    // Our reader takes torch's own layout, idle cells included, as the same schedule.
    std::string torch_csv;
    for (const auto& row : rows) torch_csv += row + "\r\n";
    const Schedule read = parse_schedule_csv(torch_csv, c.request());
    EXPECT_EQ(read.per_rank, ours.per_rank) << c.request();
    EXPECT_EQ(read.stage_rank, ours.stage_rank) << c.request();
    ++compared;
  }
  EXPECT_GT(compared, 300);
  EXPECT_GT(refused, 10);
}

TEST(ScheduleCsv, RoundTripsEveryGeneratedSchedule) {
  for (auto kind : kAllScheduleKinds) {
    const int per_rank = fixed_stages_per_device(kind).value_or(3);
    const Schedule s = make_schedule(kind, 3 * per_rank, 6, CheckpointMode::Never, per_rank);
    const Schedule back = parse_schedule_csv(schedule_csv(s.per_rank), "x.csv");
    EXPECT_EQ(back.per_rank, s.per_rank) << to_string(kind);
    EXPECT_EQ(back.stage_rank, s.stage_rank) << to_string(kind);
    EXPECT_EQ(back.micro_batches, 6);
  }
}

// What we write, torch's loader accepts: every kind, with recomputes left out, and GPipe with
// two stages on one device written as that device's merged programme.
TEST(ScheduleCsv, TorchValidatesWhatWeWrite) {
  if (!std::filesystem::exists(PIPETUNE_PYTHON)) GTEST_SKIP() << "no venv at " << PIPETUNE_PYTHON;
  const auto dir = testing::scratch_dir() / "schedule_csv_test";
  std::filesystem::create_directories(dir);
  std::vector<std::string> argv{PIPETUNE_PYTHON, PIPETUNE_TORCH_SCHEDULES, "--validate"};
  auto add = [&](const std::string& name, const std::vector<std::vector<Action>>& programs,
                 int stages, int m) {
    const auto path = (dir / (name + ".csv")).string();
    std::ofstream(path, std::ios::binary) << schedule_csv(programs);
    argv.push_back(path + ":" + std::to_string(stages) + ":" + std::to_string(m));
  };
  for (auto kind : kAllScheduleKinds) {
    const int v = fixed_stages_per_device(kind).value_or(2);
    for (int m : {3, 4, 8}) {
      if (schedule_refusal(kind, 3, v, m)) continue;
      const Schedule s = make_schedule(kind, 3 * v, m, CheckpointMode::ExceptLast, v);
      add(std::string(to_string(kind)) + "-" + std::to_string(m), s.per_rank, 3 * v, m);
    }
  }
  const Schedule shared = make_schedule(ScheduleKind::GPipe, 4, 4, CheckpointMode::Never);
  const std::vector<int> device_of{0, 0, 1, 1};
  add("gpipe-shared", device_programs(shared, device_of, 2), 4, 4);
  const auto result = testing::run_command(argv, {}, 600.0);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  std::istringstream lines(result.out);
  int ok = 0;
  std::string current;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("case ", 0) == 0) {
      current = line.substr(5);
    } else {
      EXPECT_EQ(line, "ok") << current;
      ok += line == "ok";
    }
  }
  EXPECT_GE(ok, 15);
  std::filesystem::remove_all(dir);
}

TEST(ScheduleCsv, LeavesRecomputesOutAndCountsThem) {
  const Schedule s = make_schedule(ScheduleKind::OneFOneB, 2, 3, CheckpointMode::ExceptLast);
  int left_out = -1;
  const std::string csv = schedule_csv(s.per_rank, &left_out);
  EXPECT_EQ(left_out, 4);  // micro-batches 0 and 1 on both stages
  EXPECT_EQ(csv.find('R'), std::string::npos);
  EXPECT_EQ(parse_schedule_csv(csv, "x.csv").per_rank,
            make_schedule(ScheduleKind::OneFOneB, 2, 3, CheckpointMode::Never).per_rank);
}

TEST(ScheduleCsv, IdleCellsAndSpacesAreIgnored) {
  const Schedule s = parse_schedule_csv("0F0, ,0B0,\r\n,1F0,1B0\r\n", "x.csv");
  EXPECT_EQ(s.stages, 2);
  EXPECT_EQ(s.micro_batches, 1);
  EXPECT_EQ(s.stage_rank, (std::vector<int>{0, 1}));
}

std::string refusal(const std::string& csv) {
  try {
    parse_schedule_csv(csv, "s.csv");
  } catch (const InputError& e) {
    return e.what();
  }
  return "accepted";
}

TEST(ScheduleCsv, RefusesWhatTorchRefusesNamingRowAndCell) {
  // Not an action torch 2.11 parses (2.4's form, a recompute, a typo), or not compute-only.
  EXPECT_EQ(refusal("0F0_s1,0B0\n"),
            "s.csv: row 1, cell 1: expected an action such as 2F0 "
            "(stage, F, B, I or W, micro-batch), got \"0F0_s1\"");
  EXPECT_NE(refusal("0F0,0R0,0B0\n")
                .find("row 1, cell 2: expected F, B, I or W (torch has no "
                      "recompute"),
            std::string::npos);
  EXPECT_NE(refusal("0F0,0SEND_F0,0B0\n").find("row 1, cell 2: expected a compute action"),
            std::string::npos);
  // A backward before its forward; W before I.
  EXPECT_NE(refusal("0F0,1F0,1B0,0B0\n0F1\n").find("row 2, cell 1: 0F1"), std::string::npos);
  EXPECT_EQ(refusal("0B0,0F0\n"), "s.csv: row 1, cell 1: 0B0: before 0F0");
  EXPECT_EQ(refusal("0F0,0W0,0I0\n"), "s.csv: row 1, cell 2: 0W0: before 0I0");
  // A stage on two ranks.
  EXPECT_EQ(refusal("0F0,1F0\n1B0,0B0\n"),
            "s.csv: row 2, cell 1: 1B0: stage 1 already runs at "
            "row 1, cell 2 (one programme per stage)");
  // A micro-batch without a backward, or with I but no W, or with both B and I.
  EXPECT_EQ(refusal("0F0,0F1,0B0\n"), "s.csv: stage 0 has 2 micro-batches but no 0B1");
  EXPECT_EQ(refusal("0F0,0I0\n"), "s.csv: stage 0 has 1 micro-batches but no 0W0");
  EXPECT_NE(refusal("0F0,0I0,0B0,0W0\n")
                .find("row 1, cell 3: 0B0: micro-batch 0 of stage 0 has "
                      "a backward already"),
            std::string::npos);
  // A stage with no actions at all.
  EXPECT_NE(refusal("0F0,0B0\n2F0,2B0\n").find("stage 1 has 1 micro-batches but no 1F0"),
            std::string::npos);
  // DualPipeV's paired cell, malformed.
  EXPECT_EQ(refusal("0F0,()OVERLAP_F_B\n"),
            "s.csv: row 1, cell 2: expected sub-actions in (…)OVERLAP_F_B, such as "
            "(0F3;3B1)OVERLAP_F_B, got \"()OVERLAP_F_B\"");
  EXPECT_EQ(refusal("0F0,(0B0;0X1)OVERLAP_F_B\n"),
            "s.csv: row 1, cell 2: expected an action such as 2F0 (stage, F, B, I or W, "
            "micro-batch), got \"(0B0;0X1)OVERLAP_F_B\"");
  EXPECT_EQ(refusal("0F0,0F1OVERLAP_F_B\n"),
            "s.csv: row 1, cell 2: expected (sub-action;sub-action)OVERLAP_F_B, such as "
            "(0F3;3B1)OVERLAP_F_B, got \"0F1OVERLAP_F_B\"");
  // Programmes that wait on each other forever.
  EXPECT_EQ(refusal("0F0,1B0,0B0\n1F0\n"), "s.csv: row 1, cell 2: 1B0: before 1F0");
  EXPECT_NE(refusal("0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n").find("deadlocks"), std::string::npos);
}

// DualPipeV's "(F;B)OVERLAP_F_B" cell is its sub-actions in order, each named by that cell.
TEST(ScheduleCsv, OverlappedPairsAreTheirSubActionsInOrder) {
  const Schedule s =
      parse_schedule_csv("0F0,1F0,1B0,(0F1; 1F1)OVERLAP_F_B,(1B1;0B0)OVERLAP_F_B,0B1\r\n", "x.csv");
  const std::vector<Action> expected{{ActionKind::Forward, 0, 0},  {ActionKind::Forward, 1, 0},
                                     {ActionKind::Backward, 1, 0}, {ActionKind::Forward, 0, 1},
                                     {ActionKind::Forward, 1, 1},  {ActionKind::Backward, 1, 1},
                                     {ActionKind::Backward, 0, 0}, {ActionKind::Backward, 0, 1}};
  ASSERT_EQ(s.per_rank.size(), 1u);
  EXPECT_EQ(s.per_rank[0], expected);
  // A dependency broken inside a pair names the pair's cell.
  EXPECT_EQ(refusal("0F0,(0B0;0B1)OVERLAP_F_B,0F1\n"), "s.csv: row 1, cell 2: 0B1: before 0F1");
}

}  // namespace
}  // namespace pipetune
