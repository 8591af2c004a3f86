#include "executor/counting_allocator.hpp"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <mutex>
#include <unordered_map>

namespace pipetune::exec {

namespace {

thread_local int tagged_device = -1;

// Every block starts with this header; the payload follows at kHeader bytes, which keeps it as
// aligned as the default allocator's. The payload pointer is also the DataPtr's context, as
// raw_allocate() requires, and the header tells the deleter everything else. (The inner
// allocation is never returned: the cache below keeps it.)
constexpr std::size_t kHeader = 64;
struct Header {
  void* inner_context;
  c10::DeleterFnPtr inner_deleter;
  std::int64_t bytes;
  int device;
};
static_assert(sizeof(Header) <= kHeader);

}  // namespace

struct CountingAllocator::State {
  // A line of its own per device: every allocation updates its device's counters, and devices'
  // worker threads sharing one line would pass it between their cores on each tensor.
  struct alignas(64) Counters {
    std::atomic<std::int64_t> current{0};
    std::atomic<std::int64_t> peak{0};
    std::atomic<std::int64_t> capacity{0};  // 0: unlimited
  };
  std::array<Counters, kMaxTrackedDevices> devices{};
  // A step's samples, per device on a line of its own, under a lock only that device's tensors
  // take: with one lock for every device's samples, the workers took turns on it tensor by
  // tensor, and a vCPU descheduled while holding it stalled the other worker too.
  struct alignas(64) History {
    std::mutex mutex;
    bool recording = false;
    std::chrono::steady_clock::time_point origin;
    std::vector<CounterSample> samples;
  };
  std::array<History, kMaxTrackedDevices> histories;
  std::atomic<bool> history{false};  // some device records: the fast path's one check
  std::mutex recording_mutex;        // begin_recording and end_recording
  std::vector<int> recorded;         // the devices begin_recording named, in its order
};

namespace {

CountingAllocator* the_owner = nullptr;

// Freed blocks are kept by exact size and handed out again, as the CUDA caching allocator
// does: a training step allocates the same sizes every step, and on a virtual machine the page
// faults of fresh memory otherwise cost more than the arithmetic. Cached blocks are not counted
// as allocated (CUDA's "reserved but free").
class alignas(64) BlockCache {
 public:
  char* take(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(bytes);
    if (it == free_.end() || it->second.empty()) return nullptr;
    char* block = it->second.back();
    it->second.pop_back();
    return block;
  }
  void give(std::size_t bytes, char* block) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_[bytes].push_back(block);
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<char*>> free_;
};

// One cache per device (and one for threads of none), so that devices' worker threads do not
// take turns on one lock for every tensor they make: a block goes back to the cache of the
// device that made it, whichever thread frees it.
BlockCache& cache(int device) {
  static auto* caches =  // never destroyed: blocks may be freed at exit
      new std::array<BlockCache, kMaxTrackedDevices + 1>;
  const bool tracked = device >= 0 && device < kMaxTrackedDevices;
  return (*caches)[tracked ? static_cast<std::size_t>(device) + 1 : 0];
}

class Wrapper final : public c10::Allocator {
 public:
  explicit Wrapper(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(std::size_t n) override {
    const int device = CountingAllocator::current_device();
    the_owner->check_capacity(device, static_cast<std::int64_t>(n));
    char* base = cache(device).take(n);
    if (base == nullptr) {
      c10::DataPtr block = inner_->allocate(n + kHeader);
      base = static_cast<char*>(block.get());
      auto* fresh = reinterpret_cast<Header*>(base);
      fresh->inner_deleter = block.get_deleter();
      fresh->inner_context = block.release_context();  // owned through the header from now on
    }
    auto* header = reinterpret_cast<Header*>(base);
    header->bytes = static_cast<std::int64_t>(n);
    header->device = device;
    the_owner->charge(header->device, header->bytes);
    void* payload = base + kHeader;
    return {payload, payload, &Wrapper::release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &Wrapper::release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  static void release(void* payload) {
    char* base = static_cast<char*>(payload) - kHeader;
    auto* header = reinterpret_cast<Header*>(base);
    the_owner->charge(header->device, -header->bytes);
    cache(header->device).give(static_cast<std::size_t>(header->bytes), base);
  }

  c10::Allocator* inner_;
};

}  // namespace

CountingAllocator::State* CountingAllocator::state() {
  static State s;
  return &s;
}

CountingAllocator& CountingAllocator::install() {
  static CountingAllocator instance;
  static Wrapper* wrapper = [] {
    the_owner = &instance;
    auto* w = new Wrapper(c10::GetDefaultCPUAllocator());
    // Priority above the default's, so torch's own later calls do not replace it.
    c10::SetCPUAllocator(w, /*priority=*/100);
    return w;
  }();
  (void)wrapper;
  return instance;
}

CountingAllocator::DeviceScope::DeviceScope(int device) : previous_(tagged_device) {
  tagged_device = device;
}
CountingAllocator::DeviceScope::~DeviceScope() {
  tagged_device = previous_;
}
int CountingAllocator::current_device() {
  return tagged_device;
}

void CountingAllocator::charge(int device, std::int64_t bytes) {
  if (device < 0 || device >= kMaxTrackedDevices) return;
  State* s = state();
  const std::int64_t now =
      s->devices[device].current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::int64_t peak = s->devices[device].peak.load(std::memory_order_relaxed);
  while (now > peak &&
         !s->devices[device].peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  if (s->history.load(std::memory_order_relaxed)) {
    State::History& h = s->histories[device];
    std::lock_guard<std::mutex> lock(h.mutex);
    if (h.recording) {
      const double t =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - h.origin)
              .count();
      h.samples.push_back({t, now});
    }
  }
}

void CountingAllocator::set_capacity(int device, std::int64_t bytes) {
  if (device < 0 || device >= kMaxTrackedDevices) return;
  state()->devices[device].capacity.store(bytes);
}

void CountingAllocator::check_capacity(int device, std::int64_t bytes) {
  if (device < 0 || device >= kMaxTrackedDevices) return;
  State* s = state();
  const std::int64_t capacity = s->devices[device].capacity.load(std::memory_order_relaxed);
  const std::int64_t now = s->devices[device].current.load(std::memory_order_relaxed);
  TORCH_CHECK_WITH(OutOfMemoryError, capacity == 0 || now + bytes <= capacity, "CPU device ",
                   device, ": out of memory: tried to allocate ", bytes, " bytes with ", now,
                   " of ", capacity, " bytes allocated");
}

std::int64_t CountingAllocator::allocated(int device) const {
  return const_cast<CountingAllocator*>(this)->state()->devices[device].current.load();
}

std::int64_t CountingAllocator::peak(int device) const {
  return const_cast<CountingAllocator*>(this)->state()->devices[device].peak.load();
}

void CountingAllocator::reset_peak(int device) {
  State* s = state();
  s->devices[device].peak.store(s->devices[device].current.load());
}

void CountingAllocator::begin_recording(const std::vector<int>& devices, bool history,
                                        std::chrono::steady_clock::time_point origin) {
  State* s = state();
  std::lock_guard<std::mutex> guard(s->recording_mutex);
  s->history.store(false);
  for (int d : s->recorded) {
    std::lock_guard<std::mutex> lock(s->histories[d].mutex);
    s->histories[d].recording = false;
    s->histories[d].samples.clear();
  }
  s->recorded = devices;
  for (int d : devices) {
    State::History& h = s->histories[d];
    std::lock_guard<std::mutex> lock(h.mutex);
    h.origin = origin;
    h.samples.clear();
    s->devices[d].peak.store(s->devices[d].current.load());
    h.samples.push_back({0.0, s->devices[d].current.load()});
    h.recording = history;
  }
  s->history.store(history);
}

std::vector<std::vector<CounterSample>> CountingAllocator::end_recording() {
  State* s = state();
  std::lock_guard<std::mutex> guard(s->recording_mutex);
  s->history.store(false);
  std::vector<std::vector<CounterSample>> out;
  for (int d : s->recorded) {
    State::History& h = s->histories[d];
    std::lock_guard<std::mutex> lock(h.mutex);
    h.recording = false;
    out.push_back(std::move(h.samples));
    h.samples = {};
  }
  s->recorded.clear();
  return out;
}

}  // namespace pipetune::exec
