// Built when LibTorch has no CUDA or no CUDA toolkit was found: CUDA devices are refused.

#include "executor/device_runtime.hpp"

namespace pipetune::exec {

std::unique_ptr<DeviceRuntime> make_cuda_runtime(const std::vector<c10::Device>&, bool,
                                                 const std::vector<c10::Stream>&) {
  return nullptr;
}
bool cuda_built() {
  return false;
}
int cuda_device_count() {
  return 0;
}
std::int64_t cuda_free_bytes(int) {
  return 0;
}

}  // namespace pipetune::exec
