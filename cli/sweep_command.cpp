#include <algorithm>
#include <cstdio>
#include <memory>

#include "cli/commands.hpp"
#include "cli/inputs.hpp"
#include "cli/number_flags.hpp"
#include "cli/progress.hpp"
#include "cli/report.hpp"
#include "sim/error.hpp"
#include "sim/limits.hpp"
#include "sim/sweep.hpp"

namespace pipetune::cli {

namespace {
struct SweepFlags {
  std::string profile;
  std::string hardware;
  std::vector<int> devices;
  std::string memory;
  std::vector<std::string> bandwidths;
  double latency_ms = -1.0;
  std::vector<int> chunks;
  std::vector<std::string> checkpoints{"all"};
  std::vector<std::string> schedules{"all"};
  std::vector<int> stages_per_device{2};
  std::vector<int> balance;
  double optimizer_state_factor = 0.0;
  std::string format = "table";
  bool json = false;
  bool sort = false;
};

// The sweep command's flags.
void declare_sweep_flags(CLI::App& sub, SweepFlags& flags) {
  add_profile_flag(sub, flags.profile);
  sub.add_option("--hardware", flags.hardware,
                 "hardware.json (a point with k devices uses its first k)")
      ->type_name("FILE");
  sub.add_option("--devices", flags.devices,
                 "device counts, e.g. 2,4,8 (one stage each, or --stages-per-device with the "
                 "looped and V schedules)")
      ->delimiter(',')
      ->type_name("N,...")
      ->check(whole_number(1, limits::kMaxDevices));
  sub.add_option("--memory", flags.memory, "memory of every device, e.g. 16GiB")->type_name("SIZE");
  sub.add_option("--bandwidth", flags.bandwidths,
                 "link bandwidths in bytes/s, e.g. 10e9,25e9,ideal")
      ->delimiter(',')
      ->type_name("B,...");
  sub.add_option("--latency-ms", flags.latency_ms, "link latency in milliseconds")
      ->check(real_number(0.0, limits::kMaxMs));
  sub.add_option("--chunks", flags.chunks,
                 "chunk counts (default: powers of two up to the batch size, and the batch size)")
      ->delimiter(',')
      ->type_name("M,...")
      ->check(whole_number(1, limits::kMaxChunks));
  sub.add_option("--checkpoint", flags.checkpoints, "always,except_last,never or all (default all)")
      ->delimiter(',')
      ->type_name("MODE,...");
  sub.add_option(
         "--schedule", flags.schedules,
         "gpipe,1f1b,interleaved-1f1b,interleaved-zb,zbv,looped-bfs,dualpipev or all (default all)")
      ->delimiter(',')
      ->type_name("KIND,...");
  sub.add_option("--stages-per-device", flags.stages_per_device,
                 "stages per device with interleaved-1f1b, interleaved-zb and looped-bfs "
                 "(default 2; zbv and dualpipev run 2)")
      ->delimiter(',')
      ->type_name("V,...")
      ->check(whole_number(1, kMaxStagesPerDevice));
  sub.add_option("--balance", flags.balance,
                 "fixed layers per stage (default: the time-balanced split at every point)")
      ->delimiter(',')
      ->type_name("N,...")
      ->check(whole_number_from(0));
  sub.add_option("--optimizer-state-factor", flags.optimizer_state_factor,
                 "optimizer state bytes per parameter byte: 0 SGD, 1 momentum, 2 Adam")
      ->check(optimizer_state_factor_range());
  sub.add_option("--format", flags.format, "table, csv or json")
      ->check(CLI::IsMember({"table", "csv", "json"}));
  sub.add_flag("--json", flags.json, "same as --format json");
  sub.add_flag("--sort", flags.sort, "fastest first");
}

// The points to sweep: the flags' lists, or their defaults for this profile and hardware.
SweepSpec sweep_spec(const SweepFlags& flags, const Profile& profile, const Hardware& hardware) {
  SweepSpec spec;
  spec.device_counts = flags.devices.empty()
                           ? std::vector<int>{static_cast<int>(hardware.devices.size())}
                           : flags.devices;
  spec.chunks = flags.chunks;
  if (spec.chunks.empty()) {
    const int most_chunks = max_chunks(profile.batch_size);
    for (int c = 1; c < most_chunks; c *= 2) spec.chunks.push_back(c);
    spec.chunks.push_back(most_chunks);
  }
  spec.checkpoints = parse_checkpoint_list(flags.checkpoints, "--checkpoint");
  spec.schedules = parse_schedule_list(flags.schedules, "--schedule");
  spec.stages_per_device =
      parse_stages_per_device_list(flags.stages_per_device, "--stages-per-device");
  for (const auto& b : flags.bandwidths) {
    spec.bandwidths.push_back(parse_bandwidth(b, "--bandwidth"));
  }
  spec.balance = flags.balance;
  spec.optimizer_state_factor = flags.optimizer_state_factor;

  return spec;
}

int run_sweep_command(const SweepFlags& flags) {
  const Profile profile = load_profile(flags.profile);
  if (flags.devices.empty() && flags.hardware.empty()) {
    throw InputError("--devices: give device counts (e.g. --devices 2,4) or --hardware FILE");
  }
  HardwareFlags hw_flags;
  hw_flags.hardware_path = flags.hardware;
  hw_flags.memory = flags.memory;
  hw_flags.latency_ms = flags.latency_ms;
  const int most =
      flags.devices.empty() ? 0 : *std::max_element(flags.devices.begin(), flags.devices.end());
  std::string note;
  const Hardware hardware = resolve_hardware(profile, hw_flags, most, &note);

  const SweepSpec spec = sweep_spec(flags, profile, hardware);
  print_note(note);
  ProgressBar bar("plans");
  std::vector<SweepRow> rows =
      run_sweep(profile, hardware, spec,
                [&](std::size_t done, std::size_t total) { bar.update(done, total); });
  bar.finish();
  if (flags.sort) {
    std::stable_sort(rows.begin(), rows.end(), [](const SweepRow& a, const SweepRow& b) {
      return a.iteration_ms < b.iteration_ms;
    });
  }
  const std::string format = flags.json ? "json" : flags.format;
  const std::string out = format == "json"  ? sweep_json(rows)
                          : format == "csv" ? sweep_csv(rows)
                                            : sweep_table(rows);
  std::fputs(out.c_str(), stdout);
  return 0;
}

}  // namespace

void add_sweep_command(CLI::App& app, std::vector<Command>& commands) {
  auto flags = std::make_shared<SweepFlags>();
  CLI::App* sub =
      app.add_subcommand("sweep",
                         "What-if table: simulate every combination of devices, links, chunks, "
                         "checkpoint modes and schedules");
  declare_sweep_flags(*sub, *flags);
  commands.emplace_back(sub, [flags] { return run_sweep_command(*flags); });
}

}  // namespace pipetune::cli
