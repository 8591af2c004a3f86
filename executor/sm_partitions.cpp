// Green contexts through the driver API, reached by the CUDA runtime's entry-point lookup so
// that pipetune needs no link to libcuda (LibTorch loads it) and a driver without green
// contexts is told apart from a build without them. Each share's stream is handed to LibTorch
// as an external stream: its kernels, cuBLAS calls and events then run on that share's SMs.

#include "executor/sm_partitions.hpp"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "sim/error.hpp"

namespace pipetune::exec {

namespace {

std::string why(int count, const std::string& what) {
  return fmt::format("SM partitions ({}): {}", count, what);
}

#if CUDART_VERSION >= 12050 && CUDA_VERSION >= 12040

// The driver's function `name` in the version of the headers this was built with; nullptr where
// the driver is older or lacks it.
template <typename Function>
Function driver_function(const char* name) {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &function, CUDA_VERSION, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();  // the lookup's error is not the next call's
    return nullptr;
  }
  return reinterpret_cast<Function>(function);
}

struct Driver {
  decltype(&cuDeviceGet) device_get = driver_function<decltype(&cuDeviceGet)>("cuDeviceGet");
  decltype(&cuDeviceGetDevResource) get_resource =
      driver_function<decltype(&cuDeviceGetDevResource)>("cuDeviceGetDevResource");
  decltype(&cuDevSmResourceSplitByCount) split =
      driver_function<decltype(&cuDevSmResourceSplitByCount)>("cuDevSmResourceSplitByCount");
  decltype(&cuDevResourceGenerateDesc) describe =
      driver_function<decltype(&cuDevResourceGenerateDesc)>("cuDevResourceGenerateDesc");
  decltype(&cuGreenCtxCreate) create =
      driver_function<decltype(&cuGreenCtxCreate)>("cuGreenCtxCreate");
  decltype(&cuGreenCtxStreamCreate) create_stream =
      driver_function<decltype(&cuGreenCtxStreamCreate)>("cuGreenCtxStreamCreate");
  decltype(&cuGetErrorString) error_string =
      driver_function<decltype(&cuGetErrorString)>("cuGetErrorString");

  bool complete() const {
    return device_get && get_resource && split && describe && create && create_stream;
  }
  void check(CUresult result, const char* call, int count) const {
    if (result == CUDA_SUCCESS) return;
    const char* text = nullptr;
    if (!error_string || error_string(result, &text) != CUDA_SUCCESS || !text) text = "unknown";
    throw WorkError(
        why(count, fmt::format("{} failed: {} ({})", call, text, static_cast<int>(result))));
  }
};

SmPartitions make_partitions(int device_index, int count) {
  if (device_index < 0 || device_index >= c10::cuda::device_count())
    throw WorkError(why(count, fmt::format("no CUDA device {} on this machine", device_index)));
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  cudaFree(nullptr);  // the device's primary context, which LibTorch's work runs in
  const Driver driver;
  if (!driver.complete()) {
    int version = 0;
    cudaDriverGetVersion(&version);
    throw WorkError(why(count, fmt::format("the driver (CUDA {}.{}) has no green contexts of "
                                           "CUDA {}.{}, which this build needs",
                                           version / 1000, version % 1000 / 10, CUDA_VERSION / 1000,
                                           CUDA_VERSION % 1000 / 10)));
  }
  CUdevice device = 0;
  driver.check(driver.device_get(&device, device_index), "cuDeviceGet", count);
  CUdevResource whole{};
  driver.check(driver.get_resource(device, &whole, CU_DEV_RESOURCE_TYPE_SM),
               "cuDeviceGetDevResource", count);
  const int sms = static_cast<int>(whole.sm.smCount);
  // Equal shares, each a multiple of the SMs the driver keeps together, as large as fit.
  const int together = std::max(1, static_cast<int>(whole.sm.smCoscheduledAlignment));
  const int least = std::max(1, static_cast<int>(whole.sm.minSmPartitionSize));
  const int each = sms / count / together * together;
  if (each < least) {
    throw WorkError(why(count, fmt::format("{} SMs make at most {} shares of at least {} SMs "
                                           "(in multiples of {})",
                                           sms, sms / std::max(least, together), least, together)));
  }
  std::vector<CUdevResource> groups(static_cast<std::size_t>(count));
  unsigned int made = static_cast<unsigned int>(count);
  driver.check(
      driver.split(groups.data(), &made, &whole, nullptr, 0, static_cast<unsigned int>(each)),
      "cuDevSmResourceSplitByCount", count);
  if (static_cast<int>(made) < count) {
    throw WorkError(why(count, fmt::format("the driver split {} SMs into {} shares of {}, not {}",
                                           sms, made, each, count)));
  }
  SmPartitions out;
  out.device_index = device_index;
  out.device_sms = sms;
  for (CUdevResource& group : groups) {
    CUdevResourceDesc description{};
    driver.check(driver.describe(&description, &group, 1), "cuDevResourceGenerateDesc", count);
    CUgreenCtx context = nullptr;
    driver.check(driver.create(&context, description, device, CU_GREEN_CTX_DEFAULT_STREAM),
                 "cuGreenCtxCreate", count);
    CUstream stream = nullptr;
    driver.check(driver.create_stream(&stream, context, CU_STREAM_NON_BLOCKING, 0),
                 "cuGreenCtxStreamCreate", count);
    out.sms.push_back(static_cast<int>(group.sm.smCount));
    out.streams.push_back(
        c10::cuda::getStreamFromExternal(stream, static_cast<c10::DeviceIndex>(device_index))
            .unwrap());
  }
  return out;
}

#else

SmPartitions make_partitions(int, int count) {
  throw WorkError(why(count, fmt::format("this build's CUDA toolkit ({}.{}) has no green "
                                         "contexts; CUDA 12.5 or newer is needed",
                                         CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10)));
}

#endif

}  // namespace

const SmPartitions& sm_partitions(int device_index, int count) {
  if (count < 1) throw InputError(fmt::format("SM partitions: expected 1 or more, got {}", count));
  static std::mutex mutex;
  // Never freed: the caching allocator may hold blocks last used on these streams until exit.
  static std::map<std::pair<int, int>, std::unique_ptr<SmPartitions>> made;
  std::lock_guard<std::mutex> lock(mutex);
  auto& entry = made[{device_index, count}];
  if (!entry) entry = std::make_unique<SmPartitions>(make_partitions(device_index, count));
  return *entry;
}

}  // namespace pipetune::exec
