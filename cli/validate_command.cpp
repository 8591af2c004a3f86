#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "cli/commands.hpp"
#include "cli/distributed_runs.hpp"
#include "cli/inputs.hpp"
#include "cli/number_flags.hpp"
#include "cli/progress.hpp"
#include "cli/torch_inputs.hpp"
#include "cli/validate_report.hpp"
#include "executor/optimizer.hpp"
#include "sim/error.hpp"
#include "sim/file_io.hpp"
#include "sim/hardware.hpp"
#include "sim/limits.hpp"

namespace pipetune::cli {

namespace {

struct ValidateFlags {
  ModelFlags model;
  std::int64_t batch = 32;
  std::string device = "cpu";
  int devices = 2;
  std::string profile, hardware;
  std::vector<std::string> plans;
  int top = 3;
  std::vector<int> chunks;
  std::vector<std::string> checkpoints{"all"}, schedules{"all"};
  std::vector<int> stages_per_device{2};
  int steps = 10, warmup = 1, rounds = 2, profiles = 1;
  int calibration_plans = 2, calibration_steps = 4;
  bool recalibrate = false;
  int threads = 0;
  int co_runners = -1;
  std::uint64_t seed = 0;
  std::string optimizer = "sgd";
  double learning_rate = 0.01;
  std::string out = "pipetune-validate";
  std::optional<double> max_time_error, max_memory_error;
  bool require_best = false;
  bool json = false;
  std::string progress;
  bool distributed = false;
  double timeout_s = 300.0;
  int sm_partitions = 0;
};

// The model, the devices and what is already known of them.
void add_input_flags(CLI::App& sub, ValidateFlags& flags) {
  add_model_flags(sub, flags.model);
  sub.add_option("--batch", flags.batch, "samples per mini-batch (default 32)")
      ->check(whole_number(1, limits::kMaxBatch));
  sub.add_option("--device", flags.device, "cpu or cuda (default cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub.add_option("--devices", flags.devices,
                 "pipeline devices: CPU worker threads or CUDA devices (default 2)")
      ->check(whole_number(1, limits::kMaxDevices));
  sub.add_option("--sm-partitions", flags.sm_partitions,
                 "--device cuda: split the GPU's SMs into K equal shares and run device cuda:<n> "
                 "on share n, profiling on one share (as profile and run --sm-partitions)")
      ->check(whole_number(1, 1024))
      ->type_name("K");
  sub.add_option("--profile", flags.profile, "reuse this profile instead of profiling")
      ->type_name("FILE");
  sub.add_option("--hardware", flags.hardware,
                 "reuse these devices and links, and their calibration")
      ->type_name("FILE");
}

// Which plans are validated: given ones, or the planner's best within the allowed choices.
void add_plan_flags(CLI::App& sub, ValidateFlags& flags) {
  auto* plan =
      sub.add_option(
             "--plan", flags.plans,
             "validate these plans (repeat, or comma-separated) instead of the planner's best")
          ->delimiter(',')
          ->type_name("FILE");
  sub.add_option("--top", flags.top, "validate the planner's N best plans (default 3)")
      ->check(whole_number(1, 100))
      ->excludes(plan);
  sub.add_option("--chunks", flags.chunks, "chunk counts the planner may use (default all)")
      ->delimiter(',')
      ->type_name("M,...")
      ->check(whole_number(1, limits::kMaxChunks));
  sub.add_option("--checkpoint", flags.checkpoints,
                 "checkpoint modes the planner may use (default all)")
      ->delimiter(',')
      ->type_name("MODE,...");
  sub.add_option("--schedule", flags.schedules, "schedules the planner may use (default all)")
      ->delimiter(',')
      ->type_name("KIND,...");
  sub.add_option("--stages-per-device", flags.stages_per_device,
                 "stages per device the planner may use with the interleaved and looped "
                 "schedules (default 2; zbv and dualpipev run 2)")
      ->delimiter(',')
      ->type_name("V,...")
      ->check(whole_number(1, kMaxStagesPerDevice));
}

// How each plan is run and measured, calibration runs included.
void add_run_flags(CLI::App& sub, ValidateFlags& flags) {
  sub.add_option("--steps", flags.steps, "measured steps per plan (default 10)")
      ->check(whole_number(1, 1000000));
  sub.add_option("--warmup", flags.warmup, "unmeasured steps per plan and round (default 1)")
      ->check(whole_number(0, 1000000));
  auto* rounds = sub.add_option("--rounds", flags.rounds,
                                "plans take turns this many times, against drift (default 2)")
                     ->check(whole_number(1, 1000));
  sub.add_option("--profiles", flags.profiles,
                 "profile K times, once before each of K rounds of the runs, and predict from "
                 "the profiles pooled: a machine whose pace drifts moves predictions and runs "
                 "alike (default 1)")
      ->check(whole_number(1, 1000))
      ->excludes(rounds)
      ->type_name("K");
  sub.add_option(
         "--calibration-plans", flags.calibration_plans,
         "plans run to fit the calibration, none of them validated; 0: no calibration (default 2)")
      ->check(whole_number(0, 1000));
  sub.add_option("--calibration-steps", flags.calibration_steps,
                 "measured steps per calibration plan (default 4)")
      ->check(whole_number(1, 1000000));
  sub.add_flag("--recalibrate", flags.recalibrate,
               "fit a calibration even when --hardware has one");
  sub.add_option("--threads", flags.threads,
                 "intra-op threads per CPU device (default: cores / devices)")
      ->check(whole_number(0, 4096));
  sub.add_option("--co-runners", flags.co_runners,
                 "CPU: time each layer also beside N threads running it, for the co-run slowdown; "
                 "0: off (default: devices - 1)")
      ->check(whole_number(0, limits::kMaxDevices));
  sub.add_option("--seed", flags.seed, "data, initialisation and dropout seed")
      ->check(whole_number(0, std::numeric_limits<std::int64_t>::max()));
  sub.add_option("--optimizer", flags.optimizer, "sgd, momentum, adam or none (default sgd)")
      ->check(CLI::IsMember({"sgd", "momentum", "adam", "none"}));
  sub.add_option("--lr", flags.learning_rate, "learning rate (default 0.01)")
      ->check(positive_real(1e6));
}

// Where the reports go and what fails the command.
void add_report_flags(CLI::App& sub, ValidateFlags& flags) {
  sub.add_option("--out", flags.out,
                 "folder for the profile, hardware, plans, traces and reports "
                 "(default pipetune-validate)")
      ->type_name("DIR");
  sub.add_option("--max-time-error", flags.max_time_error,
                 "fail (exit 3) when an iteration time is off by more, in %")
      ->check(real_number(0.0, 1e6))
      ->type_name("PERCENT");
  sub.add_option("--max-memory-error", flags.max_memory_error,
                 "fail (exit 3) when a device's peak memory is off by more, in %")
      ->check(real_number(0.0, 1e6))
      ->type_name("PERCENT");
  sub.add_flag(
      "--require-best", flags.require_best,
      "fail (exit 3) unless the predicted-best plan measures best, within the step-to-step spread");
  sub.add_flag("--json", flags.json, "print the JSON report instead of the table");
}

void add_distributed_flags(CLI::App& sub, ValidateFlags& flags) {
  sub.add_flag("--distributed", flags.distributed,
               "run each plan as one process per device (pipetune launch -- run --distributed, "
               "Gloo) and probe the "
               "links between such processes");
  sub.add_option("--timeout", flags.timeout_s,
                 "--distributed: seconds a rank waits for another (default 300)")
      ->check(positive_real(1e6));
}

// The validation loop's options from the flags, plans loaded and choices parsed.
validate::ValidationOptions validation_options(const ValidateFlags& flags) {
  validate::ValidationOptions o;
  o.model_spec = flags.model.spec;
  o.deferred_batch_norm = flags.model.deferred_batch_norm;
  o.run.device = flags.device;
  o.run.batch = flags.batch;
  o.run.steps = flags.steps;
  o.run.warmup = flags.warmup;
  o.run.rounds = flags.rounds;
  o.run.threads = flags.threads;
  o.co_runners = flags.co_runners;
  o.run.seed = flags.seed;
  o.run.optimizer = flags.optimizer;
  o.run.learning_rate = flags.learning_rate;
  o.run.float64 = flags.model.dtype_name == "float64";
  o.devices = flags.devices;
  if (flags.sm_partitions > 0) {
    check_sm_partitions(flags.sm_partitions, flags.device, flags.distributed);
    if (flags.devices > flags.sm_partitions) {
      throw InputError(fmt::format("--devices {}: more than the {} shares of --sm-partitions",
                                   flags.devices, flags.sm_partitions));
    }
    o.run.sm_partitions = flags.sm_partitions;
  }
  o.profile_path = flags.profile;
  o.hardware_path = flags.hardware;
  if (flags.profiles > 1 && !flags.profile.empty()) {
    throw InputError(fmt::format("--profiles {}: profiles taken now, so not with --profile {}",
                                 flags.profiles, flags.profile));
  }
  if (flags.profiles > flags.steps) {
    throw InputError(fmt::format("--steps {}: at least one a profile round (--profiles {})",
                                 flags.steps, flags.profiles));
  }
  o.profile_rounds = flags.profiles;
  // validate measures pipetune's executor: a prediction for torch's runtime would be checked
  // against runs of another runtime, and its restrictions would narrow the plans for nothing.
  if (!flags.hardware.empty() &&
      load_hardware(flags.hardware).runtime == Runtime::TorchPipelining) {
    throw InputError(fmt::format(
        "{}: runtime: \"{}\": validate runs pipetune's executor, so its hardware file must be for "
        "it (no runtime field); check a plan on torch with scripts/torch_pipeline.py --trace and "
        "compare",
        flags.hardware, kTorchPipeliningRuntime));
  }
  for (const auto& path : flags.plans) {
    o.plans.push_back(load_plan(path));
    o.plan_sources.push_back(path);
  }
  o.top = flags.top;
  o.planner.chunks = flags.chunks;
  o.planner.checkpoints = parse_checkpoint_list(flags.checkpoints, "--checkpoint");
  o.planner.schedules = parse_schedule_list(flags.schedules, "--schedule");
  o.planner.stages_per_device =
      parse_stages_per_device_list(flags.stages_per_device, "--stages-per-device");
  o.planner.optimizer_state_factor =
      exec::optimizer_state_factor(exec::parse_optimizer(flags.optimizer));
  for (int c : o.planner.chunks) {
    if (c > flags.batch) {  // at least 1: the flag's own check
      throw InputError(
          fmt::format("--chunks: expected 1 to {} (the batch size), got {}", flags.batch, c));
    }
  }
  o.calibration_plans = flags.calibration_plans;
  o.calibration_steps = flags.calibration_steps;
  o.recalibrate = flags.recalibrate;
  o.out_dir = flags.out;
  return o;
}

// --distributed: each plan runs as one process per device, the links are probed between such
// processes.
void use_distributed_runs(const ValidateFlags& flags, validate::ValidationOptions& o) {
  if (flags.device != "cpu") {
    throw InputError(
        "--distributed: validate runs its ranks on --device cpu only (run --distributed "
        "--device cuda works, over Gloo)");
  }
  DistributedRuns runs;
  runs.model_spec = flags.model.spec;
  runs.dtype = flags.model.dtype_name;
  runs.deferred_batch_norm = flags.model.deferred_batch_norm;
  runs.work_dir = (std::filesystem::path(flags.out) / "ranks").string();
  runs.timeout_s = flags.timeout_s;
  runs.devices = flags.devices;
  o.measure = [runs](const std::vector<Plan>& plans, const validate::RunSettings& settings,
                     const std::function<void(std::size_t, std::size_t)>& report) {
    return measure_plans_distributed(runs, plans, settings, report);
  };
  o.probe = [runs, settings = o.run](int layers) {
    return probe_distributed_links(runs, layers, settings);
  };
}

// Writes report.json and report.md, prints one of them, names the failed thresholds; the exit
// status.
int report_validation(const ValidateFlags& flags, const validate::Validation& v) {
  ValidationThresholds thresholds;
  if (flags.max_time_error) thresholds.time_error = *flags.max_time_error / 100.0;
  if (flags.max_memory_error) thresholds.memory_error = *flags.max_memory_error / 100.0;
  thresholds.require_best = flags.require_best;
  const std::vector<std::string> failures = threshold_failures(v, thresholds);
  const std::string json = validation_json(v, thresholds, failures);
  const std::string out_dir = flags.out;
  write_text_file_atomically((std::filesystem::path(out_dir) / "report.json").string(), json);
  write_text_file_atomically((std::filesystem::path(out_dir) / "report.md").string(),
                             validation_markdown(v));
  if (flags.json) {
    std::fputs(json.c_str(), stdout);
  } else {
    std::fputs(validation_text(v).c_str(), stdout);
    std::printf("report      %s/report.md, %s/report.json (%.1f s)\n", out_dir.c_str(),
                out_dir.c_str(), v.seconds);
  }
  for (const auto& f : failures) std::fprintf(stderr, "pipetune: validate: %s\n", f.c_str());
  return failures.empty() ? 0 : 3;
}

}  // namespace

void add_validate_command(CLI::App& app, std::vector<Command>& commands) {
  auto flags = std::make_shared<ValidateFlags>();
  CLI::App* sub = app.add_subcommand(
      "validate",
      "Profile, plan, predict, run each plan for real and compare: time, memory, tasks, ranking");
  add_input_flags(*sub, *flags);
  add_plan_flags(*sub, *flags);
  add_run_flags(*sub, *flags);
  add_report_flags(*sub, *flags);
  add_distributed_flags(*sub, *flags);
  sub->add_option("--progress", flags->progress, "bar (default on a terminal), lines or none")
      ->check(CLI::IsMember({"bar", "lines", "none"}));

  commands.emplace_back(sub, [flags] {
    validate::ValidationOptions o = validation_options(*flags);
    if (flags->distributed) use_distributed_runs(*flags, o);
    PhaseProgress progress(progress_mode(flags->progress));
    o.progress = [&](const std::string& phase, std::size_t done, std::size_t total) {
      progress(phase, done, total);
    };
    const validate::Validation v = validate::run_validation(o);
    progress.finish();
    return report_validation(*flags, v);
  });
}

}  // namespace pipetune::cli
