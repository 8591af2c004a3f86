// Measures links between the devices a pipeline would use: what a copy of n bytes costs,
// latency + n / bandwidth, fitted from a small and a large copy.

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "executor/device_runtime.hpp"
#include "profiler/profiler.hpp"
#include "sim/compare.hpp"
#include "sim/error.hpp"

#ifdef PIPETUNE_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace pipetune::profiler {

namespace {

// What handing a tensor to another worker costs the executor on a CPU: a wake-up of the other
// thread through a condition variable, one way (half a round trip).
double thread_handover_ms() {
  std::mutex m;
  std::condition_variable cv;
  int turn = 0;
  constexpr int kRounds = 200;
  std::thread other([&] {
    for (int k = 0; k < kRounds; ++k) {
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return turn == 1; });
      turn = 0;
      cv.notify_all();
    }
  });
  const auto start = std::chrono::steady_clock::now();
  for (int k = 0; k < kRounds; ++k) {
    std::unique_lock<std::mutex> lock(m);
    turn = 1;
    cv.notify_all();
    cv.wait(lock, [&] { return turn == 0; });
  }
  const double total =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  other.join();
  return total / kRounds / 2.0;
}

// Bandwidth from the time of `copy` on a large tensor, less the time of a tiny one.
template <typename Copy>
Link fit_link(Copy copy, double handover_ms) {
  constexpr std::int64_t kLarge = 64 << 20, kSmall = 256;
  std::vector<double> small, large;
  for (int r = 0; r < 7; ++r) {
    small.push_back(copy(kSmall));
    large.push_back(copy(kLarge));
  }
  Link link = link_from_copies(small, kSmall, large, kLarge);
  link.latency_ms += handover_ms;
  return link;
}

}  // namespace

Hardware probe_hardware(const std::string& device, int devices) {
  Hardware hw;
  if (device == "cpu") {
    if (devices < 1)
      throw InputError(Input::Devices, fmt::format("expected at least 1, got {}", devices));
    for (int d = 0; d < devices; ++d) hw.devices.push_back({fmt::format("cpu:{}", d), 0, 1.0});
    // The executor's CPU copy: a clone made by the channel's thread.
    const double handover = thread_handover_ms();
    hw.link = fit_link(
        [](std::int64_t bytes) {
          const at::Tensor source = at::empty({bytes}, at::kByte).fill_(1);
          const auto start = std::chrono::steady_clock::now();
          const at::Tensor copy = source.clone();
          return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
        },
        handover);
    return hw;
  }
#ifdef PIPETUNE_WITH_CUDA
  const int count = static_cast<int>(c10::cuda::device_count());
  if (count == 0) throw InputError(Input::Device, "cuda", "no CUDA device on this machine");
  for (int d = 0; d < count; ++d) {
    const auto* props = at::cuda::getDeviceProperties(d);
    hw.devices.push_back(
        {fmt::format("cuda:{}", d), static_cast<std::int64_t>(props->totalGlobalMem), 1.0});
  }
  auto timed_copy = [](int from, int to) {
    return [from, to](std::int64_t bytes) {
      const at::Tensor source =
          at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, from));
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(to));
      at::cuda::CUDAEvent start(cudaEventDefault), end(cudaEventDefault);
      auto stream = at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(to));
      c10::cuda::device_synchronize();
      start.record(stream);
      const at::Tensor copy = source.to(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(to)),
                                        /*non_blocking=*/true);
      end.record(stream);
      end.synchronize();
      return static_cast<double>(start.elapsed_time(end));
    };
  };
  // The default link: the first pair (or a copy within the one device there is).
  hw.link = fit_link(timed_copy(0, count > 1 ? 1 : 0), 0.0);
  for (int a = 0; a < count; ++a) {
    for (int b = a + 1; b < count; ++b) {
      if (a == 0 && b == 1) continue;
      hw.links.push_back({a, b, fit_link(timed_copy(a, b), 0.0)});
    }
  }
  return hw;
#else
  (void)devices;
  throw InputError(Input::Device, "cuda", "this build of pipetune has no CUDA");
#endif
}

}  // namespace pipetune::profiler
