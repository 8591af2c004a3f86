#pragma once

// Shares of one GPU's streaming multiprocessors (SMs), each with a stream of its own (CUDA
// green contexts): work launched on share k's stream runs on share k's SMs only. With K shares,
// K pipeline stages on a one-GPU machine really run at once, each on a device of about 1/K-th
// of the GPU, so the pipeline's overlap and bubble can be measured there; stages that merely
// share a GPU take turns on all of its SMs instead.
//
// The shares split one GPU's SMs, not its memory: the caching allocator serves them all, so a
// share's memory is the GPU's (every share's peak is the whole GPU's).

#include <c10/core/Stream.h>

#include <string>
#include <vector>

namespace pipetune::exec {

struct SmPartitions {
  int device_index = 0;
  int device_sms = 0;                ///< the GPU's SMs
  std::vector<int> sms;              ///< per share, equal and disjoint
  std::vector<c10::Stream> streams;  ///< per share
};

/// `count` (≥ 1) equal, disjoint shares of GPU `device_index`'s SMs, created on first use and
/// kept until the process ends (streams the caching allocator may still know must outlive it).
/// Throws WorkError, in one line, where there cannot be such shares: a build without CUDA, a
/// driver or toolkit without green contexts (CUDA 12.4), a GPU whose SMs do not make `count`
/// shares.
const SmPartitions& sm_partitions(int device_index, int count);

}  // namespace pipetune::exec
