#include "sim/sweep.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <numeric>

#include "sim/balance.hpp"
#include "sim/error.hpp"
#include "sim/schedule.hpp"
#include "sim/simulator.hpp"

namespace pipetune {

namespace {

// (schedule, stages per device) pairs the grid tries.
std::vector<std::pair<ScheduleKind, int>> schedule_shapes(const SweepSpec& spec) {
  std::vector<std::pair<ScheduleKind, int>> out;
  for (ScheduleKind kind : spec.schedules) {
    if (const auto fixed = fixed_stages_per_device(kind)) {
      out.emplace_back(kind, *fixed);
    } else {
      for (int v : spec.stages_per_device) out.emplace_back(kind, v);
    }
  }
  return out;
}

}  // namespace

namespace {

// Device counts the hardware and the profile allow, a fixed balance some point can use, and
// chunk counts the batch allows: refused before any simulation.
void check_sweep(const Profile& profile, const Hardware& hardware, const SweepSpec& spec) {
  for (int k : spec.device_counts) {
    if (k < 1 || k > static_cast<int>(hardware.devices.size())) {
      throw InputError(Input::Devices, fmt::format("{} devices asked for, the hardware has {}", k,
                                                   hardware.devices.size()));
    }
    if (k > static_cast<int>(profile.layer_count())) {
      throw InputError(Input::Devices, fmt::format("{} stages asked for, the profile has {} layers",
                                                   k, profile.layer_count()));
    }
    // A fixed balance applies to the points with as many stages: k, or k x v for the
    // multi-stage schedules asked for.
    if (!spec.balance.empty()) {
      bool used = false;
      for (const auto& [kind, v] : schedule_shapes(spec)) {
        used = used || static_cast<int>(spec.balance.size()) == k * v;
      }
      if (!used) {
        throw InputError(Input::Balance,
                         fmt::format("{} stages given, but the sweep asks for {} devices and no "
                                     "schedule it tries runs {} stages on them",
                                     spec.balance.size(), k, spec.balance.size()));
      }
    }
  }
  for (int c : spec.chunks) {
    if (c < 1 || c > max_chunks(profile.batch_size)) {
      throw InputError(Input::Chunks, fmt::format("expected {}, got {}",
                                                  chunks_expectation(profile.batch_size), c));
    }
  }
}

// The hardware of a point: its first k devices, and every link at `bandwidth` (0: as given).
Hardware point_hardware(const Hardware& hardware, int k, double bandwidth) {
  Hardware hw = hardware;
  hw.devices.resize(k);
  std::erase_if(hw.links, [k](const LinkOverride& o) { return o.first >= k || o.second >= k; });
  if (bandwidth > 0) set_all_links(hw, bandwidth, std::nullopt);
  return hw;
}

// A point's row: its plan simulated.
SweepRow sweep_row(const Simulator& simulator, const Hardware& hw, const Plan& plan, int k) {
  SimulationOptions lean;
  lean.record_tasks = false;
  lean.record_memory = false;
  const SimulationResult r = simulator.run(plan, lean);
  SweepRow row;
  row.devices = k;
  row.bandwidth_bytes_per_s = hw.link.bandwidth_bytes_per_s;
  row.plan = plan;
  row.micro_batches = static_cast<int>(r.micro_batch_sizes.size());
  row.iteration_ms = r.iteration_ms;
  row.throughput_samples_per_s = r.throughput_samples_per_s;
  row.bubble_fraction = r.bubble_fraction;
  for (const auto& d : r.devices) row.peak_memory_bytes.push_back(d.peak_memory_bytes);
  row.fits = r.fits();
  return row;
}

}  // namespace

std::vector<SweepRow> run_sweep(const Profile& profile, const Hardware& hardware,
                                const SweepSpec& spec,
                                const std::function<void(std::size_t, std::size_t)>& progress) {
  check_sweep(profile, hardware, spec);
  std::vector<double> bandwidths = spec.bandwidths;
  if (bandwidths.empty()) bandwidths.push_back(0.0);  // 0: keep the hardware's links

  const std::size_t total = spec.device_counts.size() * bandwidths.size() *
                            schedule_shapes(spec).size() * spec.checkpoints.size() *
                            spec.chunks.size();
  std::vector<SweepRow> rows;
  rows.reserve(total);
  for (int k : spec.device_counts) {
    for (double bandwidth : bandwidths) {
      const Hardware hw = point_hardware(hardware, k, bandwidth);
      const Simulator simulator(profile, hw);
      for (const auto& [schedule, v] : schedule_shapes(spec)) {
        for (CheckpointMode checkpoint : spec.checkpoints) {
          for (int chunks : spec.chunks) {
            Plan plan;
            plan.chunks = chunks;
            plan.checkpoint = checkpoint;
            plan.schedule = schedule;
            plan.stages_per_device = v;
            plan.optimizer_state_factor = spec.optimizer_state_factor;
            const auto m = micro_batch_count(profile.batch_size, chunks);
            if (k * v > static_cast<int>(profile.layer_count()) ||
                (!spec.balance.empty() && static_cast<int>(spec.balance.size()) != k * v) ||
                schedule_refusal(schedule, k, v, m) || !splits_trainably(profile, chunks)) {
              continue;
            }
            plan.balance = spec.balance.empty() ? time_balanced(simulator.costs(), hw, k * v, plan)
                                                : spec.balance;
            check_plan(plan, profile, hw, "sweep");
            rows.push_back(sweep_row(simulator, hw, plan, k));
            if (progress) progress(rows.size(), total);
          }
        }
      }
    }
  }
  return rows;
}

}  // namespace pipetune
