#pragma once

// The cache model (docs/architecture.md, "Cold caches"): a profile times each layer hot, its
// backward right after its forward and its forward into memory a backward has just freed, as a
// pipeline of one micro-batch at a time runs it; with a profile's cold times it also times them
// with the device's cache emptied first. A pipeline task sits between the two: a backward whose
// micro-batch went forward many tasks ago finds its saved tensors evicted, and a forward that
// cannot reuse freshly freed memory writes into memory the cache has not seen. Measured on a
// 2-core CPU, the same tasks ran 8-12 % slower in GPipe's order than in 1F1B's.
//
// The model is a byte clock per device: every task advances it by the activation bytes it
// touches (the kept tensors it writes or reads). A task's coldness is min(1, D / cache), D the
// bytes the clock moved since its data was last touched: for a backward (or I, or W) since its
// micro-batch's forward (or recompute, or I); for a forward (or recompute) since the device last
// freed a micro-batch's tensors, the memory the allocator hands out first. Its time is
// hot + coldness × (cold − hot). Weights are left out: the profile streams every layer's weights
// through the cache between two uses (a pass over all the layers), as a pipeline does, so hot and
// cold times both have them cold.

#include <cstdint>
#include <span>
#include <vector>

#include "sim/simulator.hpp"

namespace pipetune {

/// One compute task as the cache model sees it.
struct CacheTask {
  int device = 0;
  TaskKind kind = TaskKind::Forward;
  int stage = 0;
  int micro_batch = 0;
  bool keeps = true;            ///< a forward with autograd (a checkpointed forward keeps nothing)
  std::int64_t kept_bytes = 0;  ///< what the stage's forward keeps for this micro-batch
};

/// Per task, its coldness in [0, 1]. `tasks` holds each device's compute tasks in that device's
/// order (devices may interleave), devices numbered below `devices`; `cache_bytes` per device.
std::vector<double> cache_coldness(std::span<const CacheTask> tasks, int devices,
                                   std::int64_t cache_bytes);

}  // namespace pipetune
