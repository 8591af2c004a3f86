#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.hpp"
#include "cli/error_text.hpp"
#include "cli/inputs.hpp"
#include "cli/report.hpp"
#include "sim/critical_path.hpp"
#include "sim/error.hpp"
#include "sim/plan.hpp"
#include "sim/planner/runtime_support.hpp"
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
  std::string plans;  ///< JSON lines, one plan each ("-": standard input)
  bool json = false;
};

bool any_plan_flag(const PlanFlags& p) {
  return !p.plan_path.empty() || !p.balance.empty() || p.chunks || p.checkpoint || p.schedule ||
         p.stages_per_device || !p.stage_devices.empty() || p.optimizer_state_factor;
}

// What a simulation report reads: the edges (its critical path) and the worst order's peaks.
SimulationOptions report_options() {
  SimulationOptions options;
  options.record_edges = true;
  options.worst_order_peaks = true;
  return options;
}

// Hardware for each device count the plan lines name, resolved once per count.
class HardwareByDevices {
 public:
  HardwareByDevices(const Profile& profile, const HardwareFlags& flags)
      : profile_(profile), flags_(flags) {}
  const Hardware& operator()(int devices) {
    auto it = hardware_.find(devices);
    if (it == hardware_.end())
      it = hardware_.emplace(devices, resolve_hardware(profile_, flags_, devices, nullptr)).first;
    return it->second;
  }

 private:
  const Profile& profile_;
  const HardwareFlags& flags_;
  std::map<int, Hardware> hardware_;
};

// One plan line's answer: the simulation as `simulate --json` prints it, with the line's
// number first. Throws InputError for a line that is not a plan the profile can run.
std::string simulate_plan_line(const std::string& text, int line, const std::string& source,
                               const Profile& profile, HardwareByDevices& hardware_for) {
  // A line may leave out the format tag: it can only be a plan.
  nlohmann::json object = nlohmann::json::parse(text, nullptr, false);
  if (object.is_object() && !object.contains("format")) object["format"] = kPlanFormat;
  const std::string where = fmt::format("{} line {}", source, line);
  const Plan plan = parse_plan(object.is_discarded() ? text : object.dump(), where);
  const Hardware& hardware = hardware_for(device_count(plan));
  check_plan(plan, profile, hardware, where);
  const Simulator simulator(profile, hardware);
  // As for one plan, so each line answers what --json would.
  const SimulationResult result = simulator.run(plan, report_options());
  const IterationInterval interval = iteration_interval(simulator, profile, plan);
  // simulation_json is one object on one line; the line number goes first.
  std::string out = simulation_json(result, critical_path(result), &interval);
  out.replace(0, 1, fmt::format("{{\"line\":{},", line));
  return out;
}

// One object per plan line, in order, so a script's thousand what-ifs cost one start-up. A bad
// line gets {"line": N, "error": "…"} in its place and the others still run; the exit status
// says whether any line was refused.
int simulate_plan_lines(const SimulateFlags& flags) {
  for (const auto& [given, flag] :
       {std::pair{any_plan_flag(flags.plan), "--plan, --balance and the other plan flags"},
        std::pair{!flags.trace.empty(), "--trace"},
        std::pair{!flags.schedule_csv.empty(), "--schedule-csv"},
        std::pair{!flags.write_schedule_csv.empty(), "--write-schedule-csv"}}) {
    if (given) throw InputError(fmt::format("--plans: every line is a whole plan; drop {}", flag));
  }
  const Profile profile = load_profile(flags.profile);
  std::ifstream file;
  if (flags.plans != "-") {
    file.open(flags.plans);
    if (!file) throw InputError(fmt::format("--plans: cannot read {}", flags.plans));
  }
  std::istream& in = flags.plans == "-" ? std::cin : file;
  const std::string source = flags.plans == "-" ? "standard input" : flags.plans;

  // Flags that are wrong for every line are refused once, before any line.
  std::string note;
  resolve_hardware(profile, flags.hardware, 0, &note);
  print_note(note);
  HardwareByDevices hardware_for(profile, flags.hardware);
  std::string text;
  int line = 0, plans = 0, refused = 0;
  while (std::getline(in, text)) {
    ++line;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++plans;
    std::string out;
    try {
      out = simulate_plan_line(text, line, source, profile, hardware_for);
    } catch (const InputError& e) {
      ++refused;
      out = nlohmann::json{{"line", line}, {"error", error_text(e)}}.dump() + "\n";
    }
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);  // a script reading the pipe gets each answer as it is made
  }
  if (refused > 0) {
    std::fprintf(stderr, "pipetune: error: %d of %d plans refused (their lines say why)\n", refused,
                 plans);
    return 2;
  }
  return 0;
}

// What torch's runtime would make of the plan, added to the note: a what-if is allowed, but
// not without saying torch would refuse it.
void note_what_torch_makes_of(const Plan& plan, const Profile& profile, std::string& note) {
  std::string refused = torch_cannot_run(plan, profile.batch_size);
  if (refused.empty()) refused = torch_changed_stage_input(plan, profile);
  if (refused.empty()) refused = torch_view_stage_output(plan, profile);
  if (!refused.empty()) note += "; torch cannot run this plan: " + refused;
  const std::string unmodelled = torch_frozen_stem_unmodelled(plan, profile);
  if (!unmodelled.empty()) note += "; " + unmodelled;
}

// One plan (or a schedule CSV with a balance): the report or its JSON, the trace and the CSV
// where asked.
int simulate_one_plan(const SimulateFlags& flags) {
  const Profile profile = load_profile(flags.profile);
  Plan plan = resolve_plan(flags.plan);
  std::optional<Schedule> given;
  if (!flags.schedule_csv.empty()) given = load_schedule_csv(flags.schedule_csv);
  std::string note;
  const Hardware hardware =
      resolve_hardware(profile, flags.hardware, given ? given->ranks() : device_count(plan), &note);
  if (given) use_schedule_csv(*given, flags.schedule_csv, hardware, plan);
  check_plan(plan, profile, hardware, plan_source(flags.plan));
  if (hardware.runtime == Runtime::TorchPipelining) note_what_torch_makes_of(plan, profile, note);
  print_note(note);

  const Simulator simulator(profile, hardware);
  const SimulationResult result =
      given ? simulator.run(plan, *given, report_options()) : simulator.run(plan, report_options());
  if (!flags.write_schedule_csv.empty()) {
    write_schedule_csv(given ? *given : schedule_of(plan, profile.batch_size),
                       stage_devices(plan, hardware), hardware, flags.write_schedule_csv);
  }
  const std::vector<int> path = critical_path(result);
  // For the plan's own schedule: a CSV's programmes are not what the interval simulates.
  std::optional<IterationInterval> interval;
  if (!given) interval = iteration_interval(simulator, profile, plan);
  const IterationInterval* shown = interval ? &*interval : nullptr;
  if (!flags.trace.empty()) save_trace(trace_from_simulation(result, profile.model), flags.trace);
  const std::string out = flags.json
                              ? simulation_json(result, path, shown)
                              : simulation_text(profile, result, path, flags.schedule_csv, shown);
  std::fputs(out.c_str(), stdout);
  if (!flags.json && !flags.trace.empty()) {
    std::printf("\ntrace written to %s (open it in https://ui.perfetto.dev)\n",
                flags.trace.c_str());
  }
  return 0;
}

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
  sub->add_option("--plans", flags->plans,
                  "many plans at once: JSON lines, one plan.json object a line (- for standard "
                  "input); prints one JSON line per plan, in order")
      ->type_name("FILE");

  commands.emplace_back(sub, [flags] {
    return flags->plans.empty() ? simulate_one_plan(*flags) : simulate_plan_lines(*flags);
  });
}

}  // namespace pipetune::cli
