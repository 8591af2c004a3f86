#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sim/profile.hpp"

namespace pipetune {

/// A one-way copy channel between two devices. A copy of n bytes occupies it for
/// latency + n / bandwidth; copies in one direction queue, the other direction is independent.
struct Link {
  double bandwidth_bytes_per_s = std::numeric_limits<double>::infinity();
  double latency_ms = 0.0;

  double transfer_ms(double bytes) const {
    return latency_ms + (bandwidth_bytes_per_s == std::numeric_limits<double>::infinity()
                             ? 0.0
                             : bytes / bandwidth_bytes_per_s * 1e3);
  }
  bool ideal() const {
    return latency_ms == 0.0 && bandwidth_bytes_per_s == std::numeric_limits<double>::infinity();
  }
};

struct HardwareDevice {
  std::string name;
  std::int64_t memory_bytes = 0;  ///< 0: unknown, no limit is enforced
  double speed = 1.0;             ///< relative to the profiled device: time = profiled / speed
  /// Optional ("": a whole device): the GPU whose SMs this device is a share of (`run
  /// --sm-partitions`). Where two or more devices are shares of one GPU, they run their
  /// backwards' launches on one host thread, autograd's for that GPU, so those launches take
  /// turns, and they hold their tensors in the GPU's one memory (docs/memory-model.md).
  std::string share_of;
};

/// A link that differs from the default for one pair of devices (both directions).
struct LinkOverride {
  int first = 0;
  int second = 0;
  Link link;
};

/// What a short calibration run measured that a per-layer profile cannot know (validate fits
/// it; docs/formats.md). The simulator applies it to every plan (by the number of devices the
/// plan keeps busy), the planner up front; plans are never fitted individually.
struct Calibration {
  /// Measured compute-task time over profiled time, by how many devices the plan keeps busy
  /// (on a CPU, devices share cores and memory bandwidth, so more devices, more slowdown).
  std::map<int, double> compute_scale;
  double task_overhead_ms = 0.0;       ///< added to every compute task: the runtime's own share
  std::optional<Link> copy;            ///< copies as measured under load, if any were
  std::vector<std::string> fitted_on;  ///< the plans it was fitted on
  bool empty() const { return compute_scale.empty() && task_overhead_ms == 0.0 && !copy; }
  /// The scale for a plan keeping `devices` busy: the nearest count measured (1.0 if none).
  double scale_for(int devices) const;
};

/// The runtime a prediction is for. torch.distributed.pipelining keeps what pipetune's executor
/// frees: a receive buffer per stage, micro-batch and direction for the whole run, and the last
/// stage's outputs until the step ends, where it concatenates them (docs/memory-model.md).
enum class Runtime { Pipetune, TorchPipelining };

inline constexpr std::string_view kTorchPipeliningRuntime = "torch.distributed.pipelining";

/// Whether `stage`'s split backward does all its work at W: torch's runtime skips
/// stage_backward_input on the model's first stage (its input needs no gradient) and runs that
/// stage's whole backward at W, so its I is an action of no work (docs/torch.md).
inline bool whole_backward_at_weight(Runtime runtime, int stage) {
  return runtime == Runtime::TorchPipelining && stage == 0;
}

/// Devices and the links between them (format pipetune.hardware/1).
struct Hardware {
  std::vector<HardwareDevice> devices;
  Link link;  ///< between any two devices without an override
  std::vector<LinkOverride> links;
  double launch_overhead_ms = 0.0;  ///< added to every compute task
  /// Each receive's buffer exists from when the receiver posts it (once its previous receive
  /// from the same device is in; the step's first at the step's start), not from when its data
  /// comes: pipetune's transport between processes (`run --distributed`) posts them early.
  bool posted_receives = false;
  Runtime runtime = Runtime::Pipetune;
  /// Optional (0: unknown): how far the simulator's iteration times were off on this machine,
  /// relative, as a standard deviation (the root mean square of the errors `pipetune validate`
  /// measured on its calibration runs, out of sample where a calibration is used). It widens
  /// every prediction's interval (sim/interval.hpp).
  double model_error = 0.0;
  Calibration calibration;  ///< empty unless a calibration run filled it

  const Link& link_between(int from, int to) const;
  /// The link a simulated copy from `from` to `to` takes: the calibration's measured one where
  /// it has one (it replaces every link), else link_between().
  const Link& copy_link(int from, int to) const {
    return calibration.copy ? *calibration.copy : link_between(from, to);
  }
  int device_index(std::string_view name) const;  ///< -1 when unknown
};

/// Sets every link's bandwidth and/or latency (the default link and each override). A link the
/// user sets replaces the one calibration measured under load, so that link is dropped: a what-if
/// on the link must change the prediction.
void set_all_links(Hardware& hardware, std::optional<double> bandwidth_bytes_per_s,
                   std::optional<double> latency_ms);

inline constexpr std::string_view kHardwareFormat = "pipetune.hardware/1";

Hardware parse_hardware(std::string_view text, const std::string& source);
Hardware load_hardware(const std::string& path);
std::string hardware_to_json(const Hardware& hardware);
void save_hardware(const Hardware& hardware, const std::string& path);

/// The hardware as calibration says it behaves for a plan keeping `devices_used` devices busy:
/// speeds divided by the compute scale, the task overhead added, the link replaced by the one
/// measured under load, and the calibration emptied (it is applied). Unchanged when there is
/// no calibration.
Hardware calibrated(const Hardware& hardware, int devices_used);

/// `count` copies of the profiled device joined by ideal links: what the simulator assumes when
/// no hardware file is given. Names are "<type>:<index>"; where the profile was taken on a share
/// of a GPU's SMs, the copies are shares of "<type>:0", as `run --sm-partitions` makes them.
Hardware replicate_device(const ProfileDevice& device, int count);

/// The hardware's first `count` devices (all of them where it has no more) and the link
/// overrides among them.
Hardware first_devices(Hardware hardware, int count);

/// By device: the index of the GPU it is a share of (HardwareDevice::share_of) among the GPUs two
/// or more devices are shares of, numbered from 0 in the order of their names; -1 for a device
/// of its own (a `share_of` no other device names included).
std::vector<int> shared_gpus(const Hardware& hardware);

/// By device: the memory it allocates from, named by the lowest-numbered device using it (itself,
/// or the first share of the same GPU: shares split a GPU's SMs, not its memory).
std::vector<int> device_memories(const Hardware& hardware);

}  // namespace pipetune
