#include <cstdio>
#include <memory>
#include <optional>

#include "cli/commands.hpp"
#include "cli/inputs.hpp"
#include "cli/report.hpp"
#include "sim/critical_path.hpp"
#include "sim/schedule_csv.hpp"
#include "sim/simulator.hpp"
#include "sim/trace.hpp"

namespace pipetune::cli {

namespace {
struct SimulateFlags {
  std::string profile;
  HardwareFlags hardware;
  PlanFlags plan;
  std::string trace;
  std::string schedule_csv;
  std::string write_schedule_csv;
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
  sub->add_option("--schedule-csv", flags->schedule_csv,
                  "run torch's compute-only schedule CSV instead of --schedule: row r is device r; "
                  "--balance gives the layers of each stage")
      ->type_name("FILE");
  sub->add_option("--write-schedule-csv", flags->write_schedule_csv,
                  "write the schedule as torch's compute-only CSV, one row per device")
      ->type_name("OUT.csv");
  sub->add_flag("--json", flags->json, "print one JSON object instead of the report");

  commands.emplace_back(sub, [flags] {
    const Profile profile = load_profile(flags->profile);
    Plan plan = resolve_plan(flags->plan);
    std::optional<Schedule> given;
    if (!flags->schedule_csv.empty()) given = load_schedule_csv(flags->schedule_csv);
    std::string note;
    const Hardware hardware = resolve_hardware(profile, flags->hardware,
                                               given ? given->ranks() : device_count(plan), &note);
    if (given) use_schedule_csv(*given, flags->schedule_csv, hardware, plan);
    check_plan(plan, profile, hardware, plan_source(flags->plan));
    print_note(note);

    const Simulator simulator(profile, hardware);
    SimulationOptions options;
    options.record_edges = true;
    options.worst_order_peaks = true;
    const SimulationResult result =
        given ? simulator.run(plan, *given, options) : simulator.run(plan, options);
    if (!flags->write_schedule_csv.empty()) {
      const int micro_batches = static_cast<int>(result.micro_batch_sizes.size());
      write_schedule_csv(given ? *given
                               : make_schedule(plan.schedule, plan.stages(), micro_batches,
                                               plan.checkpoint, plan.stages_per_device),
                         stage_devices(plan, hardware), hardware, flags->write_schedule_csv);
    }
    const std::vector<int> path = critical_path(result);
    if (!flags->trace.empty()) {
      save_trace(trace_from_simulation(result, profile.model), flags->trace);
    }
    const std::string out = flags->json
                                ? simulation_json(result, path)
                                : simulation_text(profile, result, path, flags->schedule_csv);
    std::fputs(out.c_str(), stdout);
    if (!flags->json && !flags->trace.empty()) {
      std::printf("\ntrace written to %s (open it in https://ui.perfetto.dev)\n",
                  flags->trace.c_str());
    }
    return 0;
  });
}

}  // namespace pipetune::cli
