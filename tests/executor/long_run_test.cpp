// A long run leaks nothing: a few hundred short steps, as `pipetune run` takes them (a fresh
// batch each step, the Adam optimizer, two CPU devices), keep the process's resident memory flat
// once warmed up, and the allocator's per-device peak does not creep up. With one micro-batch
// the devices take turns, every step allocates in the same order, and the peak is the same at
// every step; with four, copies and computes overlap and how many activations wait on a device
// at its peak depends on timing, so the peak varies, by at most those activations. A tensor kept alive across steps (a record holding an output, a
// mailbox never emptied, a graph kept by a saved loss) breaks one or the other.
// bench/executor/long_run.cpp runs the same for 1,000 steps and prints the figures
// docs/reliability.md records.

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "executor/executor.hpp"
#include "executor/models/model.hpp"

namespace pipetune {
namespace {

// Resident set size from /proc/self/statm (pages), in bytes.
std::int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<std::int64_t>(sysconf(_SC_PAGESIZE));
}

struct Run {
  std::vector<std::vector<std::int64_t>> peaks;  // per step, per device
  std::int64_t warm_resident = 0, top_resident = 0;
};

Run long_run(int chunks, int steps, int warmup) {
  constexpr std::int64_t kBatch = 32;
  models::ModelOptions model_options;
  model_options.seed = 3;
  models::Model model = models::build_model("mlp:layers=4,width=64", model_options);
  Plan plan;
  plan.balance = {3, 2};
  plan.chunks = chunks;
  plan.checkpoint = CheckpointMode::ExceptLast;
  exec::ExecutorOptions options;
  options.devices = {"cpu:0", "cpu:1"};
  options.threads_per_cpu_device = 1;
  options.optimizer = exec::OptimizerKind::Adam;
  exec::Pipeline pipeline(model, plan, kBatch, options);
  Run run;
  for (int k = 0; k < steps; ++k) {
    auto [input, target] = model.make_batch(kBatch, 1000 + static_cast<std::uint64_t>(k));
    run.peaks.push_back(pipeline.step(input, target).peak_memory_bytes);
    if (k + 1 == warmup) run.warm_resident = resident_bytes();
    if (k + 1 > warmup) run.top_resident = std::max(run.top_resident, resident_bytes());
  }
  return run;
}

// Every step's tensors are a few hundred kB; a leak of one per step would be ~50 MB by the end.
// The allowance covers the C library's arenas settling.
constexpr std::int64_t kResidentAllowance = std::int64_t{4} << 20;

TEST(LongRun, OneMicroBatchPeaksEqualStepAfterStepAndResidentMemoryIsFlat) {
  const Run run = long_run(1, 200, 50);
  // The first step creates the gradients and Adam's state; from the second on, every step
  // allocates exactly the same.
  for (std::size_t k = 2; k < run.peaks.size(); ++k) {
    ASSERT_EQ(run.peaks[k], run.peaks[1]) << "step " << k + 1;
  }
  EXPECT_LT(run.top_resident - run.warm_resident, kResidentAllowance)
      << "resident " << run.warm_resident << " -> " << run.top_resident;
}

TEST(LongRun, OverlappingMicroBatchesPeaksStayWithinTheirActivationsAndResidentMemoryIsFlat) {
  constexpr int kChunks = 4;
  const Run run = long_run(kChunks, 300, 100);
  // What can differ between two steps is how many received activations (on cpu:1) or
  // gradients (on cpu:0) wait at the device's peak: at most every micro-batch's, 8 samples of
  // 64 floats each. A leak of anything (64 bytes at the least) per step exceeds that within
  // the run.
  constexpr std::int64_t kReceived = kChunks * (32 / kChunks) * 64 * sizeof(float);
  for (std::size_t d = 0; d < 2; ++d) {
    std::int64_t low = run.peaks[1][d], high = low;
    for (std::size_t k = 1; k < run.peaks.size(); ++k) {
      low = std::min(low, run.peaks[k][d]);
      high = std::max(high, run.peaks[k][d]);
    }
    EXPECT_LE(high - low, kReceived) << "device " << d << ": peaks from " << low << " to " << high;
  }
  EXPECT_LT(run.top_resident - run.warm_resident, kResidentAllowance)
      << "resident " << run.warm_resident << " -> " << run.top_resident;
}

}  // namespace
}  // namespace pipetune
