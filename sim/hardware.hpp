#pragma once

#include <cstdint>
#include <limits>
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
};

/// A link that differs from the default for one pair of devices (both directions).
struct LinkOverride {
  int first = 0;
  int second = 0;
  Link link;
};

/// Devices and the links between them (format pipetune.hardware/1).
struct Hardware {
  std::vector<HardwareDevice> devices;
  Link link;  ///< between any two devices without an override
  std::vector<LinkOverride> links;
  double launch_overhead_ms = 0.0;  ///< added to every compute task
  /// Fitted by a calibration run (see docs/formats.md); kept verbatim, "" if none.
  std::string calibration_json;

  const Link& link_between(int from, int to) const;
  int device_index(std::string_view name) const;  ///< -1 when unknown
};

inline constexpr std::string_view kHardwareFormat = "pipetune.hardware/1";

Hardware parse_hardware(std::string_view text, const std::string& source);
Hardware load_hardware(const std::string& path);
std::string hardware_to_json(const Hardware& hardware);
void save_hardware(const Hardware& hardware, const std::string& path);

/// `count` copies of the profiled device joined by ideal links: what the simulator assumes when
/// no hardware file is given. Names are "<type>:<index>".
Hardware replicate_device(const ProfileDevice& device, int count);

}  // namespace pipetune
