#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "cli/commands.hpp"
#include "cli/number_flags.hpp"
#include "cli/progress.hpp"
#include "cli/torch_inputs.hpp"
#include "executor/models/out_of_memory.hpp"
#include "executor/placement.hpp"
#include "profiler/profiler.hpp"
#include "sim/error.hpp"
#include "sim/file_io.hpp"
#include "sim/limits.hpp"

namespace pipetune::cli {

namespace {
struct ProfileFlags {
  ModelFlags model;
  std::int64_t batch = 0;
  std::string device = "cpu";
  std::vector<std::int64_t> sizes;
  int repeats = 5;
  int warmup = 2;
  std::string timer = "auto";
  std::string launch_times = "auto";
  int threads = 0;
  int devices = 2;
  int co_runners = -1;  // -1: devices - 1 on a CPU, 0 on a GPU
  int sm_partitions = 0;
  std::uint64_t seed = 0;
  std::string output;
  std::string hardware;
  std::string progress;
  bool no_after_idle = false;
};

// The profile command's flags.
void declare_profile_flags(CLI::App& sub, ProfileFlags& flags) {
  add_model_flags(sub, flags.model);
  sub.add_option("--batch", flags.batch, "the mini-batch you train with")
      ->required()
      ->check(whole_number(1, limits::kMaxBatch));
  sub.add_option("--device", flags.device, "cpu, cuda or cuda:<n> (default cpu)");
  sub.add_option("--micro-batch-sizes", flags.sizes,
                 "sizes to measure (default 1, 2, 4, … and the batch)")
      ->delimiter(',')
      ->type_name("N,...")
      ->check(whole_number(1, limits::kMaxBatch));
  sub.add_option("--repeats", flags.repeats,
                 "timed runs per layer and size; the median is kept (default 5)")
      ->check(whole_number(1, 100000));
  sub.add_option("--warmup", flags.warmup, "untimed runs first (default 2)")
      ->check(whole_number(0, 100000));
  sub.add_option("--timer", flags.timer, "GPU timing: auto, cupti or events (default auto)")
      ->check(CLI::IsMember({"auto", "cupti", "events"}));
  sub.add_option("--launch-times", flags.launch_times,
                 "also time the host's launch of each layer, which sets the pace where kernels are "
                 "small: auto (on a GPU), on or off (default auto)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  sub.add_option(
         "--devices", flags.devices,
         "CPU: the pipeline devices (worker threads) the plans will use; sets the threads measured "
         "with and hardware.json's devices (default 2)")
      ->check(whole_number(1, limits::kMaxDevices));
  sub.add_option("--threads", flags.threads, "CPU intra-op threads (default: cores / devices)")
      ->check(whole_number(0, 4096));
  sub.add_option("--co-runners", flags.co_runners,
                 "CPU: time each layer also beside N threads running it, for the co-run slowdown; "
                 "0: off (default: devices - 1)")
      ->check(whole_number(0, limits::kMaxDevices));
  sub.add_option("--sm-partitions", flags.sm_partitions,
                 "--device cuda: profile on one of K equal shares of the GPU's SMs, the device "
                 "each stage of `pipetune run --sm-partitions K` gets")
      ->check(whole_number(1, 1024))
      ->type_name("K");
  sub.add_option("--seed", flags.seed, "initialisation and data seed")
      ->check(whole_number(0, std::numeric_limits<std::int64_t>::max()));
  sub.add_option("-o,--output", flags.output, "profile.json to write")
      ->required()
      ->type_name("FILE");
  sub.add_option("--progress", flags.progress, "bar (default on a terminal), lines or none")
      ->check(CLI::IsMember({"bar", "lines", "none"}));
  sub.add_flag("--no-after-idle", flags.no_after_idle,
               "CPU: skip timing what a wait costs the next work (about a second)");
  sub.add_option(
         "--hardware", flags.hardware,
         "also measure the devices and links into this hardware.json (with --sm-partitions K: "
         "K shares of the first GPU)")
      ->type_name("FILE");
}

// The profiler's options from the flags.
profiler::ProfileOptions profile_options(const ProfileFlags& flags) {
  profiler::ProfileOptions options;
  options.device = flags.device;
  options.batch_size = flags.batch;
  options.micro_batch_sizes = flags.sizes;
  options.repeats = flags.repeats;
  options.warmup = flags.warmup;
  options.timer = flags.timer;
  options.launch_times = flags.launch_times;
  options.seed = flags.seed;
  options.threads = flags.threads;
  options.sm_partitions = flags.sm_partitions;
  options.after_idle = !flags.no_after_idle;
  if (options.threads == 0 && flags.device == "cpu") {
    // Measure with the threads each CPU device will have when the executor runs the plan.
    options.threads = exec::cpu_threads_per_device(flags.devices);
  }
  options.co_runners = flags.co_runners >= 0   ? flags.co_runners
                       : flags.device == "cpu" ? flags.devices - 1
                                               : 0;
  return options;
}

// The devices and links measured into --hardware.
void probe_and_save_hardware(const ProfileFlags& flags, const Profile& profile) {
  const std::string kind = flags.device.rfind("cuda", 0) == 0 ? "cuda" : "cpu";
  // With --sm-partitions K, the devices a run has: K shares of the first GPU, whose
  // hand-overs stay on that GPU (no link to measure).
  const Hardware hw = flags.sm_partitions > 0
                          ? replicate_device(profile.device, flags.sm_partitions)
                          : profiler::probe_hardware(kind, flags.devices);
  save_hardware(hw, flags.hardware);
  if (hw.link.ideal()) {
    std::printf("wrote %s: %zu devices, ideal links\n", flags.hardware.c_str(), hw.devices.size());
  } else {
    std::printf("wrote %s: %zu devices, link %.3g GB/s, %.3f ms latency\n", flags.hardware.c_str(),
                hw.devices.size(), hw.link.bandwidth_bytes_per_s / 1e9, hw.link.latency_ms);
  }
}

int run_profile_command(const ProfileFlags& flags) {
  check_writable(flags.output, "--output");
  if (!flags.hardware.empty()) check_writable(flags.hardware, "--hardware");
  models::Model model = build_model_from(flags.model, flags.seed);
  models::check_model_batch(model, flags.batch);
  profiler::ProfileOptions options = profile_options(flags);
  // The same choice as run and validate: a bar, "progress DONE TOTAL" lines, or nothing.
  PhaseProgress bar(progress_mode(flags.progress));
  options.progress = [&](std::size_t done, std::size_t total) { bar("profile", done, total); };
  const auto started = std::chrono::steady_clock::now();
  const profiler::ProfileResult result = [&] {
    const models::Activity profiling(
        fmt::format("profiling {} at micro-batches of up to {}", model.name, flags.batch));
    return profiler::profile_model(model, options);
  }();
  bar.finish();
  save_profile(result.profile, flags.output);
  for (const auto& w : result.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf("profiled %zu layers of %s at %zu micro-batch sizes on %s (%s) in %.1f s\n",
              result.profile.layer_count(), model.name.c_str(),
              result.profile.micro_batch_sizes.size(), result.profile.device.type.c_str(),
              result.profile.device.name.c_str(), seconds);
  std::printf("wrote %s\n", flags.output.c_str());
  if (const auto sizes = launch_bound_sizes(result.profile); !sizes.empty()) {
    std::printf(
        "launch-bound at micro-batches of %s: the host's launches take longer than the "
        "device's work there, so the host sets the pace\n",
        fmt::format("{}", fmt::join(sizes, ", ")).c_str());
  }
  if (!flags.hardware.empty()) probe_and_save_hardware(flags, result.profile);
  return 0;
}

}  // namespace

void add_profile_command(CLI::App& app, std::vector<Command>& commands) {
  auto flags = std::make_shared<ProfileFlags>();
  CLI::App* sub = app.add_subcommand(
      "profile",
      "Measure every layer's time and memory at each micro-batch size on the real device");
  declare_profile_flags(*sub, *flags);
  commands.emplace_back(sub, [flags] { return run_profile_command(*flags); });
}

}  // namespace pipetune::cli
