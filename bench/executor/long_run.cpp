// A long run on CPU, as `pipetune run` takes it (a fresh batch each step, Adam, two CPU
// devices): the process's resident memory every 100 steps and each device's allocator peak.
// tests/executor/long_run_test.cpp asserts the same at CI size; docs/reliability.md records
// what this prints for 1,000 steps.
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

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 1000;
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

  fmt::print("{} steps of mlp:layers=4,width=64, batch {}, {}, Adam, cpu:0 and cpu:1\n", steps,
             kBatch, describe_plan(plan));
  fmt::print("{:>6} {:>14} {:>12}\n", "step", "resident MiB", "step ms");
  std::set<std::vector<std::int64_t>> peaks;  // from the second step on
  std::int64_t at_100 = 0, highest = 0;
  const auto started = std::chrono::steady_clock::now();
  for (int k = 0; k < steps; ++k) {
    auto [input, target] = model.make_batch(kBatch, 1000 + static_cast<std::uint64_t>(k));
    const exec::StepRecord record = pipeline.step(input, target);
    if (k > 0) peaks.insert(record.peak_memory_bytes);
    const std::int64_t resident = resident_bytes();
    if (k + 1 == 100) at_100 = resident;
    if (k + 1 > 100) highest = std::max(highest, resident);
    if ((k + 1) % 100 == 0 || k == 0) {
      fmt::print("{:>6} {:>14.2f} {:>12.3f}\n", k + 1, mib(resident), record.step_ms);
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  fmt::print("resident after step 100: {:.2f} MiB; highest after it: {:.2f} MiB (growth {:+.2f} MiB)\n",
             mib(at_100), mib(highest), mib(highest - at_100));
  fmt::print("distinct per-device allocator peaks from step 2 on: {}", peaks.size());
  for (const auto& p : peaks) fmt::print(" [{}]", fmt::join(p, ", "));
  fmt::print("\n{:.1f} s in all\n", seconds);
  return peaks.size() == 1 ? 0 : 1;
}
