#pragma once

// GPU tests skip on machines without a GPU (CI), but must not skip quietly where one should be:
// scripts/gpu-check.sh sets PIPETUNE_REQUIRE_GPU=1, and then a missing GPU (or a build without
// CUDA) fails the test instead.

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

namespace pipetune::testing {

inline bool gpu_required() {
  const char* v = std::getenv("PIPETUNE_REQUIRE_GPU");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace pipetune::testing

/// In a TEST body: skips (or, under PIPETUNE_REQUIRE_GPU=1, fails) with `why` unless `cond`.
#define PIPETUNE_GPU_TEST_NEEDS(cond, why)                                                   \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      if (::pipetune::testing::gpu_required()) FAIL() << why << " (PIPETUNE_REQUIRE_GPU=1)"; \
      GTEST_SKIP() << why;                                                                   \
    }                                                                                        \
  } while (false)
