// Does the executor add stalls of its own? For each configuration, every measured step's
// tasks (compute and copies, with their measured durations) are replayed on the simulator's
// event engine, which starts each task the moment its dependencies allow. The executor's
// overhead is measured pipeline time over replayed time (target: within 5 %).
//
//   build/bench/executor/pipetune_executor_bench [--device cpu|cuda] [steps]
//
// On CPU each stage has its own worker thread (cpu:0, cpu:1). On CUDA every stage goes to
// cuda:0 (what one GPU allows): one stream runs them one after another, so the replay measures
// the gaps the executor leaves between its launches.

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "executor/executor.hpp"
#include "sim/replay.hpp"

using namespace pipetune;

namespace {

struct Config {
  const char* model;
  std::vector<int> balance;
  int chunks;
  CheckpointMode checkpoint;
  ScheduleKind schedule;
  std::int64_t batch;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "cpu";
  int steps = 20;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--device" && a + 1 < argc) {
      device = argv[++a];
    } else if (std::atoi(arg.c_str()) > 0) {
      steps = std::atoi(arg.c_str());
    } else {
      fmt::print(stderr, "usage: {} [--device cpu|cuda] [steps]\n", argv[0]);
      return 2;
    }
  }
  if (device != "cpu" && device != "cuda") {
    fmt::print(stderr, "--device: expected cpu or cuda, got {}\n", device);
    return 2;
  }
  const bool cuda = device == "cuda";
  // On a GPU, sizes that keep it busy; on the CPU, sizes that finish in seconds.
  const std::vector<Config> configs =
      cuda ? std::vector<Config>{
                 {"mlp:layers=8,width=4096", {5, 4}, 8, CheckpointMode::Never, ScheduleKind::GPipe, 512},
                 {"mlp:layers=8,width=4096", {5, 4}, 8, CheckpointMode::ExceptLast, ScheduleKind::OneFOneB, 512},
                 {"gpt:layers=8,width=1024,heads=16,seq=256,vocab=8192", {5, 5}, 4, CheckpointMode::Always,
                  ScheduleKind::GPipe, 16},
                 {"resnet:blocks=6,channels=64,image=112", {4, 4}, 4, CheckpointMode::Never, ScheduleKind::OneFOneB,
                  32},
             }
           : std::vector<Config>{
                 {"mlp:layers=8,width=512", {5, 4}, 8, CheckpointMode::Never, ScheduleKind::GPipe, 64},
                 {"mlp:layers=8,width=512", {5, 4}, 8, CheckpointMode::ExceptLast, ScheduleKind::OneFOneB, 64},
                 {"gpt:layers=4,width=128,seq=64,vocab=512", {3, 3}, 4, CheckpointMode::Always, ScheduleKind::GPipe,
                  16},
                 {"resnet:blocks=4,channels=32,image=32", {3, 3}, 4, CheckpointMode::Never, ScheduleKind::OneFOneB,
                  32},
             };
  fmt::print("device {}, {} measured steps per configuration\n", device, steps);
  fmt::print("{:<42} {:<26} {:>12} {:>12} {:>9}\n", "model", "plan", "measured ms", "replayed ms",
             "overhead");
  for (const auto& c : configs) {
    models::Model model = models::build_model(c.model);
    Plan plan;
    plan.balance = c.balance;
    plan.chunks = c.chunks;
    plan.checkpoint = c.checkpoint;
    plan.schedule = c.schedule;
    exec::ExecutorOptions options;
    if (cuda) {
      options.devices = {"cuda:0"};
      plan.devices.assign(plan.balance.size(), "cuda:0");
    } else {
      options.devices = {"cpu:0", "cpu:1"};
      options.threads_per_cpu_device = 1;
    }
    options.record_memory_history = false;
    exec::Pipeline pipeline(model, plan, c.batch, options);
    std::vector<double> measured, replayed;
    for (int k = 0; k < steps + 2; ++k) {
      auto [x, y] = model.make_batch(c.batch, k, 0);
      const auto record = pipeline.step(x, y);
      if (k < 2) continue;  // warm-up
      const Trace trace = exec::measured_trace(pipeline, record, model.name);
      measured.push_back(record.pipeline_ms);
      replayed.push_back(replay_trace(trace, "measured").iteration_ms);
    }
    const double m = median(measured), r = median(replayed);
    fmt::print("{:<42} {:<26} {:>12.3f} {:>12.3f} {:>8.2f}%\n", c.model, describe_plan(plan), m, r,
               100.0 * (m / r - 1.0));
  }
}
