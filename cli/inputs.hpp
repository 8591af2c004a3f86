#pragma once

// Flags that several subcommands share (profile, devices and plan) and how they become the
// sim/ types. Every bad value becomes an InputError that names the flag or file.

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "sim/hardware.hpp"
#include "sim/plan.hpp"
#include "sim/profile.hpp"
#include "sim/schedule.hpp"

namespace pipetune::cli {

struct HardwareFlags {
  std::string hardware_path;
  int devices = 0;
  std::string memory;     ///< per device, e.g. "16GiB"
  std::string bandwidth;  ///< default link, bytes/s, e.g. "25e9" or "25GB"
  double latency_ms = -1.0;
};

struct PlanFlags {
  std::string plan_path;
  std::vector<int> balance;
  std::optional<int> chunks;
  std::optional<std::string> checkpoint;
  std::optional<std::string> schedule;
  std::optional<int> stages_per_device;
  std::vector<std::string> stage_devices;
  std::optional<double> optimizer_state_factor;
};

void add_profile_flag(CLI::App& app, std::string& profile_path);
/// `devices_as_count`: --devices N (simulate, plan); sweep registers its own list instead.
void add_hardware_flags(CLI::App& app, HardwareFlags& flags, bool devices_as_count = true);
void add_plan_flags(CLI::App& app, PlanFlags& flags);

/// The devices to simulate: --hardware, else `default_count` (or --devices) copies of the
/// profile's device with ideal links; then `note` says so, for the caller to print once the
/// inputs have been checked. Overrides apply on top. A `default_count` of 0 says that each plan
/// will get its own count (simulate --plans): one device is returned, to check the flags.
Hardware resolve_hardware(const Profile& profile, const HardwareFlags& flags, int default_count,
                          std::string* note);
/// Prints a note from resolve_hardware on stderr (nothing when empty).
void print_note(const std::string& note);

/// The plan from --plan and/or the inline flags (inline ones override the file's fields).
/// Not yet checked against a profile: that is check_plan's job.
Plan resolve_plan(const PlanFlags& flags);
/// The devices a plan needs without a `devices` mapping: one per stage, or per programme of
/// stages_per_device stages.
int device_count(const Plan& plan);

/// --schedule-csv: the plan runs `schedule` (read from `path`): programme r on device_names[r],
/// unless the plan names devices; no recomputes (torch's CSV has none). Refuses more programmes
/// than devices, or a balance with another stage count. simulate passes the hardware's names,
/// run the executor's ("cpu:0", …).
void use_schedule_csv(const Schedule& schedule, const std::string& path,
                      const std::vector<std::string>& device_names, Plan& plan);
void use_schedule_csv(const Schedule& schedule, const std::string& path, const Hardware& hardware,
                      Plan& plan);

/// --write-schedule-csv: one row per device that holds stages, in device order, as torch's
/// ranks run them; says on stderr how many recomputes it left out.
void write_schedule_csv(const Schedule& schedule, const std::vector<int>& device_of,
                        const Hardware& hardware, const std::string& path);

/// What to call the plan in error messages: its file, or "command line".
std::string plan_source(const PlanFlags& flags);

std::vector<CheckpointMode> parse_checkpoint_list(const std::vector<std::string>& names,
                                                  const std::string& flag);
/// "all" is every schedule the simulator knows (kAllScheduleKinds); names repeated count once.
std::vector<ScheduleKind> parse_schedule_list(const std::vector<std::string>& names,
                                              const std::string& flag);
/// The stages per device a search tries with the interleaved and looped schedules (zbv always
/// runs 2): 2 to kMaxStagesPerDevice, sorted, each once; InputError naming `flag` otherwise.
inline constexpr int kMaxStagesPerDevice = 64;
std::vector<int> parse_stages_per_device_list(const std::vector<int>& values,
                                              const std::string& flag);
double parse_bandwidth(const std::string& text, const std::string& flag);
/// A --memory value in bytes, 0 to 64 TiB; InputError naming `flag` otherwise.
std::int64_t parse_memory(const std::string& text, const std::string& flag);

/// --optimizer-state-factor's check for plan and sweep: a number from 0 to 1000, the plan file's
/// bound (CLI::NonNegativeNumber lets NaN through).
CLI::Validator optimizer_state_factor_range();

}  // namespace pipetune::cli
