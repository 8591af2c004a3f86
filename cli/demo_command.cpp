// pipetune demo: the README's main job. With LibTorch, the whole loop on a built-in model on
// the CPU (profile, plan, calibrate, predict, run, compare); without it, a what-if on the shipped
// profile, which needs nothing but sim/.

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "cli/commands.hpp"
#include "cli/number_flags.hpp"
#include "cli/progress.hpp"
#include "cli/report.hpp"
#include "cli/table.hpp"
#include "sim/critical_path.hpp"
#include "sim/error.hpp"
#include "sim/file_io.hpp"
#include "sim/limits.hpp"
#include "sim/planner/planner.hpp"
#include "sim/sweep.hpp"
#include "sim/trace.hpp"
#include "sim/units.hpp"
#ifdef PIPETUNE_WITH_TORCH
#include "cli/validate_report.hpp"
#include "validate/validation.hpp"
#endif

namespace pipetune::cli {

namespace {

namespace fs = std::filesystem;

struct DemoFlags {
  std::string model = "mlp:layers=8,width=1024";
  std::int64_t batch = 256;
  int devices = 2;
  int steps = 20;
  std::string out = "pipetune-demo";
  std::string profile;  // what-if only
  std::string progress;
};

// The GUI beside this pipetune (a build tree or an install), else by name.
std::string gui_program() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const fs::path& candidate : {exe.parent_path() / ".." / "gui" / "app" / "pipetune-gui",
                                      exe.parent_path() / "pipetune-gui"}) {
      if (fs::exists(candidate, ec)) return fs::weakly_canonical(candidate).string();
    }
  }
  return "pipetune-gui";
}

// The shipped example profile: beside the sources when run from a build tree.
std::string find_shipped_profile() {
  std::vector<fs::path> candidates{fs::path(PIPETUNE_SOURCE_DIR) / "traces" /
                                   "cpu-mlp.profile.json"};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec)
    candidates.push_back(exe.parent_path() / ".." / "share" / "pipetune" / "cpu-mlp.profile.json");
  for (const auto& c : candidates) {
    if (fs::exists(c, ec)) return c.string();
  }
  throw InputError(
      "demo: the shipped profile traces/cpu-mlp.profile.json is missing; pass --profile");
}

// Without LibTorch: sweep the shipped profile and write the best plan's predicted timeline.
[[maybe_unused]] int what_if(const DemoFlags& flags) {
  const std::string profile_path = flags.profile.empty() ? find_shipped_profile() : flags.profile;
  const Profile profile = load_profile(profile_path);
  const Hardware hardware = replicate_device(profile.device, flags.devices);
  std::printf(
      "this pipetune was built without LibTorch: nothing can run, so this is a what-if on %s\n\n",
      profile_path.c_str());
  SweepSpec spec;
  spec.device_counts = {flags.devices};
  for (int c = 1; c <= profile.batch_size; ++c) spec.chunks.push_back(c);
  spec.checkpoints = {std::begin(kAllCheckpointModes), std::end(kAllCheckpointModes)};
  spec.schedules = {std::begin(kSingleStageScheduleKinds), std::end(kSingleStageScheduleKinds)};
  std::vector<SweepRow> rows = run_sweep(profile, hardware, spec);
  std::stable_sort(rows.begin(), rows.end(), [](const SweepRow& a, const SweepRow& b) {
    return a.iteration_ms < b.iteration_ms;
  });
  std::vector<SweepRow> top(rows.begin(), rows.begin() + std::min<std::size_t>(rows.size(), 8));
  std::fputs(sweep_table(top).c_str(), stdout);
  SimulationOptions options;
  options.record_edges = true;
  const SimulationResult best = Simulator(profile, hardware).run(rows.front().plan, options);
  std::printf("\nbest of %zu plans:\n", rows.size());
  std::fputs(simulation_text(profile, best, critical_path(best)).c_str(), stdout);
  fs::create_directories(flags.out);
  const std::string plan_path = (fs::path(flags.out) / "plan.json").string();
  const std::string trace_path = (fs::path(flags.out) / "predicted.trace.json").string();
  save_plan(best.plan, profile, plan_path);
  save_trace(trace_from_simulation(best, profile.model), trace_path);
  std::printf("\nwrote %s and %s\nopen them: %s %s %s %s\n", plan_path.c_str(), trace_path.c_str(),
              gui_program().c_str(), profile_path.c_str(), plan_path.c_str(), trace_path.c_str());
  return 0;
}

#ifdef PIPETUNE_WITH_TORCH
std::string summary_table(const validate::Validation& v) {
  const validate::PlanValidation& chosen = v.plans.front();
  const TraceComparison& c = v.headline(chosen);
  TextTable table;
  table.add_column("");
  table.add_column("predicted", TextTable::Align::Right);
  table.add_column("measured", TextTable::Align::Right);
  table.add_column("error", TextTable::Align::Right);
  table.add_row({"iteration ms", format_ms(c.predicted_ms),
                 fmt::format("{} ± {}", format_ms(chosen.measured.median_pipeline_ms()),
                             format_ms(chosen.measured.spread_ms())),
                 fmt::format("{:+.1f} %", 100.0 * c.time_error)});
  if (chosen.interval.known()) {
    const double median = chosen.measured.median_pipeline_ms();
    table.add_row(
        {"  80 % interval",
         fmt::format("{} - {}", format_ms(chosen.interval.low_ms),
                     format_ms(chosen.interval.high_ms)),
         fmt::format("{} of {} steps in", chosen.steps_inside, chosen.measured.pipeline_ms.size()),
         chosen.interval.holds(median) ? "median in" : "median out"});
  }
  if (v.has_calibration()) {
    table.add_row({"  uncalibrated", format_ms(chosen.uncalibrated.predicted_ms), "",
                   fmt::format("{:+.1f} %", 100.0 * chosen.uncalibrated.time_error)});
  }
  for (std::size_t d = 0; d < c.devices.size(); ++d) {
    table.add_row({fmt::format("peak memory {}", c.devices[d]),
                   format_bytes(c.predicted_peak_bytes[d]), format_bytes(c.measured_peak_bytes[d]),
                   fmt::format("{:+.1f} %", 100.0 * c.memory_error[d])});
  }
  return table.render();
}

int full_demo(const DemoFlags& flags) {
  validate::ValidationOptions o;
  o.model_spec = flags.model;
  o.run.batch = flags.batch;
  o.run.steps = flags.steps;
  o.run.rounds = std::max(1, flags.steps / 5);
  o.devices = flags.devices;
  o.top = 3;
  o.out_dir = flags.out;
  const std::string space = search_space_text(o.planner, flags.batch);
  std::printf(
      "pipetune demo: %s, batch %lld, on %d CPU devices (worker threads sharing %u cores)\n",
      flags.model.c_str(), static_cast<long long>(flags.batch), flags.devices,
      std::max(1u, std::thread::hardware_concurrency()));
  std::printf(
      "profile -> plan -> calibrate -> predict -> run -> compare; everything goes to %s/\n\n",
      flags.out.c_str());
  std::fflush(stdout);
  const std::string mode = progress_mode(flags.progress);
  PhaseProgress bars(mode);
  std::string phase;
  o.progress = [&](const std::string& now, std::size_t done, std::size_t total) {
    if (now != phase) {
      bars.finish();
      phase = now;
      const std::string what = now == "profile" ? "profiling every layer at every micro-batch size"
                               : now == "plan"  ? "searching " + space
                               : now == "calibrate"
                                   ? "calibrating on plans that will not be validated"
                                   : "running the 3 best plans for real, taking turns";
      if (mode != "none") std::fprintf(stderr, "%s\n", what.c_str());  // none: quiet
    }
    bars(now, done, total);
  };
  const validate::Validation v = validate::run_validation(o);
  bars.finish();
  const std::string json = validation_json(v, {}, {});
  write_text_file_atomically((fs::path(flags.out) / "report.json").string(), json);
  write_text_file_atomically((fs::path(flags.out) / "report.md").string(), validation_markdown(v));

  std::fputs(validation_text(v).c_str(), stdout);
  const validate::PlanValidation& chosen = v.plans.front();
  std::printf("\nsummary: the plan chosen, %s%s, predicted and measured\n\n",
              describe_plan(chosen.plan()).c_str(),
              v.planner_proven
                  ? fmt::format(" (optimal under the model over {})", v.planner_space).c_str()
                  : "");
  std::fputs(summary_table(v).c_str(), stdout);
  // Which prediction the headline is, and why that one.
  if (v.has_calibration()) {
    std::printf("\nthe prediction trusted is the calibrated one (calibration %s)\n",
                v.calibration_reason.empty() ? "reused" : v.calibration_reason.c_str());
  } else {
    std::printf("\nthe prediction trusted is the uncalibrated one (calibration %s)\n",
                v.calibration_reason.empty() ? "none" : v.calibration_reason.c_str());
  }
  std::printf("\ntraces, plans, profile, hardware and reports are in %s/ (%.0f s in all)\n",
              flags.out.c_str(), v.seconds);
  std::printf("open the predicted timeline over the measured one:\n  %s %s %s %s %s\n",
              gui_program().c_str(), v.profile_path.c_str(), v.hardware_path.c_str(),
              chosen.plan_path.c_str(), chosen.measured_trace_path.c_str());
  return 0;
}
#endif

}  // namespace

void add_demo_command(CLI::App& app, std::vector<Command>& commands) {
  auto flags = std::make_shared<DemoFlags>();
  CLI::App* sub = app.add_subcommand(
      "demo",
      "The whole loop on a built-in model on the CPU: profile, plan, predict, run, compare");
  sub->add_option("--model", flags->model, "the model (default mlp:layers=8,width=1024)")
      ->type_name("SPEC");
  sub->add_option("--batch", flags->batch, "samples per mini-batch (default 256)")
      ->check(whole_number(1, limits::kMaxBatch));
  sub->add_option("--devices", flags->devices, "pipeline devices (default 2)")
      ->check(whole_number(1, 64));
  sub->add_option("--steps", flags->steps, "measured steps per plan (default 20)")
      ->check(whole_number(1, 100000));
  sub->add_option("--out", flags->out, "folder for everything written (default pipetune-demo)")
      ->type_name("DIR");
  sub->add_option("--profile", flags->profile,
                  "without LibTorch: the profile for the what-if (default: shipped)")
      ->type_name("FILE");
  sub->add_option("--progress", flags->progress, "bar (default on a terminal), lines or none")
      ->check(CLI::IsMember({"bar", "lines", "none"}));

  commands.emplace_back(sub, [flags] {
#ifdef PIPETUNE_WITH_TORCH
    return full_demo(*flags);
#else
    return what_if(*flags);
#endif
  });
}

}  // namespace pipetune::cli
