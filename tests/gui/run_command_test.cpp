#include "gui/model/run_command.hpp"

#include <gtest/gtest.h>

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QTemporaryDir>

namespace pipetune::gui {
namespace {

TEST(RunCommand, TheModelSpecComesFromTheProfilesMeta) {
  EXPECT_EQ(model_spec_from_meta(R"({"profiler": "cpu", "model_spec": "mlp:layers=8,width=1024"})"),
            QStringLiteral("mlp:layers=8,width=1024"));
  EXPECT_FALSE(model_spec_from_meta(""));
  EXPECT_FALSE(model_spec_from_meta(R"({"profiler": "cpu"})"));
  EXPECT_FALSE(model_spec_from_meta(R"({"model_spec": 3})"));
  EXPECT_FALSE(model_spec_from_meta(R"({"model_spec": "  "})"));
  EXPECT_FALSE(model_spec_from_meta(R"(["model_spec"])"));
}

TEST(RunCommand, ArgumentsFollowTheContract) {
  RunRequest r;
  r.model_spec = QStringLiteral("mlp:layers=2");
  r.plan_path = QStringLiteral("/t/plan.json");
  r.steps = 7;
  r.trace_path = QStringLiteral("/t/out.json");
  EXPECT_EQ(run_arguments(r),
            (QStringList{"run", "--model", "mlp:layers=2", "--plan", "/t/plan.json", "--steps", "7",
                         "--trace", "/t/out.json", "--progress", "lines"}));
  r.batch_size = 64;
  r.device = QStringLiteral("cuda");
  r.dtype = QStringLiteral("float64");
  EXPECT_EQ(run_arguments(r).mid(11),
            (QStringList{"--batch", "64", "--device", "cuda", "--dtype", "float64"}));
}

TEST(RunCommand, TheRunReproducesTheProfilesSetting) {
  Profile profile;
  profile.batch_size = 48;
  profile.device = {"cpu", "some cpu", 0};
  profile.dtype = "float32";
  EXPECT_FALSE(
      run_request(profile, QStringLiteral("p"), 2, QStringLiteral("t")));  // no spec: no run
  profile.meta_json = R"({"model_spec": "transformer:blocks=4"})";
  const auto r = run_request(profile, QStringLiteral("p.json"), 3, QStringLiteral("t.json"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->model_spec, QStringLiteral("transformer:blocks=4"));
  EXPECT_EQ(r->plan_path, QStringLiteral("p.json"));
  EXPECT_EQ(r->steps, 3);
  EXPECT_EQ(r->batch_size, 48);
  EXPECT_EQ(r->device, QStringLiteral("cpu"));
  EXPECT_EQ(r->dtype, QStringLiteral("float32"));
  profile.device.type = "tpu";  // not a kind the command knows: left to its default
  profile.dtype = "bfloat16";
  const auto other = run_request(profile, QStringLiteral("p"), 2, QStringLiteral("t"));
  EXPECT_TRUE(other->device.isEmpty());
  EXPECT_TRUE(other->dtype.isEmpty());
}

TEST(RunCommand, ProgressLines) {
  EXPECT_EQ(parse_progress_line(QStringLiteral("progress 3 10")), (RunProgress{3, 10}));
  EXPECT_EQ(parse_progress_line(QStringLiteral("  progress 0 1\r")), (RunProgress{0, 1}));
  EXPECT_FALSE(parse_progress_line(QStringLiteral("progress 3")));
  EXPECT_FALSE(parse_progress_line(QStringLiteral("progress a b")));
  EXPECT_FALSE(parse_progress_line(QStringLiteral("progress -1 4")));
  EXPECT_FALSE(parse_progress_line(QStringLiteral("step 3 of 10")));
}

TEST(RunCommand, ReaderFollowsLinesThatArriveInPieces) {
  ProgressReader reader;
  EXPECT_FALSE(reader.feed("loading model\nprogr"));
  EXPECT_FALSE(reader.progress());
  EXPECT_EQ(reader.last_line(), QStringLiteral("loading model"));
  EXPECT_TRUE(reader.feed("ess 1 4\nprogress 2 4\nwarm"));
  EXPECT_EQ(*reader.progress(), (RunProgress{2, 4}));
  EXPECT_FALSE(reader.feed("ing up\n"));
  EXPECT_EQ(reader.last_line(), QStringLiteral("warming up"));
  EXPECT_FALSE(reader.feed("error: out of memory on cuda:1"));  // no newline yet
  EXPECT_FALSE(reader.finish());
  EXPECT_EQ(reader.last_line(), QStringLiteral("error: out of memory on cuda:1"));
  EXPECT_EQ(*reader.progress(), (RunProgress{2, 4}));
}

void make_executable(const QString& path) {
  QFile file(path);
  ASSERT_TRUE(file.open(QIODevice::WriteOnly));
  file.write("#!/bin/sh\nexit 0\n");
  file.close();
  file.setPermissions(file.permissions() | QFileDevice::ExeOwner);
}

TEST(RunCommand, FindsTheCommandInTheBuildTreeBesideTheAppOrThroughTheVariable) {
  QTemporaryDir root;
  ASSERT_TRUE(root.isValid());
  const QDir dir(root.path());
  // build/gui/app/pipetune-gui and build/cli/pipetune
  dir.mkpath(QStringLiteral("build/gui/app"));
  dir.mkpath(QStringLiteral("build/cli"));
  const QString app_dir = dir.filePath(QStringLiteral("build/gui/app"));
  const QString in_tree = dir.filePath(QStringLiteral("build/cli/pipetune"));
  make_executable(in_tree);
  EXPECT_EQ(locate_pipetune_cli(app_dir, {}), QFileInfo(in_tree).canonicalFilePath());

  // Installed side by side.
  dir.mkpath(QStringLiteral("bin"));
  const QString beside = dir.filePath(QStringLiteral("bin/pipetune"));
  make_executable(beside);
  EXPECT_EQ(locate_pipetune_cli(dir.filePath(QStringLiteral("bin")), {}),
            QFileInfo(beside).canonicalFilePath());

  // The variable wins, and a variable naming nothing runnable finds nothing.
  EXPECT_EQ(locate_pipetune_cli(app_dir, beside), QFileInfo(beside).absoluteFilePath());
  EXPECT_TRUE(locate_pipetune_cli(app_dir, dir.filePath(QStringLiteral("missing"))).isEmpty());
}

TEST(RunCommand, FallsBackToPath) {
  QTemporaryDir root;
  const QDir dir(root.path());
  dir.mkpath(QStringLiteral("app"));
  dir.mkpath(QStringLiteral("tools"));
  make_executable(dir.filePath(QStringLiteral("tools/pipetune")));
  const QByteArray saved = qgetenv("PATH");
  qputenv("PATH", dir.filePath(QStringLiteral("tools")).toUtf8());
  const QString found = locate_pipetune_cli(dir.filePath(QStringLiteral("app")), {});
  qputenv("PATH", QByteArray());
  const QString nowhere = locate_pipetune_cli(dir.filePath(QStringLiteral("app")), {});
  qputenv("PATH", saved);
  EXPECT_EQ(QFileInfo(found).canonicalFilePath(),
            QFileInfo(dir.filePath(QStringLiteral("tools/pipetune"))).canonicalFilePath());
  EXPECT_TRUE(nowhere.isEmpty());
}

}  // namespace
}  // namespace pipetune::gui
