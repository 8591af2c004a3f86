// CUDA devices: one compute stream per device; per copy channel a stream on each side, as
// torchgpipe does, so copies overlap compute; CUDA events for timing and for handing tensors
// between streams; record_stream so the caching allocator cannot hand a buffer to someone
// else while another stream still reads it; the caching allocator's statistics for memory.
// Built only when LibTorch has CUDA; tested where a GPU exists (tests call GTEST_SKIP without).

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "executor/device_runtime.hpp"

namespace pipetune::exec {

namespace {

using c10::cuda::CUDAStream;

std::shared_ptr<at::cuda::CUDAEvent> timed_event() {
  return std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);  // timing enabled
}

class CudaRuntime final : public DeviceRuntime {
 public:
  CudaRuntime(const std::vector<c10::Device>& devices, bool history,
              const std::vector<c10::Stream>& compute_streams)
      : devices_(devices), history_(history), shared_gpu_(!compute_streams.empty()) {
    for (std::size_t d = 0; d < devices_.size(); ++d) {
      compute_.push_back(
          shared_gpu_ ? CUDAStream(compute_streams.at(d))
                      : c10::cuda::getStreamFromPool(/*high_priority=*/false, devices_[d].index()));
    }
    base_.resize(devices_.size());
    memory_base_.resize(devices_.size());
    samples_.resize(devices_.size());
  }

  void bind_compute_thread(int device) override {
    c10::cuda::set_device(devices_[device].index());
    c10::cuda::setCurrentCUDAStream(compute_[device]);
  }

  void bind_copy_thread(int from, int to) override {
    const auto& [source_side, destination_side] = channel(from, to);
    c10::cuda::setCurrentCUDAStream(source_side);
    c10::cuda::setCurrentCUDAStream(destination_side);
    c10::cuda::set_device(devices_[to].index());
  }

  at::Generator make_generator(int device) override {
    return at::cuda::detail::createCUDAGenerator(devices_[device].index());
  }

  at::Tensor adopt(const at::Tensor& tensor, int device) override {
    c10::cuda::CUDAStreamGuard guard(compute_[device]);
    at::Tensor out = tensor.to(devices_[device], /*non_blocking=*/false, /*copy=*/true);
    compute_[device].synchronize();
    return out;
  }

  void count_from(const std::vector<std::int64_t>& held) override {
    for (std::size_t d = 0; d < devices_.size(); ++d) {
      memory_base_[d].count_from(raw_allocated(static_cast<int>(d)), held_on(held, d));
    }
  }

  void begin_step(const std::vector<std::int64_t>& held) override {
    for (std::size_t d = 0; d < devices_.size(); ++d) {
      c10::cuda::CUDAGuard guard(devices_[d].index());
      c10::cuda::device_synchronize();
      c10::cuda::CUDACachingAllocator::resetPeakStats(devices_[d].index());
      memory_base_[d].begin_step(raw_allocated(static_cast<int>(d)), held_on(held, d));
      base_[d] = timed_event();
      base_[d]->record(compute_[d]);
    }
    std::lock_guard<std::mutex> lock(samples_mutex_);
    for (auto& s : samples_) s.clear();
  }

  void end_step() override {
    for (const auto& d : devices_) {
      c10::cuda::CUDAGuard guard(d.index());
      c10::cuda::device_synchronize();
    }
  }

  Stamp now(int device) override {
    Stamp s;
    auto event = timed_event();
    event->record(c10::cuda::getCurrentCUDAStream(devices_[device].index()));
    s.event = event;
    s.device = device;
    return s;
  }

  double resolve(const Stamp& stamp) override {
    auto* event = static_cast<at::cuda::CUDAEvent*>(stamp.event.get());
    return base_[stamp.device]->elapsed_time(*event);
  }

  Handoff publish(const at::Tensor& tensor, int device) override {
    auto event = std::make_shared<at::cuda::CUDAEvent>();
    event->record(compute_[device]);
    return {tensor, event};
  }

  Handoff copy(const Handoff& handoff, int from, int to) override {
    const auto& [source_side, destination_side] = channel(from, to);
    // Both sides wait for the tensor. The stamps and the event below are the destination
    // side's: between two GPUs the copy's own barrier makes it wait anyway, but on SM
    // partitions of one GPU there is no copy, and without this wait the next stage read its
    // input before it was written (seen on an H100: a forward starting 8 ms early).
    auto* ready = static_cast<at::cuda::CUDAEvent*>(handoff.ready.get());
    ready->block(source_side);
    ready->block(destination_side);
    at::Tensor out = handoff.tensor.to(devices_[to], /*non_blocking=*/true);
    // Neither buffer was allocated on the stream that now uses it.
    c10::cuda::CUDACachingAllocator::recordStream(handoff.tensor.storage().data_ptr(), source_side);
    c10::cuda::CUDACachingAllocator::recordStream(out.storage().data_ptr(), destination_side);
    auto event = std::make_shared<at::cuda::CUDAEvent>();
    event->record(destination_side);
    return {out, event};
  }

  at::Tensor depart(const at::Tensor& tensor, int device) override {
    // On the device's compute stream, current on the producer's thread: after the kernels that
    // made the tensor. Blocking, so the host copy is complete when it returns.
    c10::cuda::CUDAStreamGuard guard(compute_[device]);
    return tensor.to(at::TensorOptions(at::kCPU), /*non_blocking=*/false, /*copy=*/false,
                     at::MemoryFormat::Contiguous);
  }

  Handoff arrive(const at::Tensor& host_tensor, int device) override {
    // On the receiving thread's stream (bind_copy_thread); the event tells the consumer's
    // stream when the tensor is on the device.
    const CUDAStream stream = c10::cuda::getCurrentCUDAStream(devices_[device].index());
    at::Tensor out = host_tensor.to(devices_[device], /*non_blocking=*/false);
    auto event = std::make_shared<at::cuda::CUDAEvent>();
    event->record(stream);
    return {out, event};
  }

  at::Tensor consume(const Handoff& handoff, int device) override {
    if (handoff.ready)
      static_cast<at::cuda::CUDAEvent*>(handoff.ready.get())->block(compute_[device]);
    if (handoff.tensor.defined() && handoff.tensor.device() == devices_[device]) {
      c10::cuda::CUDACachingAllocator::recordStream(handoff.tensor.storage().data_ptr(),
                                                    compute_[device]);
    }
    return handoff.tensor;
  }

  std::int64_t allocated(int device) override {
    return memory_base_[device](raw_allocated(device));
  }
  std::int64_t peak(int device) override {
    return memory_base_[device](
        stats(device)
            .allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
            .peak);
  }
  std::int64_t library_bytes(int device) override { return memory_base_[device].library; }
  // The caching allocator hands out blocks in multiples of 512 bytes.
  std::int64_t block_bytes(std::int64_t nbytes) const override {
    return std::max<std::int64_t>(512, (nbytes + 511) / 512 * 512);
  }

  void sample_memory(int device, const Stamp& when) override {
    if (!history_) return;
    const std::int64_t bytes = allocated(device);
    std::lock_guard<std::mutex> lock(samples_mutex_);
    samples_[device].push_back({when, bytes});
  }

  std::vector<std::vector<CounterSample>> memory_history() override {
    std::vector<std::vector<CounterSample>> out(devices_.size());
    std::lock_guard<std::mutex> lock(samples_mutex_);
    for (std::size_t d = 0; d < devices_.size(); ++d) {
      for (const auto& [stamp, bytes] : samples_[d]) out[d].push_back({resolve(stamp), bytes});
      std::sort(out[d].begin(), out[d].end(),
                [](const CounterSample& a, const CounterSample& b) { return a.time < b.time; });
    }
    return out;
  }

 private:
  // What the pipeline holds on device d's allocator: on SM partitions one allocator serves them
  // all, so every device counts the whole GPU's.
  std::int64_t held_on(const std::vector<std::int64_t>& held, std::size_t d) const {
    if (!shared_gpu_) return held[d];
    std::int64_t all = 0;
    for (std::int64_t bytes : held) all += bytes;
    return all;
  }
  std::int64_t raw_allocated(int device) {
    return stats(device)
        .allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
        .current;
  }
  c10::CachingDeviceAllocator::DeviceStats stats(int device) {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(devices_[device].index());
  }

  const std::pair<CUDAStream, CUDAStream>& channel(int from, int to) {
    std::lock_guard<std::mutex> lock(channels_mutex_);
    auto it = channels_.find({from, to});
    if (it == channels_.end()) {
      it = channels_
               .emplace(std::make_pair(from, to),
                        std::make_pair(c10::cuda::getStreamFromPool(false, devices_[from].index()),
                                       c10::cuda::getStreamFromPool(false, devices_[to].index())))
               .first;
    }
    return it->second;
  }

  std::vector<c10::Device> devices_;
  bool history_;
  bool shared_gpu_;  // SM partitions of one GPU
  std::vector<CUDAStream> compute_;
  std::vector<std::shared_ptr<at::cuda::CUDAEvent>> base_;
  std::vector<MemoryBase> memory_base_;
  std::map<std::pair<int, int>, std::pair<CUDAStream, CUDAStream>> channels_;
  std::mutex channels_mutex_;
  std::vector<std::vector<std::pair<Stamp, std::int64_t>>> samples_;
  std::mutex samples_mutex_;
};

}  // namespace

std::unique_ptr<DeviceRuntime> make_cuda_runtime(const std::vector<c10::Device>& devices,
                                                 bool history,
                                                 const std::vector<c10::Stream>& compute_streams) {
  return std::make_unique<CudaRuntime>(devices, history, compute_streams);
}

bool cuda_built() {
  return true;
}

int cuda_device_count() {
  return static_cast<int>(c10::cuda::device_count());
}

std::int64_t cuda_free_bytes(int index) {
  if (index < 0 || index >= cuda_device_count()) return 0;
  try {
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
    // What the quick memory profile before a run left cached would count as used otherwise.
    c10::cuda::CUDACachingAllocator::emptyCache();
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();  // a warning's query: unknown, not an error of the run
      return 0;
    }
    return static_cast<std::int64_t>(free);
  } catch (const c10::Error&) {
    return 0;
  }
}

}  // namespace pipetune::exec
