// RunController against a stand-in for `pipetune run`: a shell script that follows the
// command's contract (progress lines on stderr, the trace at --trace, the reason on the last
// stderr line when it fails) and records what it was asked.

#include "gui/widgets/run_controller.hpp"

#include <gtest/gtest.h>

#include <QDir>
#include <QFile>
#include <QTemporaryDir>

#include "tests/gui/gui_test_support.hpp"

namespace pipetune::gui {
namespace {

constexpr const char* kFakeCli = R"(#!/bin/sh
dir=$(dirname "$0")
printf '%s\n' "$@" > "$dir/args.txt"
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift ;;
    --plan) plan=$2; shift ;;
    --steps) steps=$2; shift ;;
    --trace) trace=$2; shift ;;
  esac
  shift
done
cp "$plan" "$dir/plan-seen.json"
case "$model" in
  mlp:broken)
    echo "progress 1 $steps" >&2
    echo "error: mlp:broken: no such model option" >&2
    exit 2 ;;
  mlp:no-trace) exit 0 ;;
esac
i=1
while [ "$i" -le "$steps" ]; do
  echo "step $i loss 0.5" >&2
  echo "progress $i $steps" >&2
  sleep 0.02
  i=$((i + 1))
done
cp "$dir/measured.json" "$trace"
)";

class RunControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::app();
    ASSERT_TRUE(folder_.isValid());
    cli_ = folder_.filePath(QStringLiteral("pipetune"));
    QFile script(cli_);
    ASSERT_TRUE(script.open(QIODevice::WriteOnly));
    script.write(kFakeCli);
    script.close();
    script.setPermissions(script.permissions() | QFileDevice::ExeOwner);
    profile_ = load_profile(testing::data_path("tiny.profile.json"));
    hardware_ = load_hardware(testing::data_path("hardware-2.json"));
    plan_ = load_plan(testing::data_path("plan-2x4.json"));
    measured_ = testing::make_measured_trace(profile_, hardware_, plan_, 1.1, 0.9, 50.0);
    save_trace(measured_, folder_.filePath(QStringLiteral("measured.json")).toStdString());
  }

  Profile with_spec(const std::string& spec) const {
    Profile p = profile_;
    p.meta_json = R"({"profiler": "cpu", "model_spec": ")" + spec + R"("})";
    return p;
  }

  QTemporaryDir folder_;
  QString cli_;
  Profile profile_;
  Hardware hardware_;
  Plan plan_;
  Trace measured_;
};

TEST_F(RunControllerTest, RunsThePlanFollowsProgressAndHandsBackTheTrace) {
  RunController runner;
  runner.set_cli(cli_);
  std::vector<RunProgress> seen;
  QString trace_path, failure;
  QObject::connect(&runner, &RunController::progressed, [&](int done, int total) {
    seen.push_back({done, total});
  });
  QObject::connect(&runner, &RunController::succeeded, [&](const QString& p) { trace_path = p; });
  QObject::connect(&runner, &RunController::failed, [&](const QString& r) { failure = r; });

  ASSERT_TRUE(runner.start(with_spec("mlp:layers=6,width=64"), plan_, 3));
  EXPECT_TRUE(runner.running());
  ASSERT_TRUE(testing::wait_until([&] { return !trace_path.isEmpty() || !failure.isEmpty(); }));
  EXPECT_TRUE(failure.isEmpty()) << failure.toStdString();
  EXPECT_FALSE(runner.running());
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back(), (RunProgress{3, 3}));
  for (std::size_t k = 1; k < seen.size(); ++k) {
    EXPECT_GT(seen[k].done, seen[k - 1].done);
  }

  // It ran the contract's command line, with the plan it was given.
  QFile args(folder_.filePath(QStringLiteral("args.txt")));
  ASSERT_TRUE(args.open(QIODevice::ReadOnly));
  const QStringList lines =
      QString::fromUtf8(args.readAll()).split(QLatin1Char('\n'), Qt::SkipEmptyParts);
  ASSERT_EQ(lines.size(), 17);
  EXPECT_EQ(lines[0], QStringLiteral("run"));
  EXPECT_EQ(lines[2], QStringLiteral("mlp:layers=6,width=64"));
  EXPECT_EQ(lines[6], QStringLiteral("3"));
  EXPECT_EQ(lines[8], trace_path);
  EXPECT_EQ(lines[10], QStringLiteral("lines"));
  // The profile's batch (8), device kind and dtype, so the run measures what it profiled.
  EXPECT_EQ(lines.mid(11), (QStringList{"--batch", "8", "--device", "cpu", "--dtype", "float32"}));
  EXPECT_EQ(load_plan(folder_.filePath(QStringLiteral("plan-seen.json")).toStdString()), plan_);
  const Trace back = load_trace(trace_path.toStdString());
  EXPECT_EQ(back.kind, "measured");
  EXPECT_EQ(back.tasks.size(), measured_.tasks.size());
}

TEST_F(RunControllerTest, AFailedRunGivesItsLastStderrLine) {
  RunController runner;
  runner.set_cli(cli_);
  QString failure;
  bool succeeded = false;
  QObject::connect(&runner, &RunController::failed, [&](const QString& r) { failure = r; });
  QObject::connect(&runner, &RunController::succeeded, [&] { succeeded = true; });
  ASSERT_TRUE(runner.start(with_spec("mlp:broken"), plan_, 4));
  ASSERT_TRUE(testing::wait_until([&] { return !failure.isEmpty() || succeeded; }));
  EXPECT_FALSE(succeeded);
  EXPECT_EQ(failure, QStringLiteral("error: mlp:broken: no such model option"));
  EXPECT_EQ(*runner.progress(), (RunProgress{1, 4}));
}

TEST_F(RunControllerTest, ARunThatWritesNoTraceIsAFailure) {
  RunController runner;
  runner.set_cli(cli_);
  QString failure;
  QObject::connect(&runner, &RunController::failed, [&](const QString& r) { failure = r; });
  ASSERT_TRUE(runner.start(with_spec("mlp:no-trace"), plan_, 2));
  ASSERT_TRUE(testing::wait_until([&] { return !failure.isEmpty(); }));
  EXPECT_TRUE(failure.contains(QStringLiteral("wrote no trace")));
}

TEST_F(RunControllerTest, WithoutAModelSpecOrACommandThereIsNoRun) {
  RunController runner;
  runner.set_cli(cli_);
  EXPECT_TRUE(runner.unavailable_reason(&profile_).contains(QStringLiteral("model_spec")));
  QString failure;
  QObject::connect(&runner, &RunController::failed, [&](const QString& r) { failure = r; });
  EXPECT_FALSE(runner.start(profile_, plan_, 1));
  EXPECT_FALSE(failure.isEmpty());
  runner.set_cli({});
  EXPECT_TRUE(runner.unavailable_reason(&profile_).contains(QStringLiteral("model_spec")));
  const Profile specified = with_spec("mlp:layers=6");
  EXPECT_TRUE(runner.unavailable_reason(&specified).contains(QStringLiteral("PIPETUNE_CLI")));
  runner.set_cli(cli_);
  EXPECT_TRUE(runner.unavailable_reason(&specified).isEmpty());
}

}  // namespace
}  // namespace pipetune::gui
