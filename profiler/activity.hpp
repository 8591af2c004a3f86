#pragma once

// CUPTI activity records, reduced to what attribution needs, and the attribution itself.
//
// The GPU backend tags every CUDA API call made while a measured region is open (a layer's
// forward or backward at one micro-batch size, one repetition) with the region's id: a
// correlation record (correlation id -> our id) per launch. CUPTI delivers, in buffers, in no
// particular order, kernel and memcpy records carrying the launch's correlation id. This file
// joins them. It knows nothing
// of CUPTI's headers (cuda_backend.cpp translates CUPTI's records), so it is tested on CI with
// fabricated records (kineto's pattern).

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace pipetune::profiler {

struct ActivityRecord {
  enum class Kind : std::uint8_t { Kernel, Memcpy, Memset, ExternalCorrelation };
  Kind kind = Kind::Kernel;
  std::uint64_t start_ns = 0;  ///< CUPTI timestamps (device work only)
  std::uint64_t end_ns = 0;
  std::uint32_t correlation_id = 0;
  std::uint64_t external_id = 0;  ///< ExternalCorrelation only
};

/// A gap between two kernels of a region up to this long is the device moving on to work it
/// already had (about a microsecond on an H100); a longer one is the device waiting for the
/// host to launch the next kernel.
inline constexpr std::uint64_t kQueuedGapNs = 4000;

/// What a region took on the device.
struct RegionTime {
  double span_ms = 0.0;  ///< first start to last end: the kernels and the gaps the host left
  double busy_ms = 0.0;  ///< the kernels' durations alone
  /// The device's own time: the kernels' durations and the gaps of at most kQueuedGapNs
  /// between them, not the waits for the host (those are the host's launch time). Overlapping
  /// work (kernels on several streams) counts once.
  double device_ms = 0.0;
  int records = 0;
  std::uint64_t first_start_ns = 0, last_end_ns = 0;
};

class ActivityAttribution {
 public:
  /// One completed CUPTI buffer's records, in any order; buffers may arrive in any order too.
  void add(std::span<const ActivityRecord> buffer);
  /// CUPTI's count of records it dropped for want of buffer space.
  void note_dropped(std::size_t count) { dropped_ += count; }
  std::size_t dropped() const { return dropped_; }

  /// Per external id: its device work. Work whose correlation never maps to an external id
  /// (launched outside any region) is left out; unmatched() counts it.
  std::map<std::uint64_t, RegionTime> regions() const;
  std::size_t unmatched() const;
  /// Human-readable problems: dropped records; no work joined to any region at all.
  std::vector<std::string> warnings() const;
  void clear();

 private:
  std::vector<ActivityRecord> work_;                              // kernels, copies, sets
  std::unordered_map<std::uint32_t, std::uint64_t> external_of_;  // correlation -> external
  std::size_t dropped_ = 0;
};

/// CUPTI and the host keep different clocks; one pair of readings taken together maps one onto
/// the other (cuptiGetTimestamp and the steady clock, read back to back).
struct ClockMapping {
  std::int64_t offset_ns = 0;  ///< host - cupti
  static ClockMapping from(std::uint64_t cupti_ns, std::uint64_t host_ns) {
    return {static_cast<std::int64_t>(host_ns) - static_cast<std::int64_t>(cupti_ns)};
  }
  std::uint64_t to_host(std::uint64_t cupti_ns) const {
    return static_cast<std::uint64_t>(static_cast<std::int64_t>(cupti_ns) + offset_ns);
  }
};

}  // namespace pipetune::profiler
