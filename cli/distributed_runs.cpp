#include "cli/distributed_runs.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "executor/placement.hpp"
#include "launch/launch.hpp"
#include "sim/error.hpp"
#include "sim/file_io.hpp"
#include "sim/replay.hpp"
#include "sim/trace.hpp"

namespace pipetune::cli {

namespace {

namespace fs = std::filesystem;

// Runs argv with stdout captured; stderr stays the user's, so a rank's error shows as it is.
std::pair<int, std::string> run_capturing_stdout(const std::vector<std::string>& argv) {
  int out[2];
  if (pipe(out) != 0) throw WorkError("pipe failed");
  const pid_t pid = fork();
  if (pid < 0) throw WorkError("fork failed");
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  std::string text;
  char buffer[65536];
  for (;;) {
    const ssize_t n = read(out[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
  }
  close(out[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), text};
}

// `pipetune launch -n K -- run --distributed` with the model and settings given.
std::vector<std::string> launch_run(const DistributedRuns& runs, int ranks,
                                    const std::string& plan_path,
                                    const validate::RunSettings& settings) {
  std::vector<std::string> argv{launcher::own_executable(),
                                "launch",
                                "-n",
                                std::to_string(ranks),
                                "--timeout",
                                fmt::format("{}", runs.timeout_s),
                                "--",
                                "run",
                                "--distributed",
                                "--timeout",
                                fmt::format("{}", runs.timeout_s),
                                "--model",
                                runs.model_spec,
                                "--dtype",
                                runs.dtype,
                                "--plan",
                                plan_path,
                                "--batch",
                                std::to_string(settings.batch),
                                "--seed",
                                std::to_string(settings.seed),
                                "--optimizer",
                                settings.optimizer,
                                "--lr",
                                fmt::format("{}", settings.learning_rate),
                                "--progress",
                                "none",
                                "--force"};  // validate checked the fit with its own hardware
  if (settings.threads > 0)
    argv.insert(argv.end(), {"--threads", std::to_string(settings.threads)});
  if (runs.deferred_batch_norm) argv.push_back("--deferred-batch-norm");
  return argv;
}

}  // namespace

std::vector<validate::MeasuredRun> measure_plans_distributed(
    const DistributedRuns& runs, const std::vector<Plan>& plans,
    const validate::RunSettings& settings,
    const std::function<void(std::size_t, std::size_t)>& progress) {
  fs::create_directories(runs.work_dir);
  std::vector<validate::MeasuredRun> measured;
  const std::size_t per_plan = static_cast<std::size_t>(settings.warmup + settings.steps);
  for (std::size_t p = 0; p < plans.size(); ++p) {
    const std::string stem =
        (fs::path(runs.work_dir) / fmt::format("launch-{}", ++*runs.launches)).string();
    save_plan(plans[p], stem + ".plan.json");
    std::vector<std::string> argv =
        launch_run(runs, static_cast<int>(exec::executor_devices(plans[p], "cpu").size()),
                   stem + ".plan.json", settings);
    argv.insert(argv.end(),
                {"--steps", std::to_string(settings.steps), "--warmup",
                 std::to_string(settings.warmup), "--json", "--trace", stem + ".trace.json"});
    const auto [status, out] = run_capturing_stdout(argv);
    if (status != 0) {
      throw WorkError(
          fmt::format("plan {} ({}): its ranks failed (exit {}; their messages are above)", p + 1,
                      describe_plan(plans[p]), status));
    }
    validate::MeasuredRun run;
    run.plan = plans[p];
    try {
      const auto j = nlohmann::json::parse(out);
      run.pipeline_ms = j.at("pipeline_ms").get<std::vector<double>>();
      run.step_ms = j.at("step_ms").get<std::vector<double>>();
      run.losses = j.at("losses").get<std::vector<double>>();
      run.peak_memory_bytes = j.at("peak_memory_bytes").get<std::vector<std::int64_t>>();
      if (j.contains("cpu_share")) run.cpu_share = j.at("cpu_share").get<std::vector<double>>();
      if (j.contains("shown_step_peak_bytes"))
        run.traced_step_peak_bytes = j.at("shown_step_peak_bytes").get<std::vector<std::int64_t>>();
    } catch (const nlohmann::json::exception& e) {
      throw WorkError(
          fmt::format("plan {}: rank 0's report is not the JSON expected: {}", p + 1, e.what()));
    }
    run.trace = load_trace(stem + ".trace.json");
    // Only the traced step comes back as a trace: its replay at the threads' CPU times stands
    // for every step's.
    if (const double on_cpu = replay_on_cpu_ms(run.trace, stem + ".trace.json"); on_cpu >= 0)
      run.on_cpu_ms.push_back(on_cpu);
    for (std::size_t d = 0; d < run.trace.devices.size() && d < run.peak_memory_bytes.size(); ++d) {
      run.trace.devices[d].peak_memory_bytes = run.peak_memory_bytes[d];
    }
    measured.push_back(std::move(run));
    if (progress) progress((p + 1) * per_plan, plans.size() * per_plan);
  }
  return measured;
}

Hardware probe_distributed_links(const DistributedRuns& runs, int layers,
                                 const validate::RunSettings& settings) {
  if (layers < runs.devices) {
    throw InputError(
        fmt::format("--devices: {} processes but the model has {} layers", runs.devices, layers));
  }
  fs::create_directories(runs.work_dir);
  Plan plan;
  for (int d = 0; d < runs.devices; ++d)
    plan.balance.push_back(layers / runs.devices + (d < layers % runs.devices));
  plan.chunks = 1;
  const std::string stem = (fs::path(runs.work_dir) / "links").string();
  save_plan(plan, stem + ".plan.json");
  std::vector<std::string> argv = launch_run(runs, runs.devices, stem + ".plan.json", settings);
  argv.insert(argv.end(),
              {"--steps", "1", "--warmup", "0", "--links-out", stem + ".hardware.json"});
  const auto [status, out] = run_capturing_stdout(argv);
  if (status != 0) throw WorkError(fmt::format("the link probe's ranks failed (exit {})", status));
  return load_hardware(stem + ".hardware.json");
}

}  // namespace pipetune::cli
