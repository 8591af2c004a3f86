#include <ATen/Parallel.h>

#include <chrono>
#include <fstream>

#include "executor/counting_allocator.hpp"
#include "profiler/backend.hpp"

namespace pipetune::profiler {

namespace {

constexpr int kProfiledDevice = 0;  // the counting allocator's tag for what we measure

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "cpu";
}

class CpuBackend final : public MeasureBackend {
 public:
  explicit CpuBackend(int threads)
      : allocator_(exec::CountingAllocator::install()),
        scope_(kProfiledDevice),
        name_(cpu_model()) {
    if (threads > 0) at::set_num_threads(threads);
  }
  c10::Device device() const override { return c10::Device(c10::DeviceType::CPU); }
  std::string device_type() const override { return "cpu"; }
  std::string device_name() const override { return name_; }
  std::int64_t memory_bytes() const override { return 0; }
  std::string timer_name() const override { return "clock"; }

  std::int64_t allocated() override { return allocator_.allocated(kProfiledDevice); }
  std::int64_t peak() override { return allocator_.peak(kProfiledDevice); }
  void reset_peak() override { allocator_.reset_peak(kProfiledDevice); }
  bool follows_levels() const override { return true; }
  void follow_levels(std::chrono::steady_clock::time_point origin) override {
    allocator_.begin_recording({kProfiledDevice}, true, origin);
  }
  std::vector<CounterSample> followed_levels() override {
    auto levels = allocator_.end_recording();
    return levels.empty() ? std::vector<CounterSample>{} : std::move(levels.front());
  }

  void begin(std::uint64_t region) override { started_[region] = std::chrono::steady_clock::now(); }
  void end(std::uint64_t region) override {
    times_[region] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                               started_[region])
                         .count();
  }
  std::map<std::uint64_t, double> collect_ms() override {
    started_.clear();
    return std::exchange(times_, {});
  }

 private:
  exec::CountingAllocator& allocator_;
  exec::CountingAllocator::DeviceScope scope_;  // charge this thread's allocations to us
  std::string name_;
  std::map<std::uint64_t, std::chrono::steady_clock::time_point> started_;
  std::map<std::uint64_t, double> times_;
};

}  // namespace

std::unique_ptr<MeasureBackend> make_cpu_backend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace pipetune::profiler
