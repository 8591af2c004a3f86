// libFuzzer target: a batch file (what `torch.save((inputs, targets), F)` writes, read with
// LibTorch's unpickler) must load or be refused with InputError, whatever its bytes; what loads
// is a pair of tensors with the same number of samples, at least one, and any step's samples
// can be taken from it. LibTorch itself is not instrumented, so coverage guides the search only
// through pipetune's checks; the corpus holds real torch.save files to mutate from.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "executor/models/batch_file.hpp"
#include "fuzz/fuzz_support.hpp"
#include "sim/error.hpp"

namespace {

// load_batch_file takes a path, as `--model torchscript:...,batch=F` gives it: one scratch file
// per fuzzing process, rewritten for every input.
const std::string& scratch_path() {
  static const std::string path = (std::filesystem::temp_directory_path() /
                                   ("batch_file_fuzz." + std::to_string(getpid()) + ".pt"))
                                      .string();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pipetune;
  {
    std::ofstream out(scratch_path(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  models::BatchFile file;
  try {
    file = models::load_batch_file(scratch_path());
  } catch (const InputError&) {
    return 0;
  }
  fuzz::require(file.inputs.dim() > 0 && file.targets.dim() > 0, "a tensor without dimensions");
  fuzz::require(file.samples() > 0 && file.targets.size(0) == file.samples(),
                "inputs and targets with different or no samples");
  const auto [inputs, targets] = models::take_samples(file, 3, 5);
  fuzz::require(inputs.size(0) == 3 && targets.size(0) == 3, "a step took the wrong samples");
  return 0;
}
