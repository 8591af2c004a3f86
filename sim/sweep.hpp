#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sim/hardware.hpp"
#include "sim/plan.hpp"
#include "sim/profile.hpp"

namespace pipetune {

/// A what-if grid: every combination of the lists is simulated.
struct SweepSpec {
  std::vector<int> device_counts;  ///< stages = devices, one stage per device
  std::vector<int> chunks;
  std::vector<CheckpointMode> checkpoints;
  std::vector<ScheduleKind> schedules;
  /// Stages per device tried with each multi-stage schedule (zbv: 2 only); GPipe and 1F1B run
  /// one. Points torch refuses (micro-batches, or more stages than layers) are left out.
  std::vector<int> stages_per_device{2};
  std::vector<double> bandwidths;  ///< link bandwidths (bytes/s); empty: the hardware's
  std::vector<int> balance;        ///< fixed balance; empty: time_balanced() per point
  double optimizer_state_factor = 0.0;
};

struct SweepRow {
  int devices = 0;
  double bandwidth_bytes_per_s = 0.0;  ///< the default link's (infinity: ideal)
  Plan plan;
  int micro_batches = 0;  ///< as tensor.chunk splits the batch
  double iteration_ms = 0.0;
  double throughput_samples_per_s = 0.0;
  double bubble_fraction = 0.0;
  std::vector<std::int64_t> peak_memory_bytes;  ///< per device
  bool fits = true;
};

/// `hardware` gives devices and links: a point with k devices uses its first k. Throws
/// InputError when a list asks for more devices than it has, chunks above the batch size, or a
/// fixed balance for a different stage count. `progress(done, total)` is called as it goes.
std::vector<SweepRow> run_sweep(const Profile& profile, const Hardware& hardware,
                                const SweepSpec& spec,
                                const std::function<void(std::size_t, std::size_t)>& progress = {});

}  // namespace pipetune
