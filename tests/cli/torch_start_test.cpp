// The commands that run a model go through pipetune-torch; the others never load LibTorch.
// What a user sees either way: one line for a model larger than the machine, one program.

#include <gtest/gtest.h>

#include <filesystem>

#include "tests/support/run_command.hpp"
#include "tests/support/scratch_dir.hpp"

namespace pipetune {
namespace {

namespace fs = std::filesystem;

TEST(TorchPart, AModelLargerThanTheMachineIsOneLineNamingTheLayerAndTheBytes) {
  // block0 of this MLP is a 2,000,000 x 2,000,000 float32 weight: 16 TB, more than any
  // machine this runs on, so LibTorch's allocator refuses it at once.
  const fs::path out = testing::scratch_dir() / "oom.profile.json";
  const auto r =
      testing::run_command({PIPETUNE_CLI, "profile", "--model", "mlp:layers=2,width=2000000",
                            "--batch", "4", "-o", out.string()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;  // one line, no backtrace
  EXPECT_NE(r.err.find("building layer \"block0\" of mlp-2x2000000"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("a tensor of 16000000000000 bytes"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("this machine has"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
}

TEST(TorchPart, TheModelCommandsAnswerThroughTheSameCommand) {
  // `pipetune run --help` is pipetune-torch's help, under the name users typed.
  const auto r = testing::run_command({PIPETUNE_CLI, "run", "--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("--steps"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("pipetune-torch"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace pipetune
