#include <cstdio>
#include <memory>

#include "cli/commands.hpp"
#include "cli/inputs.hpp"
#include "cli/report.hpp"
#include "sim/critical_path.hpp"
#include "sim/simulator.hpp"
#include "sim/trace.hpp"

namespace pipetune::cli {

namespace {
struct SimulateFlags {
  std::string profile;
  HardwareFlags hardware;
  PlanFlags plan;
  std::string trace;
  bool json = false;
};
}  // namespace

void add_simulate_command(CLI::App& app, std::vector<Command>& commands) {
  auto flags = std::make_shared<SimulateFlags>();
  CLI::App* sub = app.add_subcommand(
      "simulate", "Predict one training iteration of a plan: time, bubble, per-device memory");
  add_profile_flag(*sub, flags->profile);
  add_hardware_flags(*sub, flags->hardware);
  add_plan_flags(*sub, flags->plan);
  sub->add_option("--trace", flags->trace, "write the predicted timeline (opens in Perfetto)")
      ->type_name("OUT.json");
  sub->add_flag("--json", flags->json, "print one JSON object instead of the report");

  commands.emplace_back(sub, [flags] {
    const Profile profile = load_profile(flags->profile);
    const Plan plan = resolve_plan(flags->plan);
    std::string note;
    const Hardware hardware = resolve_hardware(profile, flags->hardware, plan.stages(), &note);
    check_plan(plan, profile, hardware, plan_source(flags->plan));
    print_note(note);

    const Simulator simulator(profile, hardware);
    SimulationOptions options;
    options.record_edges = true;
    const SimulationResult result = simulator.run(plan, options);
    const std::vector<int> path = critical_path(result);
    if (!flags->trace.empty()) {
      save_trace(trace_from_simulation(result, profile.model), flags->trace);
    }
    const std::string out =
        flags->json ? simulation_json(result, path) : simulation_text(profile, result, path);
    std::fputs(out.c_str(), stdout);
    if (!flags->json && !flags->trace.empty()) {
      std::printf("\ntrace written to %s (open it in https://ui.perfetto.dev)\n",
                  flags->trace.c_str());
    }
    return 0;
  });
}

}  // namespace pipetune::cli
