// A long run leaks nothing: a few hundred short steps, as `pipetune run` takes them (a fresh
// batch each step, the Adam optimizer, two CPU devices), keep the process's resident memory flat
// once warmed up, and the allocator's per-device peak is the same at every step. A tensor kept
// alive across steps (a trace record holding its output, a mailbox never emptied, a graph kept
// by a saved loss) raises either or both. bench/executor/long_run.cpp runs the same for 1,000
// steps and prints the figures docs/reliability.md records.

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

TEST(LongRun, ResidentMemoryIsFlatAndTheAllocatorPeakEqualStepAfterStep) {
  constexpr int kSteps = 300, kWarmup = 50;
  constexpr std::int64_t kBatch = 32;
  models::ModelOptions model_options;
  model_options.seed = 3;
  models::Model model = models::build_model("mlp:layers=4,width=64", model_options);
  Plan plan;
  plan.balance = {3, 2};
  plan.chunks = 4;
  plan.checkpoint = CheckpointMode::ExceptLast;
  exec::ExecutorOptions options;
  options.devices = {"cpu:0", "cpu:1"};
  options.threads_per_cpu_device = 1;
  options.optimizer = exec::OptimizerKind::Adam;
  exec::Pipeline pipeline(model, plan, kBatch, options);

  std::vector<std::int64_t> first_peaks;
  std::int64_t warm_resident = 0, top_resident = 0;
  for (int k = 0; k < kSteps; ++k) {
    auto [input, target] = model.make_batch(kBatch, 1000 + static_cast<std::uint64_t>(k));
    const exec::StepRecord record = pipeline.step(input, target);
    ASSERT_EQ(record.peak_memory_bytes.size(), 2u);
    // The first step creates the gradients and Adam's state; from the second on, every step
    // allocates exactly the same.
    if (k == 1) first_peaks = record.peak_memory_bytes;
    if (k > 1) ASSERT_EQ(record.peak_memory_bytes, first_peaks) << "step " << k;
    if (k + 1 == kWarmup) warm_resident = resident_bytes();
    if (k + 1 > kWarmup) top_resident = std::max(top_resident, resident_bytes());
  }
  // Every step's tensors are a few hundred kB; a leak of one per step would be ~100 MB by now.
  // The allowance covers the C library's arenas settling.
  const std::int64_t growth = top_resident - warm_resident;
  RecordProperty("resident_after_warmup_bytes", std::to_string(warm_resident));
  RecordProperty("resident_growth_bytes", std::to_string(growth));
  EXPECT_LT(growth, std::int64_t{4} << 20) << "resident " << warm_resident << " -> " << top_resident;
}

}  // namespace
}  // namespace pipetune
