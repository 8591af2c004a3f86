// The GPU backend: the caching allocator's statistics for memory; for time, CUPTI's activity
// records (kernel and copy times joined to layers through external correlation ids) or, as the
// fallback, CUDA events around each region. Built where LibTorch has CUDA; tested where a GPU
// exists.

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>

#if PIPETUNE_HAVE_CUPTI
#include <cupti.h>
// Concurrent-kernel records come as the newest kernel record type of the CUPTI we compile with.
#if CUPTI_API_VERSION >= 130200
using KernelRecord = CUpti_ActivityKernel11;
#else
using KernelRecord = CUpti_ActivityKernel10;
#endif
#endif

#include "profiler/activity.hpp"
#include "profiler/backend.hpp"
#include "sim/error.hpp"

namespace pipetune::profiler {

namespace {

#if PIPETUNE_HAVE_CUPTI

// CUPTI hands records over in buffers through C callbacks, so the session is process-wide.
//
// Joining a kernel to its region: every launch is an API call with a correlation id, which
// the kernel's activity record repeats. CUPTI's own external correlation ids are pushed per
// thread, but a backward's kernels are launched by the autograd engine's device thread, not by
// the thread that called backward(), so the session instead watches every runtime and driver
// API call (the callback API) and tags each with the region open at that moment. Regions do
// not overlap on the host: the profiler runs one at a time.
class CuptiSession {
 public:
  static CuptiSession& get() {
    static CuptiSession* session =
        new CuptiSession;  // never destroyed: CUPTI may call back at exit
    return *session;
  }

  // Throws InputError when CUPTI cannot be had (another subscriber holds it).
  void start() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (started_) return;
    CUpti_SubscriberHandle subscriber = nullptr;
    const CUptiResult subscribed =
        cuptiSubscribe(&subscriber, reinterpret_cast<CUpti_CallbackFunc>(&on_api_call), this);
    if (subscribed != CUPTI_SUCCESS) throw_unavailable(subscribed);
    subscriber_ = subscriber;
    check(cuptiEnableDomain(1, subscriber_, CUPTI_CB_DOMAIN_RUNTIME_API), "watch the runtime API");
    check(cuptiEnableDomain(1, subscriber_, CUPTI_CB_DOMAIN_DRIVER_API), "watch the driver API");
    check(cuptiActivityRegisterCallbacks(&buffer_requested, &buffer_completed), "register buffers");
    for (auto kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                      CUPTI_ACTIVITY_KIND_MEMSET}) {
      const CUptiResult r = cuptiActivityEnable(kind);
      if (r != CUPTI_SUCCESS) throw_unavailable(r);
    }
    // One pair of readings maps CUPTI's clock onto the host's.
    std::uint64_t cupti_now = 0;
    cuptiGetTimestamp(&cupti_now);
    const auto host_now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::steady_clock::now().time_since_epoch())
                              .count();
    clock_ = ClockMapping::from(cupti_now, static_cast<std::uint64_t>(host_now));
    started_ = true;
  }

  // Ends collection: nothing more is recorded or delivered, and the API calls of whatever the
  // process does next (a training run) are no longer watched. start() may begin it again.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!started_) return;
      started_ = false;
    }
    close();
    for (auto kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                      CUPTI_ACTIVITY_KIND_MEMSET}) {
      cuptiActivityDisable(kind);
    }
    cuptiEnableDomain(0, subscriber_, CUPTI_CB_DOMAIN_RUNTIME_API);
    cuptiEnableDomain(0, subscriber_, CUPTI_CB_DOMAIN_DRIVER_API);
    cuptiUnsubscribe(subscriber_);
    subscriber_ = nullptr;
    stopping_ = true;  // buffers still in flight are freed, not recorded
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    stopping_ = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      attribution_.clear();
    }
    std::lock_guard<std::mutex> tags(tags_mutex_);
    tagged_.clear();
  }

  // Off: API calls are no longer watched (each watched call costs the host time), so the host's
  // own pace can be timed; on again for the next regions.
  // The activity records go off too: recording them costs the launches time as well, and
  // their records would join no region. Not under mutex_, which buffer_completed() takes on
  // CUPTI's thread (stop() calls CUPTI outside it likewise).
  void watch(bool on) {
    CUpti_SubscriberHandle subscriber = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!started_) return;
      subscriber = subscriber_;
    }
    if (!on) lock_free_flush();
    for (auto kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                      CUPTI_ACTIVITY_KIND_MEMSET}) {
      check(on ? cuptiActivityEnable(kind) : cuptiActivityDisable(kind), "switch activity records");
    }
    check(cuptiEnableDomain(on ? 1 : 0, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API),
          "watch the runtime API");
    check(cuptiEnableDomain(on ? 1 : 0, subscriber, CUPTI_CB_DOMAIN_DRIVER_API),
          "watch the driver API");
  }

  // The region whose launches follow, until close().
  void open(std::uint64_t region) {
    region_.store(region, std::memory_order_release);
    open_.store(true, std::memory_order_release);
  }
  void close() { open_.store(false, std::memory_order_release); }

  // After the device is idle: every record so far, attributed.
  ActivityAttribution& flush() {
    lock_free_flush();
    std::lock_guard<std::mutex> lock(mutex_);
    {
      std::lock_guard<std::mutex> tags(tags_mutex_);
      attribution_.add(tagged_);
      tagged_.clear();
    }
    return attribution_;
  }

 private:
  // CUPTI hands completed buffers to buffer_completed() on this thread or its own.
  void lock_free_flush() {
    check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flush");
  }

  // On whichever thread makes the call: the launch belongs to the region open now.
  static void CUPTIAPI on_api_call(void* self, CUpti_CallbackDomain domain, CUpti_CallbackId,
                                   const CUpti_CallbackData* info) {
    if (domain != CUPTI_CB_DOMAIN_RUNTIME_API && domain != CUPTI_CB_DOMAIN_DRIVER_API) return;
    if (info->callbackSite != CUPTI_API_ENTER) return;
    auto* session = static_cast<CuptiSession*>(self);
    if (!session->open_.load(std::memory_order_acquire)) return;
    const std::uint64_t region = session->region_.load(std::memory_order_acquire);
    std::lock_guard<std::mutex> lock(session->tags_mutex_);
    session->tagged_.push_back(
        {ActivityRecord::Kind::ExternalCorrelation, 0, 0, info->correlationId, region});
  }

  [[noreturn]] static void throw_unavailable(CUptiResult r) {
    const char* what = nullptr;
    cuptiGetResultString(r, &what);
    throw InputError(Input::Timer, "cupti",
                     fmt::format("CUPTI is not available ({}); another tool may hold it (Nsight "
                                 "Systems, Nsight Compute, the torch profiler). Time the layers "
                                 "with CUDA events instead, or close that tool",
                                 what ? what : "unknown error"));
  }
  static void check(CUptiResult r, const char* step) {
    if (r != CUPTI_SUCCESS) {
      const char* what = nullptr;
      cuptiGetResultString(r, &what);
      throw std::runtime_error(fmt::format("CUPTI {}: {}", step, what ? what : "error"));
    }
  }

  static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    constexpr size_t kSize = 8 << 20;
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kSize));
    *size = kSize;
    *max_records = 0;
  }

  static void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t,
                                        size_t valid) {
    std::vector<ActivityRecord> records;
    CUpti_Activity* record = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
      switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        case CUPTI_ACTIVITY_KIND_KERNEL: {
          auto* k = reinterpret_cast<KernelRecord*>(record);
          records.push_back({ActivityRecord::Kind::Kernel, k->start, k->end, k->correlationId, 0});
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(record);
          records.push_back({ActivityRecord::Kind::Memcpy, m->start, m->end, m->correlationId, 0});
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(record);
          records.push_back({ActivityRecord::Kind::Memset, m->start, m->end, m->correlationId, 0});
          break;
        }
        default:
          break;
      }
    }
    size_t dropped = 0;
    cuptiActivityGetNumDroppedRecords(context, stream, &dropped);
    if (!get().stopping_) {
      CuptiSession& s = get();
      std::lock_guard<std::mutex> lock(s.mutex_);
      s.attribution_.add(records);
      s.attribution_.note_dropped(dropped);
    }
    std::free(buffer);
  }

  std::mutex mutex_;
  bool started_ = false;
  CUpti_SubscriberHandle subscriber_ = nullptr;
  ClockMapping clock_;
  ActivityAttribution attribution_;
  std::atomic<bool> open_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> region_{0};
  std::mutex tags_mutex_;               // API callbacks come on any thread
  std::vector<ActivityRecord> tagged_;  // correlation id -> region, as ExternalCorrelation records
};

#endif  // PIPETUNE_HAVE_CUPTI

// An idle GPU runs at a low clock and needs a moment of work to reach its working clock; the
// first layers measured would otherwise read slower than the rest. Keep it busy first.
void spin_up_device(int index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
  at::Tensor a = at::rand({4096, 4096}, at::TensorOptions().device(at::kCUDA, index));
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  while (std::chrono::steady_clock::now() < until) {
    for (int k = 0; k < 8; ++k) a = at::mm(a, a).clamp_(0, 1);
    c10::cuda::device_synchronize();
  }
}

class CudaBackend final : public MeasureBackend {
 public:
  CudaBackend(int index, const std::string& timer) : index_(index) {
    if (!at::cuda::is_available())
      throw InputError(Input::Device, "cuda", "no CUDA device on this machine");
    if (index >= static_cast<int>(c10::cuda::device_count())) {
      throw InputError(Input::Device, fmt::format("cuda:{}", index), "no such CUDA device");
    }
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
    const auto* props = at::cuda::getDeviceProperties(index);
    name_ = props->name;
    memory_ = static_cast<std::int64_t>(props->totalGlobalMem);
#if PIPETUNE_HAVE_CUPTI
    if (timer == "cupti" || timer == "auto") {
      try {
        CuptiSession::get().start();
        cupti_ = true;
      } catch (const InputError&) {
        if (timer == "cupti") throw;
        warnings_.push_back(
            "CUPTI is not available (another tool may hold it): timing with CUDA events instead");
      }
    }
#else
    if (timer == "cupti")
      throw InputError(Input::Timer, "cupti", "this build of pipetune has no CUPTI");
#endif
  }

  // Run by profile_model after it reads the allocator, so that the cuBLAS workspace this thread
  // makes here counts among the library bytes, as a pipeline's compute thread makes its own.
  void spin_up() override {
    spin_up_device(index_);
  }

  ~CudaBackend() override {
#if PIPETUNE_HAVE_CUPTI
    if (cupti_) {
      try {
        c10::cuda::device_synchronize();
      } catch (...) {  // a failed device still lets CUPTI go
      }
      CuptiSession::get().stop();
    }
#endif
  }

  bool launches_asynchronously() const override {
    return true;
  }
  void watch_launches(bool on) override {
#if PIPETUNE_HAVE_CUPTI
    if (cupti_) CuptiSession::get().watch(on);
#else
    (void)on;
#endif
  }
  void synchronize() override {
    c10::cuda::device_synchronize();
  }

  c10::Device device() const override {
    return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index_));
  }
  std::string device_type() const override {
    return "cuda";
  }
  std::string device_name() const override {
    return name_;
  }
  std::int64_t memory_bytes() const override {
    return memory_;
  }
  std::string timer_name() const override {
    return cupti_ ? "cupti" : "cuda-events";
  }

  std::int64_t allocated() override {
    return stat().current;
  }
  std::int64_t peak() override {
    return stat().peak;
  }
  void reset_peak() override {
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(index_));
  }

  void begin(std::uint64_t region) override {
#if PIPETUNE_HAVE_CUPTI
    if (cupti_) {
      CuptiSession::get().open(region);
      return;
    }
#endif
    auto& e = events_[region];
    e.first = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
    e.first->record(at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(index_)));
  }

  void end(std::uint64_t region) override {
#if PIPETUNE_HAVE_CUPTI
    if (cupti_) {
      CuptiSession::get().close();
      return;
    }
#endif
    auto& e = events_[region];
    e.second = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
    e.second->record(at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(index_)));
  }

  std::map<std::uint64_t, double> collect_ms() override {
    c10::cuda::device_synchronize();
    std::map<std::uint64_t, double> out;
#if PIPETUNE_HAVE_CUPTI
    if (cupti_) {
      ActivityAttribution& a = CuptiSession::get().flush();
      // The device's own time; the host's pace is measured apart (launch times), without
      // CUPTI's callbacks slowing it.
      for (const auto& [id, t] : a.regions()) out[id] = t.device_ms;
      for (auto& w : a.warnings()) warnings_.push_back(w);
      a.clear();
      return out;
    }
#endif
    for (auto& [id, e] : events_) {
      if (e.first && e.second) out[id] = e.first->elapsed_time(*e.second);
    }
    events_.clear();
    return out;
  }

  std::vector<std::string> take_warnings() override {
    return std::exchange(warnings_, {});
  }

 private:
  c10::CachingAllocator::Stat stat() {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index_))
        .allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  }

  int index_;
  std::string name_;
  std::int64_t memory_ = 0;
  bool cupti_ = false;
  std::map<std::uint64_t,
           std::pair<std::shared_ptr<at::cuda::CUDAEvent>, std::shared_ptr<at::cuda::CUDAEvent>>>
      events_;
  std::vector<std::string> warnings_;
};

}  // namespace

std::unique_ptr<MeasureBackend> make_cuda_backend(int index, const std::string& timer) {
  return std::make_unique<CudaBackend>(index, timer);
}

}  // namespace pipetune::profiler
