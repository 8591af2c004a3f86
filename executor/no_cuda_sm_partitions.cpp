// Built when LibTorch has no CUDA or no CUDA toolkit was found: there are no SMs to share.

#include <fmt/format.h>

#include "executor/sm_partitions.hpp"
#include "sim/error.hpp"

namespace pipetune::exec {

const SmPartitions& sm_partitions(int, int count) {
  throw WorkError(fmt::format(
      "SM partitions ({}): this build of pipetune has no CUDA (LibTorch without CUDA, or no "
      "CUDA toolkit)",
      count));
}

}  // namespace pipetune::exec
