#pragma once

// Where the profiler measures: the clock and the memory counters of one device, behind a
// narrow seam so the layer-by-layer procedure is the same on a CPU and a GPU.

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sim/event_engine.hpp"  // CounterSample

namespace pipetune::profiler {

class MeasureBackend {
 public:
  virtual ~MeasureBackend() = default;
  virtual c10::Device device() const = 0;
  virtual std::string device_type() const = 0;    ///< "cpu", "cuda"
  virtual std::string device_name() const = 0;    ///< the device's model
  virtual std::int64_t memory_bytes() const = 0;  ///< capacity; 0: unknown
  virtual std::string timer_name() const = 0;     ///< "clock", "cuda-events", "cupti"

  /// Bytes allocated on the device now, and the most since reset_peak().
  virtual std::int64_t allocated() = 0;
  virtual std::int64_t peak() = 0;
  virtual void reset_peak() = 0;
  /// Whether follow_levels() works here; not on a GPU, whose caching allocator changes as the
  /// host queues the work, ahead of the kernels that use it.
  virtual bool follows_levels() const { return false; }
  /// Starts recording every change of the allocated bytes with its time (ms since `origin`).
  virtual void follow_levels(std::chrono::steady_clock::time_point /*origin*/) {}
  /// The changes since follow_levels() (the level then first), and stops recording.
  virtual std::vector<CounterSample> followed_levels() { return {}; }

  /// Brackets the work of one region (a layer's forward or backward, one repetition).
  virtual void begin(std::uint64_t region) = 0;
  virtual void end(std::uint64_t region) = 0;
  /// Waits for the device, then returns each region's time (ms) since the last collect.
  virtual std::map<std::uint64_t, double> collect_ms() = 0;
  /// Brings the device to its working clock before anything is measured (a GPU idles low).
  virtual void spin_up() {}
  /// Whether the host returns from a layer's call before the device has done its work (a GPU:
  /// kernels are queued), so that the host's own pace is a second time worth measuring.
  virtual bool launches_asynchronously() const { return false; }
  /// Turns the region timer's watching of the host off and on again: CUPTI's callbacks on
  /// every API call slow the host down, so the host's own pace is measured without them.
  virtual void watch_launches(bool /*on*/) {}
  /// Waits until the device has done everything it was given.
  virtual void synchronize() {}
  /// Problems worth telling the user (dropped CUPTI records, …); cleared when read.
  virtual std::vector<std::string> take_warnings() { return {}; }
};

/// The CPU with `threads` intra-op threads (0: leave torch's setting), the steady clock, and
/// the counting allocator (the same one the executor charges CPU devices with).
std::unique_ptr<MeasureBackend> make_cpu_backend(int threads);

/// CUDA device `index`. `timer`: "cupti" (CUPTI's activity records), "events" (CUDA events
/// around each region), or "auto" (CUPTI if available). Throws InputError when CUDA is not
/// there, or when CUPTI is asked for and another tool holds it.
std::unique_ptr<MeasureBackend> make_cuda_backend(int index, const std::string& timer);

}  // namespace pipetune::profiler
