#pragma once

// Per-device memory accounting on the CPU, the twin of the CUDA caching allocator's statistics.
//
// On a CPU every "device" of a pipeline shares one allocator, so this one wraps it and charges
// each allocation to the device of the thread that makes it (a thread-local tag set by the
// executor's workers). Each block carries a small header with its device and size, so a free
// on another thread is charged back correctly without a lookup table. Freed blocks are cached
// for reuse, like the CUDA caching allocator's; "allocated" counts live tensors only.

#include <chrono>
#include <cstdint>
#include <vector>

#include "sim/event_engine.hpp"  // CounterSample

namespace pipetune::exec {

constexpr int kMaxTrackedDevices = 64;

class CountingAllocator {
 public:
  /// Installs the allocator as the process's CPU allocator (once; later calls return it).
  static CountingAllocator& install();

  /// Charges this thread's allocations to `device` (-1: untracked) while alive.
  class DeviceScope {
   public:
    explicit DeviceScope(int device);
    ~DeviceScope();
    DeviceScope(const DeviceScope&) = delete;
    DeviceScope& operator=(const DeviceScope&) = delete;

   private:
    int previous_;
  };
  static int current_device();

  std::int64_t allocated(int device) const;
  std::int64_t peak(int device) const;
  void reset_peak(int device);  ///< the peak restarts from the current value
  /// Starts a measurement: peaks restart from the current values, and, when `history` is set,
  /// every change of a device in `devices` is recorded with its time since `origin`.
  void begin_recording(const std::vector<int>& devices, bool history,
                       std::chrono::steady_clock::time_point origin);
  /// Ends it; returns each recorded device's history (in the order given to begin_recording).
  std::vector<std::vector<CounterSample>> end_recording();

  void charge(int device, std::int64_t bytes);  ///< used by the allocator's blocks

  /// Gives `device` a memory of `bytes` (0: unlimited, the default): an allocation that would
  /// take it beyond throws c10::OutOfMemoryError, as a full GPU does. How CPU runs and tests
  /// meet an out-of-memory mid-step without a GPU.
  void set_capacity(int device, std::int64_t bytes);
  /// Throws c10::OutOfMemoryError if `bytes` more would exceed `device`'s capacity.
  void check_capacity(int device, std::int64_t bytes);

 private:
  CountingAllocator() = default;
  struct State;
  State* state();
};

}  // namespace pipetune::exec
