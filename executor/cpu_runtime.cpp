// The CPU twin of the CUDA runtime: a "device" is a worker thread with its own intra-op thread
// count; a copy is a clone made by the channel's thread and charged to the receiving device.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <chrono>

#include "executor/counting_allocator.hpp"
#include "executor/device_runtime.hpp"
#include "executor/openmp_pool.hpp"

namespace pipetune::exec {

namespace {

class CpuRuntime final : public DeviceRuntime {
 public:
  CpuRuntime(int devices, int threads_per_device, bool history)
      : devices_(devices),
        threads_(threads_per_device),
        history_(history),
        allocator_(CountingAllocator::install()) {}

  void count_from(const std::vector<std::int64_t>& held) override {
    for (int d = 0; d < devices_; ++d) base_[d].count_from(allocator_.allocated(d), held[d]);
  }

  void bind_compute_thread(int device) override {
    scope_ = std::make_unique<CountingAllocator::DeviceScope>(device);
    // With OpenMP this sets the calling thread's own pool size: each device gets its share.
    at::set_num_threads(threads_);
  }
  bool thread_time_is_work(int) const override { return threads_ == 1; }
  void bind_copy_thread(int, int to) override {
    scope_ = std::make_unique<CountingAllocator::DeviceScope>(to);
    at::set_num_threads(1);
  }

  at::Generator make_generator(int) override { return at::detail::createCPUGenerator(); }

  at::Tensor depart(const at::Tensor& tensor, int) override { return tensor; }
  Handoff arrive(const at::Tensor& host_tensor, int) override { return {host_tensor, nullptr}; }

  at::Tensor adopt(const at::Tensor& tensor, int device) override {
    CountingAllocator::DeviceScope scope(device);
    return tensor.clone();
  }

  void begin_step(const std::vector<std::int64_t>& held) override {
    // The stepping thread only waits from here on; a pool it kept (from loading, profiling or
    // this step's input copies) would make the devices' pools sleep between parallel regions.
    release_openmp_pool_of_this_thread();
    origin_ = std::chrono::steady_clock::now();
    std::vector<int> all(devices_);
    for (int d = 0; d < devices_; ++d) all[d] = d;
    allocator_.begin_recording(all, history_, origin_);
    // The same accounting as on CUDA, so that this twin exercises it: here the allocator's count
    // and the pipeline's tensors agree (library_bytes() is 0; a test holds it to that).
    for (int d = 0; d < devices_; ++d) base_[d].begin_step(allocator_.allocated(d), held[d]);
  }
  void end_step() override {
    history_samples_ = allocator_.end_recording();
    for (std::size_t d = 0; d < history_samples_.size(); ++d) {
      for (auto& sample : history_samples_[d]) sample.value = base_[d](sample.value);
    }
  }

  Stamp now(int device) override {
    Stamp s;
    s.host_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - origin_)
            .count();
    s.device = device;
    return s;
  }
  double resolve(const Stamp& stamp) override { return stamp.host_ms; }

  Handoff publish(const at::Tensor& tensor, int) override { return {tensor, nullptr}; }
  Handoff copy(const Handoff& handoff, int, int) override {
    // This thread is charged to the receiving device (bind_copy_thread).
    return {handoff.tensor.clone(), nullptr};
  }
  at::Tensor consume(const Handoff& handoff, int) override { return handoff.tensor; }

  std::int64_t allocated(int device) override {
    return base_[device](allocator_.allocated(device));
  }
  std::int64_t peak(int device) override { return base_[device](allocator_.peak(device)); }
  std::int64_t library_bytes(int device) override { return base_[device].library; }
  std::vector<std::vector<CounterSample>> memory_history() override { return history_samples_; }
  void sample_memory(int, const Stamp&) override {}  // the allocator records every change

 private:
  int devices_, threads_;
  bool history_;
  CountingAllocator& allocator_;
  std::chrono::steady_clock::time_point origin_;
  std::vector<std::vector<CounterSample>> history_samples_;
  std::vector<MemoryBase> base_ = std::vector<MemoryBase>(static_cast<std::size_t>(devices_));
  static thread_local std::unique_ptr<CountingAllocator::DeviceScope> scope_;
};

thread_local std::unique_ptr<CountingAllocator::DeviceScope> CpuRuntime::scope_;

}  // namespace

std::unique_ptr<DeviceRuntime> make_cpu_runtime(int devices, int threads_per_device, bool history) {
  return std::make_unique<CpuRuntime>(devices, threads_per_device, history);
}

}  // namespace pipetune::exec
