// A long run on CPU, as `pipetune run` takes it (a fresh batch each step, Adam, two CPU
// devices): the process's resident memory every 100 steps and each device's allocator peak,
// for a plan with one micro-batch (the devices take turns: every step allocates in the same
// order) and one with four (copies and computes overlap, so how many activations wait on a
// device at its peak depends on timing). tests/executor/long_run_test.cpp asserts the same at
// CI size; docs/reliability.md records what this prints for 1,000 steps.
//
//   build/bench/executor/pipetune_long_run_bench [steps]

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <set>
#include <vector>

#include "executor/executor.hpp"
#include "executor/models/model.hpp"

using namespace pipetune;

namespace {

std::int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<std::int64_t>(sysconf(_SC_PAGESIZE));
}

double mib(std::int64_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

// Runs `steps` steps; true when, from step 2 on, each device's peaks differ by at most the
// micro-batches' activations (what may be in flight at a peak) and resident memory grew by less
// than 4 MiB after the first 100 steps (the test's criteria).
bool long_run(int steps, int chunks) {
  constexpr std::int64_t kBatch = 32;
  constexpr int kWarmup = 100;
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

  fmt::print("\n{} steps of mlp:layers=4,width=64, batch {}, {}, Adam, cpu:0 and cpu:1\n", steps,
             kBatch, describe_plan(plan));
  fmt::print("{:>6} {:>14} {:>12}\n", "step", "resident MiB", "step ms");
  std::set<std::vector<std::int64_t>> distinct;  // from the second step on
  std::vector<std::int64_t> warm_top(2, 0), late_top(2, 0), low(2, INT64_MAX), high(2, 0);
  std::int64_t warm_resident = 0, late_resident = 0;
  const auto started = std::chrono::steady_clock::now();
  for (int k = 0; k < steps; ++k) {
    auto [input, target] = model.make_batch(kBatch, k, 1000);
    const exec::StepRecord record = pipeline.step(input, target);
    if (k > 0) {
      distinct.insert(record.peak_memory_bytes);
      for (int d = 0; d < 2; ++d) {
        low[d] = std::min(low[d], record.peak_memory_bytes[d]);
        high[d] = std::max(high[d], record.peak_memory_bytes[d]);
      }
    }
    auto& top = k < kWarmup ? warm_top : late_top;
    for (int d = 0; d < 2; ++d) top[d] = std::max(top[d], record.peak_memory_bytes[d]);
    const std::int64_t resident = resident_bytes();
    if (k + 1 == kWarmup) warm_resident = resident;
    if (k + 1 > kWarmup) late_resident = std::max(late_resident, resident);
    if ((k + 1) % 100 == 0 || k == 0) {
      fmt::print("{:>6} {:>14.2f} {:>12.3f}\n", k + 1, mib(resident), record.step_ms);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  fmt::print(
      "resident after step {}: {:.2f} MiB; highest after it: {:.2f} MiB (growth {:+.3f} MiB)\n",
      kWarmup, mib(warm_resident), mib(late_resident), mib(late_resident - warm_resident));
  fmt::print(
      "allocator peaks per device: highest in steps 1-{}: [{}], after: [{}]; {} distinct from step "
      "2 on:",
      kWarmup, fmt::join(warm_top, ", "), fmt::join(late_top, ", "), distinct.size());
  for (const auto& p : distinct) fmt::print(" [{}]", fmt::join(p, ", "));
  fmt::print("\n{:.1f} s in all\n", seconds);
  constexpr std::int64_t kInFlight = kBatch * 64 * sizeof(float);
  return high[0] - low[0] <= kInFlight && high[1] - low[1] <= kInFlight &&
         late_resident - warm_resident < (std::int64_t{4} << 20);
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 1000;
  const bool one = long_run(steps, 1);
  const bool four = long_run(steps, 4);
  return one && four ? 0 : 1;
}
