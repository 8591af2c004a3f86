#pragma once

// What differs between CPU "devices" and CUDA devices, behind one narrow seam, so the pipeline
// runtime is one piece of code and its CPU twin (which CI runs) exercises all of it.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sim/event_engine.hpp"  // CounterSample

namespace pipetune::exec {

/// A point in time on a device's stream: immediate on the CPU, a recorded event on CUDA,
/// read with DeviceRuntime::resolve() once the step is over.
struct Stamp {
  double host_ms = 0.0;
  std::shared_ptr<void> event;
  int device = -1;
};

/// A tensor handed from one thread to another, with what the receiver must wait for before
/// using it (a CUDA event; nothing on the CPU).
struct Handoff {
  at::Tensor tensor;
  std::shared_ptr<void> ready;
};

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;

  /// Once, on each thread, before it runs anything for `device` (compute) or for the copy
  /// channel `from` -> `to` (copy).
  virtual void bind_compute_thread(int device) = 0;
  /// Whether a compute thread's CPU time is its tasks' work: on a CPU device with one intra-op
  /// thread. With more, the pool's other threads do part of it; on a GPU, the kernels.
  virtual bool thread_time_is_work(int /*device*/) const { return false; }
  virtual void bind_copy_thread(int from, int to) = 0;

  /// A generator for dropout on `device`.
  virtual at::Generator make_generator(int device) = 0;

  /// Makes a host tensor the device's own (moved to it, charged to it).
  virtual at::Tensor adopt(const at::Tensor& tensor, int device) = 0;

  /// On the main thread: time origin, peaks restart. `held` is what the pipeline's tensors take
  /// on each device as the step starts (parameters, buffers, optimizer state, micro-batches),
  /// which tells the libraries' bytes apart (library_bytes()).
  virtual void begin_step(const std::vector<std::int64_t>& held) = 0;
  virtual void end_step() = 0;        ///< on the main thread: waits until every device is idle
  virtual Stamp now(int device) = 0;  ///< on a thread bound to `device` (or a copy channel to it)
  virtual double resolve(const Stamp& stamp) = 0;  ///< ms since begin_step, after end_step

  /// On the producer's thread: `tensor` was just produced on `device`.
  virtual Handoff publish(const at::Tensor& tensor, int device) = 0;
  /// On a copy thread: the handed-off tensor copied to `to`.
  virtual Handoff copy(const Handoff& handoff, int from, int to) = 0;
  /// On the producer's thread: `tensor`, made on `device`, in host memory to send to another
  /// process (a GPU's copied there once the kernels that made it are done; the thread waits).
  virtual at::Tensor depart(const at::Tensor& tensor, int device) = 0;
  /// On a receiving thread (bound to the copy channel from the sender to `device`): a tensor
  /// that came from another process in host memory, onto `device`, to consume() there. A CPU
  /// device takes it as it is (its receive buffer was charged to it).
  virtual Handoff arrive(const at::Tensor& host_tensor, int device) = 0;
  /// On the consumer's thread, bound to `device`: the tensor, safe to use there.
  virtual at::Tensor consume(const Handoff& handoff, int device) = 0;

  /// Once the stages are on their devices, with `held` what the pipeline's tensors take there:
  /// from now on a device's bytes are the pipeline's, its allocator's count less what it holds
  /// beyond `held` now. On CUDA the caching allocator serves the whole process: an earlier
  /// pipeline's cuBLAS workspaces and a user's tensors are not the plan's.
  virtual void count_from(const std::vector<std::int64_t>& held) = 0;
  virtual std::int64_t allocated(int device) = 0;
  virtual std::int64_t peak(int device) = 0;  ///< since begin_step
  /// Of the bytes at begin_step, those not in the pipeline's tensors: the libraries' workspaces
  /// (cuBLAS keeps one per stream and thread); 0 on a CPU device.
  virtual std::int64_t library_bytes(int device) = 0;
  /// The bytes a tensor storage of `nbytes` takes in this runtime's allocator.
  virtual std::int64_t block_bytes(std::int64_t nbytes) const { return nbytes; }
  /// Memory over the step, per device (the exact curve on the CPU; samples at task boundaries
  /// on CUDA). Called after end_step.
  virtual std::vector<std::vector<CounterSample>> memory_history() = 0;
  /// Called at task boundaries on compute threads (CUDA samples memory there).
  virtual void sample_memory(int device, const Stamp& when) = 0;
};

/// One device's allocator count, read as the pipeline's (see DeviceRuntime::allocated). Both
/// runtimes keep one per device and feed it their allocator's raw count.
struct MemoryBase {
  std::int64_t before = 0;   ///< not the pipeline's (count_from)
  std::int64_t library = 0;  ///< the libraries' bytes at the last begin_step
  void count_from(std::int64_t raw, std::int64_t held) { before = raw - held; }
  void begin_step(std::int64_t raw, std::int64_t held) { library = (*this)(raw)-held; }
  std::int64_t operator()(std::int64_t raw) const { return raw - before; }
};

/// CPU devices: worker threads, a counting allocator, the steady clock.
std::unique_ptr<DeviceRuntime> make_cpu_runtime(int devices, int threads_per_device, bool history);

/// CUDA devices (only when built with CUDA; nullptr otherwise): one compute stream per device,
/// a copy stream per channel, CUDA events for timing and handoffs, the caching allocator's
/// statistics for memory. `compute_streams`, when given, are the devices' compute streams (SM
/// partitions, sm_partitions.hpp: every device the same GPU); each device's memory is then the
/// whole GPU's, the pipeline's bytes on all of them.
std::unique_ptr<DeviceRuntime> make_cuda_runtime(const std::vector<c10::Device>& devices,
                                                 bool history,
                                                 const std::vector<c10::Stream>& compute_streams);

/// Whether this build can run CUDA devices, and how many this machine has.
bool cuda_built();
int cuda_device_count();
/// Bytes a run can still allocate on CUDA device `index` now: free memory once this process's
/// caching allocator has handed back the blocks it keeps unused. The device's memory less this
/// is what its CUDA context, other processes and this process's live tensors hold. 0 without
/// CUDA.
std::int64_t cuda_free_bytes(int index);

}  // namespace pipetune::exec
