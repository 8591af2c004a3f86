// Built without CUDA: GPU profiling is refused with the reason.

#include "profiler/backend.hpp"
#include "sim/error.hpp"

namespace pipetune::profiler {

std::unique_ptr<MeasureBackend> make_cuda_backend(int, const std::string&) {
  throw InputError(
      Input::Device, "cuda",
      "this build of pipetune has no CUDA (LibTorch without CUDA, or no CUDA toolkit)");
}

}  // namespace pipetune::profiler
