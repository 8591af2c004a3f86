#include "profiler/host_pace.hpp"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <chrono>
#include <vector>

#include "executor/device_name.hpp"
#include "sim/compare.hpp"

namespace pipetune::profiler {

double measure_host_pace_us(const std::string& device) {
  // A CPU device of the pipeline ("cpu:1", a worker thread) runs its calls on the CPU all the
  // same.
  const exec::DeviceName name = exec::parse_device_name(device);
  const c10::Device where =
      name.kind == exec::DeviceKind::Cuda
          ? c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(name.index))
          : c10::Device(c10::kCPU);
  // Few enough calls that a batch never fills a launch queue (about a thousand on CUDA), so
  // the host never waits for the device within one.
  constexpr int kCalls = 200;
  constexpr int kBatches = 7;
  auto idle = [&] {
    if (where.is_cuda()) torch::cuda::synchronize(where.index());
  };
  at::Tensor x = at::zeros({1}, at::TensorOptions().device(where));
  for (int k = 0; k < kCalls; ++k) x.add_(1.0);  // the first calls load the kernel
  std::vector<double> per_call;
  for (int b = 0; b < kBatches; ++b) {
    idle();
    const auto started = std::chrono::steady_clock::now();
    for (int k = 0; k < kCalls; ++k) x.add_(1.0);
    const std::chrono::duration<double, std::micro> took =
        std::chrono::steady_clock::now() - started;
    per_call.push_back(took.count() / kCalls);
  }
  idle();
  return median(std::move(per_call));
}

}  // namespace pipetune::profiler
