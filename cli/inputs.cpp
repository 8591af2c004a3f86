#include "cli/inputs.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cli/number_flags.hpp"
#include "cli/report.hpp"
#include "sim/error.hpp"
#include "sim/file_io.hpp"
#include "sim/limits.hpp"
#include "sim/schedule_csv.hpp"
#include "sim/units.hpp"

namespace pipetune::cli {

void add_profile_flag(CLI::App& app, std::string& profile_path) {
  app.add_option("--profile", profile_path, "profile.json from `pipetune profile`")
      ->required()
      ->type_name("FILE");
}

void add_hardware_flags(CLI::App& app, HardwareFlags& flags, bool devices_as_count) {
  app.add_option("--hardware", flags.hardware_path,
                 "hardware.json: devices, memory, links (default: the profile's device, once "
                 "per stage, ideal links)")
      ->type_name("FILE");
  if (devices_as_count) {
    app.add_option("--devices", flags.devices, "N copies of the profile's device, ideal links")
        ->type_name("N")
        ->check(whole_number(1, limits::kMaxDevices));
  }
  app.add_option("--memory", flags.memory, "memory of every device, e.g. 16GiB")->type_name("SIZE");
  app.add_option("--bandwidth", flags.bandwidth, "link bandwidth in bytes/s, e.g. 25e9 or 25GB")
      ->type_name("BYTES_PER_S");
  app.add_option("--latency-ms", flags.latency_ms, "link latency in milliseconds")
      ->type_name("MS")
      ->check(real_number(0.0, limits::kMaxMs));
}

void add_plan_flags(CLI::App& app, PlanFlags& flags) {
  app.add_option("--plan", flags.plan_path, "plan.json; the flags below override its fields")
      ->type_name("FILE");
  app.add_option("--balance", flags.balance, "layers per stage, e.g. 3,3,2")
      ->delimiter(',')
      ->type_name("N,N,...")
      ->check(whole_number_from(0));
  app.add_option("--chunks", flags.chunks, "micro-batches per mini-batch (default 1)")
      ->type_name("M")
      ->check(whole_number(1, limits::kMaxChunks));
  app.add_option("--checkpoint", flags.checkpoint,
                 "always | except_last | never (default except_last)")
      ->type_name("MODE");
  app.add_option(
         "--schedule", flags.schedule,
         "gpipe | 1f1b | interleaved-1f1b | interleaved-zb | zbv | looped-bfs | dualpipev (default "
         "gpipe)")
      ->type_name("KIND");
  app.add_option("--stages-per-device", flags.stages_per_device,
                 "stages each device runs, for the interleaved, V and looped-bfs schedules "
                 "(default 1; zbv, dualpipev: 2)")
      ->type_name("V")
      ->check(whole_number(1, kMaxStagesPerDevice));
  app.add_option("--stage-devices", flags.stage_devices,
                 "device of each stage by name, e.g. cpu:0,cpu:0 to share one")
      ->delimiter(',')
      ->type_name("NAME,...");
  app.add_option("--optimizer-state-factor", flags.optimizer_state_factor,
                 "optimizer state bytes per parameter byte: 0 SGD, 1 momentum, 2 Adam")
      ->type_name("X")
      ->check(optimizer_state_factor_range());
}

double parse_bandwidth(const std::string& text, const std::string& flag) {
  // The one parser (sim/units.hpp) refuses what is below sim/limits.hpp's least bandwidth.
  const double value = pipetune::parse_bandwidth(text);
  if (std::isnan(value)) {
    throw InputError(fmt::format(
        "{}: expected bytes per second, at least 1 (e.g. 25e9, 25GB or ideal), got \"{}\"", flag,
        text));
  }
  return value;
}

std::int64_t parse_memory(const std::string& text, const std::string& flag) {
  const std::int64_t bytes = parse_bytes(text);
  if (bytes < 0)
    throw InputError(fmt::format("{}: expected a size such as 16GiB, got \"{}\"", flag, text));
  if (bytes > limits::kMaxBytes)
    throw InputError(fmt::format("{}: expected at most 64TiB, got \"{}\"", flag, text));
  return bytes;
}

void print_note(const std::string& note) {
  if (!note.empty()) std::fprintf(stderr, "note: %s\n", note.c_str());
}

Hardware resolve_hardware(const Profile& profile, const HardwareFlags& flags, int default_count,
                          std::string* note) {
  Hardware hw;
  if (!flags.hardware_path.empty()) {
    if (flags.devices > 0) {
      throw InputError("--devices: give --hardware or --devices, not both");
    }
    hw = load_hardware(flags.hardware_path);
  } else {
    const int count = flags.devices > 0 ? flags.devices : std::max(default_count, 1);
    // The simulator keeps a link per pair of devices: a bound keeps --devices 2000000000 from
    // exhausting memory instead of being refused.
    if (count > limits::kMaxDevices) {
      throw InputError(fmt::format("--devices: expected at most {} devices, got {}",
                                   limits::kMaxDevices, count));
    }
    hw = replicate_device(profile.device, count);
    if (note) {
      *note = fmt::format("no --hardware: {} the profile's device ({}{}{}) with {} links",
                          flags.devices > 0 || default_count > 0
                              ? fmt::format("{} x", count)
                              : std::string("for each plan as many as it needs of"),
                          profile.device.type, profile.device.name.empty() ? "" : ", ",
                          profile.device.name,
                          flags.bandwidth.empty() && flags.latency_ms < 0 ? "ideal" : "the given");
    }
  }
  if (!flags.memory.empty()) {
    const std::int64_t bytes = parse_memory(flags.memory, "--memory");
    for (auto& d : hw.devices) d.memory_bytes = bytes;
  }
  std::optional<double> bandwidth, latency;
  if (!flags.bandwidth.empty()) bandwidth = parse_bandwidth(flags.bandwidth, "--bandwidth");
  if (flags.latency_ms >= 0) latency = flags.latency_ms;  // its flag checks the ceiling
  set_all_links(hw, bandwidth, latency);
  if (note && !hw.calibration.empty()) {
    // Predictions differ from the profile's numbers: say so, and by how much.
    *note = fmt::format("applying the calibration in {}: {}", flags.hardware_path,
                        calibration_summary(hw.calibration));
  }
  if (note && hw.runtime == Runtime::TorchPipelining) {
    // Another runtime's memory: say whose prediction this is.
    *note += fmt::format(
        "{}predicting {}'s runtime ({}): its kept receive buffers and outputs "
        "counted",
        note->empty() ? "" : "; ", kTorchPipeliningRuntime, flags.hardware_path);
  }
  return hw;
}

Plan resolve_plan(const PlanFlags& flags) {
  Plan plan;
  if (!flags.plan_path.empty()) {
    plan = load_plan(flags.plan_path);
  } else if (flags.balance.empty()) {
    throw InputError(
        "no plan: give --plan FILE or --balance N,N,... (with --chunks, --checkpoint, --schedule)");
  }
  if (!flags.balance.empty()) plan.balance = flags.balance;
  if (flags.chunks) plan.chunks = *flags.chunks;  // in range: add_plan_flags checks it
  if (flags.checkpoint) {
    const auto mode = parse_checkpoint_mode(*flags.checkpoint);
    if (!mode) {
      throw InputError(fmt::format(
          "--checkpoint: expected always, except_last or never, got \"{}\"", *flags.checkpoint));
    }
    plan.checkpoint = *mode;
  }
  if (flags.schedule) {
    const auto kind = parse_schedule_kind(*flags.schedule);
    if (!kind) {
      throw InputError(
          fmt::format("--schedule: expected gpipe, 1f1b, interleaved-1f1b, interleaved-zb, zbv, "
                      "looped-bfs or dualpipev, got \"{}\"",
                      *flags.schedule));
    }
    plan.schedule = *kind;
    // The V schedules run exactly two stages per device: the one value they take is the default.
    const auto fixed = fixed_stages_per_device(*kind);
    if (is_multi_stage(*kind) && fixed && !flags.stages_per_device) plan.stages_per_device = *fixed;
  }
  if (flags.stages_per_device) {
    if (*flags.stages_per_device < 1) {
      throw InputError(fmt::format("--stages-per-device: expected at least 1, got {}",
                                   *flags.stages_per_device));
    }
    plan.stages_per_device = *flags.stages_per_device;
  }
  if (!flags.stage_devices.empty()) plan.devices = flags.stage_devices;
  if (flags.optimizer_state_factor) {
    // Written so that NaN fails too; the bound is the plan file's.
    if (!(*flags.optimizer_state_factor >= 0 && *flags.optimizer_state_factor <= 1000)) {
      throw InputError(
          fmt::format("--optimizer-state-factor: expected a number from 0 to 1000, got {}",
                      *flags.optimizer_state_factor));
    }
    plan.optimizer_state_factor = *flags.optimizer_state_factor;
  }
  return plan;
}

int device_count(const Plan& plan) {
  if (!is_multi_stage(plan.schedule) || plan.stages_per_device < 1) return plan.stages();
  return std::max(1, plan.stages() / plan.stages_per_device);
}

void use_schedule_csv(const Schedule& schedule, const std::string& path, const Hardware& hardware,
                      Plan& plan) {
  std::vector<std::string> names;
  for (const auto& device : hardware.devices) names.push_back(device.name);
  use_schedule_csv(schedule, path, names, plan);
}

void use_schedule_csv(const Schedule& schedule, const std::string& path,
                      const std::vector<std::string>& device_names, Plan& plan) {
  if (schedule.stages != plan.stages()) {
    throw InputError(fmt::format("{}: the schedule has {} stages; --balance gives {}", path,
                                 schedule.stages, plan.stages()));
  }
  const int devices = static_cast<int>(device_names.size());
  if (schedule.ranks() > devices) {
    throw InputError(fmt::format("{}: {} rows (one per rank), but only {} device{}", path,
                                 schedule.ranks(), devices, devices == 1 ? "" : "s"));
  }
  // The rows are the programmes; one stage per programme for check_plan, placed as the rows say.
  plan.schedule = ScheduleKind::GPipe;
  plan.stages_per_device = 1;
  plan.checkpoint = CheckpointMode::Never;
  if (plan.devices.empty()) {
    for (int s = 0; s < schedule.stages; ++s) {
      plan.devices.push_back(device_names[schedule.stage_rank[s]]);
    }
  }
}

void write_schedule_csv(const Schedule& schedule, const std::vector<int>& device_of,
                        const Hardware& hardware, const std::string& path) {
  auto programs = device_programs(schedule, device_of, static_cast<int>(hardware.devices.size()));
  std::erase_if(programs, [](const auto& program) { return program.empty(); });
  int left_out = 0;
  write_text_file_atomically(path, schedule_csv(programs, &left_out));
  if (left_out > 0) {
    print_note(fmt::format(
        "{}: left out {} recompute{} (torch has no recompute action: checkpoint inside the stage "
        "module instead)",
        path, left_out, left_out == 1 ? "" : "s"));
  }
}

std::string plan_source(const PlanFlags& flags) {
  const bool inline_flags = !flags.balance.empty() || flags.chunks || flags.checkpoint ||
                            flags.schedule || flags.stages_per_device ||
                            !flags.stage_devices.empty() || flags.optimizer_state_factor;
  if (flags.plan_path.empty()) return "command line";
  return inline_flags ? flags.plan_path + " (with flags)" : flags.plan_path;
}

std::vector<CheckpointMode> parse_checkpoint_list(const std::vector<std::string>& names,
                                                  const std::string& flag) {
  std::vector<CheckpointMode> out;
  for (const auto& name : names) {
    if (name == "all") return {std::begin(kAllCheckpointModes), std::end(kAllCheckpointModes)};
    const auto mode = parse_checkpoint_mode(name);
    if (!mode) {
      throw InputError(
          fmt::format("{}: expected always, except_last, never or all, got \"{}\"", flag, name));
    }
    out.push_back(*mode);
  }
  return out;
}

std::vector<ScheduleKind> parse_schedule_list(const std::vector<std::string>& names,
                                              const std::string& flag) {
  std::vector<ScheduleKind> out;
  for (const auto& name : names) {
    if (name == "all") return {std::begin(kAllScheduleKinds), std::end(kAllScheduleKinds)};
    const auto kind = parse_schedule_kind(name);
    if (!kind) {
      throw InputError(fmt::format(
          "{}: expected gpipe, 1f1b, interleaved-1f1b, interleaved-zb, zbv, looped-bfs, "
          "dualpipev or all, got \"{}\"",
          flag, name));
    }
    if (std::find(out.begin(), out.end(), *kind) == out.end()) out.push_back(*kind);
  }
  return out;
}

std::vector<int> parse_stages_per_device_list(const std::vector<int>& values,
                                              const std::string& flag) {
  for (int v : values) {
    if (v < 2 || v > kMaxStagesPerDevice) {
      throw InputError(fmt::format("{}: expected 2 to {} stages per device, got {}", flag,
                                   kMaxStagesPerDevice, v));
    }
  }
  std::vector<int> out = values;
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

CLI::Validator optimizer_state_factor_range() {
  return real_number(0.0, 1000.0);
}

}  // namespace pipetune::cli
