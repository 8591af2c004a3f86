#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/commands.hpp"
#include "cli/report.hpp"
#include "sim/critical_path.hpp"
#include "sim/error.hpp"
#include "sim/sweep.hpp"
#include "sim/trace.hpp"

namespace pipetune::cli {

namespace {

struct DemoFlags {
  std::string profile;
  std::string out = "pipetune-demo";
  int devices = 2;
};

// The shipped example profile: beside the sources when run from a build tree.
std::string find_shipped_profile() {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates{fs::path(PIPETUNE_SOURCE_DIR) / "traces" / "cpu-mlp.profile.json"};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back(exe.parent_path() / ".." / "share" / "pipetune" / "cpu-mlp.profile.json");
  for (const auto& c : candidates) {
    if (fs::exists(c, ec)) return c.string();
  }
  throw InputError("demo: the shipped profile traces/cpu-mlp.profile.json is missing; pass --profile");
}

}  // namespace

void add_demo_command(CLI::App& app, std::vector<Command>& commands) {
  auto flags = std::make_shared<DemoFlags>();
  CLI::App* sub = app.add_subcommand(
      "demo", "Headless what-if on the shipped example profile: sweep, pick, predict, write the trace");
  sub->add_option("--profile", flags->profile, "another profile (default: the shipped one)")
      ->type_name("FILE");
  sub->add_option("--out", flags->out, "folder for the outputs")->type_name("DIR");
  sub->add_option("--devices", flags->devices, "pipeline devices")->check(CLI::Range(1, 64));

  commands.emplace_back(sub, [flags] {
    const std::string profile_path = flags->profile.empty() ? find_shipped_profile() : flags->profile;
    const Profile profile = load_profile(profile_path);
    const Hardware hardware = replicate_device(profile.device, flags->devices);
    std::printf("profile   %s: %zu layers, batch %lld, measured on %s\n", profile_path.c_str(),
                profile.layer_count(), static_cast<long long>(profile.batch_size),
                profile.device.type.c_str());
    std::printf("what-if   %d x %s, ideal links: every chunk count, checkpoint mode and schedule\n\n",
                flags->devices, profile.device.type.c_str());

    SweepSpec spec;
    spec.device_counts = {flags->devices};
    for (int c = 1; c <= profile.batch_size; ++c) spec.chunks.push_back(c);
    spec.checkpoints = {std::begin(kAllCheckpointModes), std::end(kAllCheckpointModes)};
    spec.schedules = {std::begin(kAllScheduleKinds), std::end(kAllScheduleKinds)};
    std::vector<SweepRow> rows = run_sweep(profile, hardware, spec);
    std::stable_sort(rows.begin(), rows.end(),
                     [](const SweepRow& a, const SweepRow& b) { return a.iteration_ms < b.iteration_ms; });
    std::vector<SweepRow> top(rows.begin(), rows.begin() + std::min<std::size_t>(rows.size(), 8));
    std::fputs(sweep_table(top).c_str(), stdout);

    const Simulator simulator(profile, hardware);
    SimulationOptions options;
    options.record_edges = true;
    const SimulationResult best = simulator.run(rows.front().plan, options);
    std::printf("\nbest of %zu plans:\n", rows.size());
    std::fputs(simulation_text(profile, best, critical_path(best)).c_str(), stdout);

    std::filesystem::create_directories(flags->out);
    const std::string plan_path = flags->out + "/plan.json";
    const std::string trace_path = flags->out + "/predicted.trace.json";
    save_plan(best.plan, plan_path);
    save_trace(trace_from_simulation(best, profile.model), trace_path);
    std::printf("\nwrote %s and %s\n", plan_path.c_str(), trace_path.c_str());
    std::printf("open the timeline: pipetune-gui %s %s   (or https://ui.perfetto.dev)\n",
                profile_path.c_str(), trace_path.c_str());
    return 0;
  });
}

}  // namespace pipetune::cli
