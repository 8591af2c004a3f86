// LibTorch does not expose OpenMP's pause, and linking an OpenMP runtime of our own would load a
// second one beside LibTorch's: the function is looked up in the one already loaded.

#include "executor/openmp_pool.hpp"

#include <dlfcn.h>

#include <cstring>

namespace pipetune::exec {

namespace {

using PauseAll = int (*)(int kind);
constexpr int kOmpPauseSoft = 1;  // omp_pause_soft: the pools go, the runtime stays usable

// GNU libgomp's pause frees the calling thread's pool only, which is what a step wants. LLVM's
// libomp pauses the whole runtime, every device's pool with it, so it is left alone.
PauseAll pause_all() {
  static const PauseAll found = [] {
    void* symbol = dlsym(RTLD_DEFAULT, "omp_pause_resource_all");
    Dl_info where{};
    if (!symbol || !dladdr(symbol, &where) || !where.dli_fname ||
        !std::strstr(where.dli_fname, "libgomp"))
      return PauseAll{nullptr};
    return reinterpret_cast<PauseAll>(symbol);
  }();
  return found;
}

}  // namespace

bool release_openmp_pool_of_this_thread() {
  const PauseAll pause = pause_all();
  // Non-zero inside a parallel region, where there is nothing to release: that is not an error.
  if (pause) pause(kOmpPauseSoft);
  return pause != nullptr;
}

}  // namespace pipetune::exec
