#include "profiler/host_pace.hpp"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace pipetune::profiler {

double measure_host_pace_us(const std::string& device) {
  const c10::Device where(device);
  // Few enough calls that a batch never fills a launch queue (about a thousand on CUDA), so
  // the host never waits for the device within one.
  constexpr int kCalls = 200;
  constexpr int kBatches = 7;
  auto idle = [&] {
    if (where.is_cuda()) torch::cuda::synchronize(where.has_index() ? where.index() : -1);
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
  std::nth_element(per_call.begin(), per_call.begin() + kBatches / 2, per_call.end());
  return per_call[kBatches / 2];
}

}  // namespace pipetune::profiler
