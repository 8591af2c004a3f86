// Bringing a model as a user does: scripts/export_model.py writes a scripted Sequential and a
// batch of real data, and profile, plan, run and validate take them. Checked against what the
// data is (bytes of int64 token ids and float activations) and against the model run in Python.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sim/profile.hpp"
#include "tests/support/run_command.hpp"
#include "tests/support/scratch_dir.hpp"

namespace pipetune {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  return testing::scratch_file("byo_model_test", name);
}

// Exports MODULE:FUNCTION to PREFIX.pt and PREFIX.batch.pt; returns the spec it printed.
std::string export_model(const std::string& target, const fs::path& prefix,
                         std::vector<std::string> extra = {}) {
  std::vector<std::string> argv{PIPETUNE_PYTHON, PIPETUNE_SOURCE_DIR "/scripts/export_model.py",
                                target, "--out", prefix.string()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const auto r = testing::run_command(argv);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::string text = r.out;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text.substr(text.rfind('\n') + 1);
}

// Runs Python code with the given arguments (sys.argv[1:]); returns what it printed.
std::string python(const std::string& code, std::vector<std::string> args = {}) {
  std::vector<std::string> argv{PIPETUNE_PYTHON, "-c", code};
  argv.insert(argv.end(), args.begin(), args.end());
  const auto r = testing::run_command(argv);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.out;
}

const std::string kTokenModel = PIPETUNE_SOURCE_DIR "/tests/executor/token_model.py:build";
const std::string kSmallModel = PIPETUNE_SOURCE_DIR "/tests/cli/small_model.py";

TEST(CliBringYourOwnModel, TokenModelProfileHasRealBoundaryBytesAndValidates) {
  const std::string spec = export_model(kTokenModel, scratch("gpt"));
  const fs::path profile = scratch("gpt.profile.json");
  const auto r = testing::run_command({PIPETUNE_CLI, "profile", "--model", spec, "--batch", "8",
                                       "-o", profile.string(), "--repeats", "1", "--warmup", "0",
                                       "--progress", "none"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Profile p = load_profile(profile.string());
  ASSERT_EQ(p.micro_batch_sizes, (std::vector<std::int64_t>{1, 2, 4, 8}));
  ASSERT_EQ(p.layers.size(), 4u);
  for (std::size_t i = 0; i < p.micro_batch_sizes.size(); ++i) {
    const std::int64_t n = p.micro_batch_sizes[i];
    EXPECT_EQ(p.input_bytes[i], n * 16 * 8) << n;                  // int64 token ids into stage 0
    EXPECT_EQ(p.layers[0].output_bytes[i], n * 16 * 32 * 4) << n;  // float32 activations after
    EXPECT_EQ(p.layers[1].output_bytes[i], n * 16 * 32 * 4) << n;
    EXPECT_EQ(p.layers[2].output_bytes[i], n * 16 * 32 * 4) << n;
    EXPECT_EQ(p.layers[3].output_bytes[i], n * 16 * 50 * 4) << n;  // logits over the vocabulary
  }
  const fs::path out = scratch("gpt-validation");
  const auto v = testing::run_command({PIPETUNE_CLI,
                                       "validate",
                                       "--model",
                                       spec,
                                       "--batch",
                                       "8",
                                       "--profile",
                                       profile.string(),
                                       "--devices",
                                       "2",
                                       "--top",
                                       "1",
                                       "--steps",
                                       "2",
                                       "--rounds",
                                       "1",
                                       "--calibration-plans",
                                       "0",
                                       "--out",
                                       out.string(),
                                       "--json",
                                       "--progress",
                                       "none"},
                                      {}, 300.0);
  ASSERT_EQ(v.exit_code, 0) << v.err;
  const auto report = nlohmann::json::parse(v.out);
  ASSERT_EQ(report["plans"].size(), 1u);
  EXPECT_GT(report["plans"][0]["measured_median_ms"].get<double>(), 0.0);
}

TEST(CliBringYourOwnModel, ExportProfilePlanRun) {
  const fs::path prefix = scratch("small");
  const std::string spec = export_model(kSmallModel + ":build", prefix, {"--loss", "mse"});
  EXPECT_EQ(spec, "torchscript:path=" + prefix.string() + ".pt,batch=" + prefix.string() +
                      ".batch.pt,loss=mse");
  const fs::path profile = scratch("small.profile.json"), plan = scratch("small.plan.json");
  auto ok = [](const testing::CommandResult& r) {
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r;
  };
  ok(testing::run_command({PIPETUNE_CLI, "profile", "--model", spec, "--batch", "16", "-o",
                           profile.string(), "--repeats", "1", "--warmup", "0", "--progress",
                           "none"}));
  ok(testing::run_command({PIPETUNE_CLI, "plan", "--profile", profile.string(), "--devices", "2",
                           "--stages", "2", "-o", plan.string()}));
  const auto run = ok(testing::run_command(
      {PIPETUNE_CLI, "run", "--model", spec, "--batch", "16", "--plan", plan.string(), "--steps",
       "1", "--warmup", "0", "--optimizer", "none", "--json", "--progress", "none"}));
  // The first step's loss is the model's mse on the file's first 16 samples, as Python computes it.
  const double expected = std::stod(
      python("import sys, torch; m = torch.jit.load(sys.argv[1]); x, y = torch.load(sys.argv[2]);"
             "print(repr(torch.nn.functional.mse_loss(m(x[:16]), y[:16]).item()))",
             {prefix.string() + ".pt", prefix.string() + ".batch.pt"}));
  const double loss = nlohmann::json::parse(run.out)["losses"][0].get<double>();
  EXPECT_NEAR(loss, expected, 1e-5 * expected);
}

// Batch norm over features cannot train on one sample. The profile starts at two and says why,
// the planner picks no chunk count that splits finer, and run refuses a plan that does before any
// step. (Before, every profile of such a model ended in "internal error: The following operation
// failed in the TorchScript interpreter.")
TEST(CliBringYourOwnModel, AModelThatCannotTrainOnOneSampleIsProfiledFromTwo) {
  const fs::path script = scratch("norm.pt"), profile = scratch("norm.profile.json"),
                 plan = scratch("norm.plan.json"), fine = scratch("fine.plan.json");
  python(
      "import sys, torch\n"
      "torch.jit.script(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), "
      "torch.nn.Linear(16, 4))).save(sys.argv[1])\n",
      {script.string()});
  const std::string spec = "torchscript:path=" + script.string() + ",input=8,classes=4";
  const auto profiled = testing::run_command(
      {PIPETUNE_CLI, "profile", "--model", spec, "--batch", "4", "-o", profile.string(),
       "--repeats", "1", "--warmup", "0", "--progress", "none", "--no-after-idle"});
  ASSERT_EQ(profiled.exit_code, 0) << profiled.err;
  EXPECT_THAT(profiled.err, ::testing::HasSubstr(
                                "micro-batches of at least 2 samples (min_micro_batch): layer 1 "
                                "(\"1\") cannot train on 1 sample: builtins.ValueError: Expected "
                                "more than 1 value per channel when training, got input size [1, "
                                "16]"));
  const Profile p = load_profile(profile.string());
  EXPECT_EQ(p.micro_batch_sizes, (std::vector<std::int64_t>{2, 4}));
  EXPECT_EQ(p.min_micro_batch, 2);
  const auto planned = testing::run_command(
      {PIPETUNE_CLI, "plan", "--profile", profile.string(), "--devices", "2", "-o", plan.string()});
  ASSERT_EQ(planned.exit_code, 0) << planned.err;
  EXPECT_LE(nlohmann::json::parse(std::ifstream(plan))["chunks"].get<int>(), 2);
  std::ofstream(fine) << R"({"format": "pipetune.plan/1", "balance": [2, 1], "chunks": 4,)"
                      << R"( "checkpoint": "never", "schedule": "gpipe"})";
  const auto run =
      testing::run_command({PIPETUNE_CLI, "run", "--model", spec, "--batch", "4", "--plan",
                            fine.string(), "--steps", "1", "--progress", "none"});
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_EQ(run.err, "pipetune: error: " + fine.string() +
                         ": chunks: 4 split the batch of 4 into micro-batches of 1: layer 1 "
                         "(\"1\") cannot train on 1 sample: builtins.ValueError: Expected more "
                         "than 1 value per channel when training, got input size [1, 16]\n");
}

// Every bad input: one line, exit status 2, nothing written.
TEST(CliBringYourOwnModel, BadInputIsOneLineAndWritesNothing) {
  const std::string spec = export_model(kTokenModel, scratch("bad-gpt"));
  const std::string gpt = scratch("bad-gpt.pt").string();
  const fs::path out = scratch("never.profile.json");
  auto error = [&](const std::string& model, const std::string& batch = "8") {
    const auto r = testing::run_command({PIPETUNE_CLI, "profile", "--model", model, "--batch",
                                         batch, "-o", out.string(), "--repeats", "1", "--warmup",
                                         "0", "--progress", "none"});
    EXPECT_EQ(r.exit_code, 2) << model << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(out)) << model;
    return r.err;
  };
  // The bad files, written in one Python run (each start of torch costs seconds).
  const fs::path text = scratch("hello.pt"), triple = scratch("triple.pt"),
                 tensor = scratch("tensor.pt"), floats = scratch("floats.pt"),
                 per_sample = scratch("per-sample.pt"), flat = scratch("flat.pt");
  python(
      "import sys, torch\n"
      "text, triple, tensor, floats, per_sample, flat = sys.argv[1:]\n"
      "open(text, 'w').write('hello')\n"
      "torch.save((torch.zeros(4, 16, dtype=torch.long),) * 3, triple)\n"
      "torch.save(torch.zeros(4, 16), tensor)\n"
      "torch.save((torch.randn(4, 16), torch.zeros(4, 16, dtype=torch.long)), floats)\n"
      "torch.save((torch.zeros(4, 16, dtype=torch.long), torch.zeros(4, dtype=torch.long)), "
      "per_sample)\n"
      "torch.jit.script(torch.nn.Sequential(torch.nn.Linear(8, 1), "
      "torch.nn.Flatten(0))).save(flat)\n",
      {text.string(), triple.string(), tensor.string(), floats.string(), per_sample.string(),
       flat.string()});

  EXPECT_THAT(error("torchscript:path=" + text.string() + ",input=8"),
              ::testing::StartsWith("pipetune: error: --model: " + text.string() +
                                    ": not a TorchScript file"));

  EXPECT_EQ(error("torchscript:path=" + gpt + ",batch=" + triple.string()),
            "pipetune: error: --model: batch: " + triple.string() +
                ": expected a pair of tensors, as torch.save((inputs, targets), FILE) writes; got "
                "a tuple of 3\n");
  EXPECT_EQ(error("torchscript:path=" + gpt + ",batch=" + tensor.string()),
            "pipetune: error: --model: batch: " + tensor.string() +
                ": expected a pair of tensors, as torch.save((inputs, targets), FILE) writes; got "
                "a Tensor\n");
  EXPECT_THAT(error("torchscript:path=" + gpt + ",batch=" + text.string()),
              ::testing::StartsWith("pipetune: error: --model: batch: " + text.string() +
                                    ": not a file torch.save wrote"));
  // A torch.save file whose zip directory points past its end (found by the batch_file fuzz
  // target): LibTorch's in-memory reader copied from beyond the buffer and crashed.
  const std::string past_end =
      PIPETUNE_SOURCE_DIR "/tests/data/bad/batch_zip_directory_past_end.pt";
  EXPECT_THAT(error("torchscript:path=" + gpt + ",batch=" + past_end),
              ::testing::StartsWith("pipetune: error: --model: batch: " + past_end +
                                    ": not a file torch.save wrote"));
  // A tensor whose shape claims more elements than the file stores (found by the same target):
  // copying it to contiguous, or taking a step's samples, read past its storage.
  const std::string past_storage =
      PIPETUNE_SOURCE_DIR "/tests/data/bad/batch_tensor_past_storage.pt";
  EXPECT_THAT(error("torchscript:path=" + gpt + ",batch=" + past_storage),
              ::testing::MatchesRegex("pipetune: error: --model: batch: " + past_storage +
                                      ": the (inputs|targets) .* need [0-9]+ bytes, but the file "
                                      "stores [0-9]+\n"));
  // A memo index of billions (found by the same target): LibTorch's unpickler grew its memo
  // table to that many entries, 30 GB, before anything could refuse it.
  const std::string memo = PIPETUNE_SOURCE_DIR "/tests/data/bad/batch_memo_index_past_the_memo.pt";
  EXPECT_THAT(
      error("torchscript:path=" + gpt + ",batch=" + memo),
      ::testing::MatchesRegex("pipetune: error: --model: batch: " + memo +
                              ": not a file torch.save wrote \\(pickle memo index [0-9]+ "
                              "at byte [0-9]+ is out of order \\([0-9]+ set so far\\)\\)\n"));
  // A quantized tensor (found by the same target): index_select aborted inside LibTorch.
  const std::string quantized = PIPETUNE_SOURCE_DIR "/tests/data/bad/batch_quantized_tensor.pt";
  EXPECT_THAT(error("torchscript:path=" + gpt + ",batch=" + quantized),
              ::testing::MatchesRegex("pipetune: error: --model: batch: " + quantized +
                                      ": the (inputs|targets) are .*: expected floating-point, "
                                      "integer or boolean data\n"));

  // validate refuses before it makes its folder.
  const fs::path folder = scratch("never-validated");
  const auto v = testing::run_command({PIPETUNE_CLI, "validate", "--model", spec, "--batch", "21",
                                       "--out", folder.string(), "--progress", "none"});
  EXPECT_EQ(v.exit_code, 2);
  EXPECT_EQ(v.err, "pipetune: error: --batch 21: the model's batch file holds only 20 samples\n");
  EXPECT_FALSE(fs::exists(folder));
  EXPECT_EQ(error(spec, "21"),
            "pipetune: error: --batch 21: the model's batch file holds only 20 samples\n");

  EXPECT_THAT(
      error("torchscript:path=" + gpt + ",batch=" + floats.string(), "4"),
      ::testing::StartsWith(
          "pipetune: error: --model: layer 0 (\"embed\") rejects its input float32 [2, 16]: "));

  EXPECT_EQ(error("torchscript:path=" + gpt + ",batch=" + per_sample.string(), "4"),
            "pipetune: error: loss: targets int64 [2] cannot match the output float32 [2, 16, 50]: "
            "cross entropy takes "
            "class indices of shape [2, 16] (the output's without its last dimension) or class "
            "probabilities of "
            "the output's shape\n");

  EXPECT_EQ(error("torchscript:path=" + flat.string() + ",input=8"),
            "pipetune: error: loss: the model's output float32 [2] has no last dimension to "
            "classify over (cross "
            "entropy needs [samples, …, classes]; for regression use loss=mse)\n");

  // The exporter names the child TorchScript cannot compile, with torch's reason, and writes
  // nothing.
  const fs::path prefix = scratch("unscriptable");
  const auto r =
      testing::run_command({PIPETUNE_PYTHON, PIPETUNE_SOURCE_DIR "/scripts/export_model.py",
                            kSmallModel + ":unscriptable", "--out", prefix.string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, ::testing::StartsWith(
                         "export_model: error: child '1' (ToNumpy) cannot be scripted: "));
  EXPECT_THAT(r.err, ::testing::HasSubstr("numpy"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(prefix.string() + ".pt"));
  EXPECT_FALSE(fs::exists(prefix.string() + ".batch.pt"));
}

}  // namespace
}  // namespace pipetune
