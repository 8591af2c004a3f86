#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "cli/commands.hpp"
#include "cli/error_text.hpp"
#include "cli/inputs.hpp"
#include "cli/number_flags.hpp"
#include "cli/progress.hpp"
#include "cli/report.hpp"
#include "cli/torch_inputs.hpp"
#include "distributed/link_probe.hpp"
#include "distributed/process_group.hpp"
#include "executor/device_name.hpp"
#include "executor/device_runtime.hpp"
#include "executor/executor.hpp"
#include "executor/models/shared_tensors.hpp"
#include "executor/placement.hpp"
#include "executor/sm_partitions.hpp"
#include "executor/transport.hpp"
#include "sim/compare.hpp"
#include "sim/error.hpp"
#include "sim/file_io.hpp"
#include "sim/limits.hpp"
#include "sim/profile.hpp"
#include "sim/schedule_csv.hpp"
#include "sim/trace.hpp"
#include "sim/units.hpp"
#include "validate/fit_check.hpp"

namespace pipetune::cli {

namespace {

struct RunFlags {
  ModelFlags model;
  std::string plan;
  std::string schedule_csv;
  std::vector<int> balance;
  std::int64_t batch = 32;
  std::string device = "cpu";
  int steps = 10;
  int warmup = 1;
  std::string trace;
  std::uint64_t seed = 0;
  std::string optimizer = "sgd";
  double learning_rate = 0.01;
  int threads = 0;
  std::string progress;
  bool json = false;
  std::string profile, hardware, memory;  // for the check that the plan fits
  bool force = false;
  bool distributed = false;
  double timeout_s = 300.0;
  std::string links_out;
  int sm_partitions = 0;
};

// The distributed run's connection, held here so that it outlives run_plan's locals on the
// failure path.
std::shared_ptr<exec::Transport> connected_transport;

// Ctrl-C asks the running pipeline to stop after its current tasks.
std::atomic<exec::Pipeline*> running_pipeline{nullptr};
void on_interrupt(int) {
  if (auto* p = running_pipeline.load()) p->request_stop();
}

}  // namespace

int run_plan(const std::shared_ptr<RunFlags>& flags);

// The run command's flags.
void declare_run_flags(CLI::App& sub, RunFlags& flags) {
  add_model_flags(sub, flags.model);
  sub.add_option("--plan", flags.plan, "plan.json (from pipetune plan)")->type_name("FILE");
  sub.add_option("--schedule-csv", flags.schedule_csv,
                 "run torch's compute-only schedule CSV instead of the plan's schedule: row r "
                 "is device r; --balance (or the plan's) gives the layers of each stage")
      ->type_name("FILE");
  sub.add_option("--balance", flags.balance, "layers per stage, e.g. 3,3,2 (overrides the plan's)")
      ->delimiter(',')
      ->type_name("N,N,...")
      ->check(whole_number_from(0));
  sub.add_option("--batch", flags.batch, "samples per mini-batch (default 32)")
      ->check(whole_number(1, limits::kMaxBatch));
  sub.add_option("--device", flags.device, "cpu or cuda (default cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub.add_option("--steps", flags.steps, "training steps measured (default 10)")
      ->check(whole_number(1, 1000000));
  sub.add_option("--warmup", flags.warmup, "steps run first and not measured (default 1)")
      ->check(whole_number(0, 1000000));
  sub.add_option("--trace", flags.trace, "write the measured timeline of the median step")
      ->type_name("OUT.json");
  sub.add_option("--seed", flags.seed,
                 "data, initialisation and dropout seed: the same seed, the same run")
      ->check(whole_number(0, std::numeric_limits<std::int64_t>::max()));
  sub.add_option("--optimizer", flags.optimizer, "sgd, momentum, adam or none (default sgd)")
      ->check(CLI::IsMember({"sgd", "momentum", "adam", "none"}));
  sub.add_option("--lr", flags.learning_rate, "learning rate (default 0.01)")
      ->check(positive_real(1e6));
  sub.add_option("--threads", flags.threads,
                 "intra-op threads per CPU device (default: cores / devices)")
      ->check(whole_number(0, 4096));
  sub.add_option("--progress", flags.progress, "bar (default on a terminal), lines or none")
      ->check(CLI::IsMember({"bar", "lines", "none"}));
  sub.add_flag("--json", flags.json, "print one JSON object instead of the report");
  sub.add_option("--profile", flags.profile,
                 "profile.json of the model, to check that the plan fits (default: a quick one)")
      ->type_name("FILE");
  sub.add_option("--hardware", flags.hardware, "the devices' memory, to check that the plan fits")
      ->type_name("FILE");
  sub.add_option("--memory", flags.memory,
                 "memory per device, to check that the plan fits, e.g. 16GiB");
  sub.add_flag("--force", flags.force, "run a plan predicted not to fit anyway");
  sub.add_flag(
      "--distributed", flags.distributed,
      "one process per device: rank i runs the plan's device i (RANK, WORLD_SIZE, MASTER_ADDR, "
      "MASTER_PORT "
      "from pipetune launch, torchrun or srun); rank 0 reports and writes the merged trace");
  sub.add_option("--timeout", flags.timeout_s,
                 "--distributed: seconds a rank waits for another (to meet, to send) before it "
                 "gives up (default 300)")
      ->check(positive_real(1e6));
  sub.add_option(
         "--links-out", flags.links_out,
         "--distributed: measure the links between the ranks first and write them as hardware.json")
      ->type_name("OUT.json");

  sub.add_option("--sm-partitions", flags.sm_partitions,
                 "--device cuda: split the GPU's SMs into K equal shares (CUDA green contexts) "
                 "and run device cuda:<n> on share n, so K stages really run at once")
      ->check(whole_number(1, 1024))
      ->type_name("K");
}

// One rank of a distributed run. A rank that fails says which rank it is and leaves at once:
// threads blocked on a peer must not hold it up, and its closed connections are how the other
// ranks learn of it.
int run_as_rank(const std::shared_ptr<RunFlags>& flags) {
  const char* rank = std::getenv("RANK");
  try {
    const int status = run_plan(flags);
    connected_transport.reset();
    return status;
  } catch (const std::exception& e) {
    const auto* input_error = dynamic_cast<const InputError*>(&e);
    std::fprintf(stderr, "pipetune: error: rank %s: %s\n", rank ? rank : "?",
                 input_error ? error_text(*input_error).c_str() : e.what());
    std::fflush(stdout);
    std::fflush(stderr);
    if (connected_transport) connected_transport->leave_after_failure();
    std::_Exit(input_error ? 2 : 1);
  }
}

void add_run_command(CLI::App& app, std::vector<Command>& commands) {
  auto flags = std::make_shared<RunFlags>();
  CLI::App* sub = app.add_subcommand(
      "run", "Train with a plan on the real GPipe executor and record the measured timeline");
  declare_run_flags(*sub, *flags);
  commands.emplace_back(
      sub, [flags] { return flags->distributed ? run_as_rank(flags) : run_plan(flags); });
}

namespace {

// What to call the plan in messages: its file, or the command line's flags.
std::string plan_source(const RunFlags& flags) {
  return flags.plan.empty() ? std::string("command line") : flags.plan;
}

// --plan with --balance over its balance; with --schedule-csv the CSV's programmes, one device
// each unless the plan names devices, and its micro-batch count unless the plan gives chunks.
Plan resolve_run_plan(const RunFlags& flags, std::optional<Schedule>& given) {
  if (flags.plan.empty() && (flags.schedule_csv.empty() || flags.balance.empty())) {
    throw InputError(
        "no plan: give --plan FILE, or --schedule-csv FILE with --balance N,N,... (layers per "
        "stage)");
  }
  Plan plan;
  if (!flags.plan.empty()) plan = load_plan(flags.plan);
  if (!flags.balance.empty()) plan.balance = flags.balance;
  if (flags.schedule_csv.empty()) return plan;
  given = load_schedule_csv(flags.schedule_csv);
  if (flags.plan.empty()) plan.chunks = given->micro_batches;
  std::vector<std::string> names;
  for (int r = 0; r < given->ranks(); ++r) names.push_back(fmt::format("{}:{}", flags.device, r));
  use_schedule_csv(*given, flags.schedule_csv, names, plan);
  return plan;
}

// The devices, threads and runtime options the plan runs with; for a distributed run also the
// launcher's environment, checked against the plan before any work, on every rank alike.
exec::ExecutorOptions executor_options(const RunFlags& flags, const Plan& plan,
                                       distributed::LaunchEnvironment& launch) {
  exec::ExecutorOptions options;
  if (flags.sm_partitions > 0) {
    check_sm_partitions(flags.sm_partitions, flags.device, flags.distributed);
    const exec::SmPartitions& shares = exec::sm_partitions(0, flags.sm_partitions);
    std::fprintf(stderr, "note: cuda:0 to cuda:%d are %d shares of the GPU's %d SMs (%d each)\n",
                 flags.sm_partitions - 1, flags.sm_partitions, shares.device_sms,
                 shares.sms.front());
    options.sm_partitions = flags.sm_partitions;
  }
  options.devices =
      exec::executor_devices(plan, flags.device, flags.sm_partitions, flags.distributed);
  options.threads_per_cpu_device = flags.threads;
  if (flags.distributed) {
    launch = distributed::read_launch_environment();
    if (static_cast<int>(options.devices.size()) != launch.world_size) {
      throw InputError(fmt::format(
          "{}: the plan has {} devices ({}) but WORLD_SIZE is {}: --distributed runs one "
          "process per device",
          plan_source(flags), options.devices.size(), fmt::join(options.devices, ", "),
          launch.world_size));
    }
    if (flags.device == "cuda" && launch.rank == 0) {
      // Gloo carries host memory: each sent tensor goes through it (no NCCL yet).
      const int gpus = exec::cuda_device_count();
      std::fprintf(stderr,
                   "note: %d ranks on %d GPU%s over Gloo, tensors staged through host memory%s\n",
                   launch.world_size, gpus, gpus == 1 ? "" : "s",
                   launch.world_size > gpus ? "; device cuda:k runs on GPU k mod the GPUs" : "");
    }
    if (flags.threads == 0) {
      // The ranks on this machine share its cores.
      options.threads_per_cpu_device = exec::cpu_threads_per_device(launch.local_world_size);
    }
  } else if (!flags.links_out.empty()) {
    throw InputError(
        "--links-out: only with --distributed (pipetune profile --hardware-out probes one "
        "process)");
  }
  return options;
}

// A profile timed at another intra-op thread count than this run's predicts another run, and
// nothing else would say so: a layer's time at two threads is not its time at one.
void note_thread_count(const RunFlags& flags, const exec::ExecutorOptions& options) {
  if (flags.profile.empty() || flags.device != "cpu") return;
  const auto meta = nlohmann::json::parse(load_profile(flags.profile).meta_json, nullptr, false);
  if (!meta.is_object() || !meta.contains("threads") || !meta["threads"].is_number_integer())
    return;
  const int profiled = meta["threads"].get<int>();
  // One device a process when distributed, as the pipeline counts them.
  const int threads =
      exec::resolved_cpu_threads(options.threads_per_cpu_device,
                                 flags.distributed ? 1 : static_cast<int>(options.devices.size()));
  if (profiled == threads) return;
  std::fprintf(stderr,
               "note: %s was timed at %d intra-op thread%s a device and this run uses %d: its "
               "times are not this run's (--threads %d runs as it was timed)\n",
               flags.profile.c_str(), profiled, profiled == 1 ? "" : "s", threads, profiled);
}

// A plan predicted not to fit is refused now, not by an out-of-memory error mid-step.
void refuse_misfit(const RunFlags& flags, const Plan& plan, const exec::ExecutorOptions& options,
                   const distributed::LaunchEnvironment& launch) {
  validate::FitCheck fit;
  fit.plan_source = plan_source(flags);
  fit.schedule = options.schedule;
  fit.profile_path = flags.profile;
  fit.hardware_path = flags.hardware;
  if (!flags.memory.empty()) {
    fit.memory_bytes = parse_memory(flags.memory, "--memory");
    if (fit.memory_bytes == 0) {  // no device has none
      throw InputError(
          fmt::format("--memory: expected a size such as 16GiB, got \"{}\"", flags.memory));
    }
  }
  fit.device_kind = flags.device;
  fit.devices = options.devices;
  fit.sm_partitions = options.sm_partitions;
  // Ranks on one machine put device cuda:k on GPU k mod its GPUs. Across machines, or where
  // CUDA_VISIBLE_DEVICES may give each rank a GPU of its own (as srun does), which ranks share a
  // GPU is not known here, so each rank's device is checked alone.
  if (flags.distributed && flags.device == "cuda" && launch.local_world_size == launch.world_size &&
      !std::getenv("CUDA_VISIBLE_DEVICES"))
    fit.rank_gpus = exec::cuda_device_count();
  if (flags.device == "cuda" && !flags.distributed) {
    // A GPU's memory less what its CUDA context and other processes hold: a plan between the
    // two is warned of, not refused (the caching allocator's own overhead is not predicted).
    // Shares of `--sm-partitions` are all on the first GPU. (A distributed rank would see only
    // the contexts of the ranks already started.)
    fit.free_bytes = [shares = options.sm_partitions > 0](const std::string& device) {
      const auto parsed = exec::try_parse_device_name(device);
      if (!parsed || parsed->kind != exec::DeviceKind::Cuda) return std::int64_t{0};
      return exec::cuda_free_bytes(!shares && parsed->has_index ? parsed->index : 0);
    };
  }
  fit.batch = flags.batch;
  fit.optimizer_state_factor = exec::optimizer_state_factor(options.optimizer);
  auto misfits =
      validate::predict_misfits(fit, exec::with_executor_devices(plan, options.devices),
                                [&] { return build_model_from(flags.model, flags.seed); });
  std::vector<validate::DoesNotFit> tight;
  std::erase_if(misfits, [&](const validate::DoesNotFit& m) {
    if (m.free_now) tight.push_back(m);
    return m.free_now;
  });
  if (!misfits.empty()) {
    const std::string what = validate::misfit_message(plan_source(flags), misfits);
    if (!flags.force) throw WorkError(what + " (--force runs it anyway)");
    std::fprintf(stderr, "warning: %s; running it anyway (--force)\n", what.c_str());
  }
  if (!tight.empty()) {
    std::fprintf(stderr, "warning: %s\n",
                 validate::misfit_message(plan_source(flags), tight).c_str());
  }
}

// What each rank's clock alignment measured, gathered on rank 0 for the report.
struct RankClocks {
  std::vector<double> offsets_ms, round_trips_ms;
};

// Joins the ranks, gathers their clocks and, with --links-out, measures the links between them.
RankClocks connect_ranks(const RunFlags& flags, const distributed::LaunchEnvironment& launch,
                         exec::ExecutorOptions& options, bool reports) {
  RankClocks clocks;
  options.transport = distributed::connect(launch, flags.timeout_s);
  connected_transport = options.transport;
  // Each part is "offset round_trip".
  const auto parts =
      options.transport->gather("clocks", fmt::format("{} {}", options.transport->clock_offset_ms(),
                                                      options.transport->clock_round_trip_ms()));
  for (const auto& part : parts) {
    std::istringstream in(part);
    double offset = 0.0, round_trip = 0.0;
    in >> offset >> round_trip;
    clocks.offsets_ms.push_back(offset);
    clocks.round_trips_ms.push_back(round_trip);
  }
  if (!flags.links_out.empty()) {
    const Hardware links = distributed::probe_process_links(*options.transport, options.devices);
    if (reports) save_hardware(links, flags.links_out);
  }
  return clocks;
}

struct MeasuredSteps {
  std::vector<exec::StepRecord> records;  ///< after the warm-up
  bool interrupted = false;               ///< Ctrl-C stopped the run
};

// Warm-up and measured steps, with progress on stderr; Ctrl-C stops after the current tasks.
MeasuredSteps run_steps(const RunFlags& flags, models::Model& model, exec::Pipeline& pipeline,
                        const std::string& progress) {
  MeasuredSteps steps;
  ProgressBar bar("steps");
  running_pipeline = &pipeline;
  auto previous = std::signal(SIGINT, on_interrupt);
  const int total = flags.warmup + flags.steps;
  try {
    for (int k = 0; k < total; ++k) {
      auto [input, target] = model.make_batch(flags.batch, k, flags.seed);
      exec::StepRecord record = pipeline.step(input, target);
      if (k >= flags.warmup) steps.records.push_back(std::move(record));
      if (progress == "lines") {
        std::fprintf(stderr, "progress %d %d\n", k + 1, total);
      } else if (progress == "bar") {
        const double rate = steps.records.empty() ? 0.0 : 1e3 / steps.records.back().step_ms;
        bar.update(static_cast<std::size_t>(k + 1), static_cast<std::size_t>(total),
                   fmt::format("{:.1f} steps/s", rate));
      }
    }
  } catch (const exec::Interrupted&) {
    steps.interrupted = true;
  }
  std::signal(SIGINT, previous);
  running_pipeline = nullptr;
  bar.finish();
  return steps;
}

// The measured steps' series, each device's peak over them, and the step the trace shows.
struct StepSummary {
  std::vector<double> pipeline_ms, step_ms, losses;
  /// Per step, where the compute threads' CPU time was measured (one intra-op thread per CPU
  /// device): the share of their tasks' time they ran (cpu_share in sim/trace.hpp).
  std::vector<double> cpu_share;
  std::vector<std::int64_t> peaks, library;  ///< per device, the largest over the steps
  const exec::StepRecord* shown = nullptr;   ///< the median step; none without a step
};

StepSummary summarize(const std::vector<exec::StepRecord>& steps, std::size_t devices) {
  StepSummary summary;
  summary.peaks.assign(devices, 0);
  summary.library.assign(devices, 0);
  for (const auto& s : steps) {
    summary.pipeline_ms.push_back(s.pipeline_ms);
    summary.step_ms.push_back(s.step_ms);
    summary.losses.push_back(s.loss);
    if (const double share = cpu_share(s.tasks); share >= 0) summary.cpu_share.push_back(share);
    for (std::size_t d = 0; d < devices; ++d) {
      summary.peaks[d] = std::max(summary.peaks[d], s.peak_memory_bytes[d]);
      summary.library[d] = std::max(summary.library[d], s.library_memory_bytes[d]);
    }
  }
  if (!steps.empty()) summary.shown = &steps[median_step(summary.pipeline_ms)];
  return summary;
}

void print_run_json(const RunFlags& flags, const StepSummary& summary,
                    const exec::Pipeline& pipeline, const RankClocks& clocks) {
  nlohmann::ordered_json out;
  out["losses"] = summary.losses;
  out["step_ms"] = summary.step_ms;
  out["pipeline_ms"] = summary.pipeline_ms;
  if (!summary.cpu_share.empty()) out["cpu_share"] = summary.cpu_share;
  out["peak_memory_bytes"] = summary.peaks;
  // Part of the peaks: cuBLAS workspaces and the like.
  out["library_memory_bytes"] = summary.library;
  // The peaks of the step the trace shows (validate compares them in that step's own order).
  if (summary.shown) out["shown_step_peak_bytes"] = summary.shown->peak_memory_bytes;
  out["devices"] = pipeline.device_names();
  if (flags.distributed) {
    out["clock_offset_ms"] = clocks.offsets_ms;
    out["clock_round_trip_ms"] = clocks.round_trips_ms;
  }
  std::fputs((out.dump() + "\n").c_str(), stdout);
}

void print_rank_clocks(const distributed::LaunchEnvironment& launch, const RankClocks& clocks) {
  std::printf("ranks     %d processes (rank i runs device i), Gloo; clocks aligned on rank 0's\n",
              launch.world_size);
  std::vector<std::string> text;
  for (std::size_t r = 1; r < clocks.offsets_ms.size(); ++r) {
    text.push_back(fmt::format("rank {} {:+.3f} ms (round trip {:.3f} ms)", r, clocks.offsets_ms[r],
                               clocks.round_trips_ms[r]));
  }
  if (!text.empty())
    std::printf("clocks    %s\n", fmt::format("{}", fmt::join(text, ", ")).c_str());
}

void print_run_text(const RunFlags& flags, const Plan& plan, const models::Model& model,
                    const exec::Pipeline& pipeline, const std::vector<exec::StepRecord>& steps,
                    const StepSummary& summary, const distributed::LaunchEnvironment& launch,
                    const RankClocks& clocks) {
  std::printf("model     %s (%s), batch %lld\n", model.name.c_str(), model.spec.c_str(),
              static_cast<long long>(flags.batch));
  const std::string schedule =
      flags.schedule_csv.empty()
          ? describe_plan(plan)
          : fmt::format("{} x{} {}", format_balance(plan.balance), plan.chunks, flags.schedule_csv);
  std::printf("plan      %s on %s\n", schedule.c_str(),
              fmt::format("{}", fmt::join(pipeline.device_names(), ", ")).c_str());
  if (flags.distributed) print_rank_clocks(launch, clocks);
  if (!flags.links_out.empty())
    std::printf("links     %s (measured between the ranks)\n", flags.links_out.c_str());
  for (std::size_t k = 0; k < steps.size(); ++k) {
    std::printf("step %3zu  loss %.4f  step %s ms  pipeline %s ms\n", k + 1, steps[k].loss,
                format_ms(steps[k].step_ms).c_str(), format_ms(steps[k].pipeline_ms).c_str());
  }
  if (!steps.empty()) {
    std::printf("median    pipeline %s ms, step %s ms, %.1f samples/s\n",
                format_ms(median(summary.pipeline_ms)).c_str(),
                format_ms(median(summary.step_ms)).c_str(),
                static_cast<double>(flags.batch) / (median(summary.step_ms) / 1e3));
    if (!summary.cpu_share.empty()) {
      std::printf(
          "cores     the compute threads ran %.0f %% of their tasks' time (median step); "
          "the rest they waited for a core\n",
          100.0 * median(summary.cpu_share));
    }
    std::vector<std::string> peak_text;
    for (std::size_t d = 0; d < summary.peaks.size(); ++d) {
      peak_text.push_back(
          fmt::format("{} {}", pipeline.device_names()[d], format_bytes(summary.peaks[d])));
    }
    std::printf("peak      %s\n", fmt::format("{}", fmt::join(peak_text, ", ")).c_str());
  }
  if (!flags.trace.empty() && summary.shown) {
    std::printf("trace     %s (step %d, the median)\n", flags.trace.c_str(),
                summary.shown->step + 1 - flags.warmup);
  }
}

}  // namespace

int run_plan(const std::shared_ptr<RunFlags>& flags) {
  std::optional<Schedule> given;
  const Plan plan = resolve_run_plan(*flags, given);
  distributed::LaunchEnvironment launch;
  exec::ExecutorOptions options = executor_options(*flags, plan, launch);
  options.schedule = std::move(given);
  const bool reports = !flags->distributed || launch.rank == 0;
  // A file that cannot be written is known now, not after the run.
  if (reports && !flags->trace.empty()) check_writable(flags->trace, "--trace");
  if (reports && !flags->links_out.empty()) check_writable(flags->links_out, "--links-out");
  models::Model model = build_model_from(flags->model, flags->seed);
  models::check_model_batch(model, flags->batch);
  const std::int64_t smallest = split_batch(flags->batch, plan.chunks).back();
  models::check_trains_on(
      model, smallest,
      fmt::format("{}: chunks: {} split the batch of {} into micro-batches of {}",
                  plan_source(*flags), plan.chunks, flags->batch, smallest));
  models::check_tied_split(model, plan.balance, plan_source(*flags));
  options.seed = flags->seed;
  options.learning_rate = flags->learning_rate;
  options.optimizer = exec::parse_optimizer(flags->optimizer);
  refuse_misfit(*flags, plan, options, launch);
  if (reports) note_thread_count(*flags, options);
  RankClocks clocks;
  if (flags->distributed) clocks = connect_ranks(*flags, launch, options, reports);
  exec::Pipeline pipeline(model, exec::with_executor_devices(plan, options.devices), flags->batch,
                          options);

  const std::string progress = reports ? progress_mode(flags->progress) : std::string("none");
  const MeasuredSteps steps = run_steps(*flags, model, pipeline, progress);
  const StepSummary summary = summarize(steps.records, pipeline.device_names().size());
  if (!reports) return steps.interrupted ? 130 : 0;  // rank 0 speaks for the run
  if (!flags->trace.empty() && summary.shown) {
    save_trace(exec::measured_trace(pipeline, *summary.shown, model.name), flags->trace);
  }
  if (flags->json) {
    print_run_json(*flags, summary, pipeline, clocks);
  } else {
    print_run_text(*flags, plan, model, pipeline, steps.records, summary, launch, clocks);
  }
  if (steps.interrupted) {
    std::fprintf(stderr, "pipetune: interrupted after %zu measured steps%s\n", steps.records.size(),
                 !flags->trace.empty() && summary.shown ? "; the trace of those was written" : "");
    return 130;
  }
  return 0;
}

}  // namespace pipetune::cli
