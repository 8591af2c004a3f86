#include "executor/sm_partitions.hpp"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "sim/error.hpp"
#include "tests/support/gpu.hpp"

namespace pipetune {
namespace {

using exec::sm_partitions;

// Refused in one line, on every machine: without a GPU (or CUDA in the build) for want of
// one, with one for a share count its SMs cannot make.
TEST(SmPartitions, WhatCannotBeIsRefusedInOneLine) {
  EXPECT_THROW(sm_partitions(0, 0), InputError);
  const int too_many = torch::cuda::is_available() ? 100000 : 2;
  try {
    sm_partitions(0, too_many);
    FAIL() << too_many << " shares were made";
  } catch (const WorkError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("SM partitions (" + std::to_string(too_many) + "): ", 0), 0u) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

// Seconds `work` takes from an idle GPU to an idle GPU, the least of three.
template <typename Work>
double least_seconds(Work&& work) {
  double least = 1e9;
  for (int r = 0; r < 3; ++r) {
    torch::cuda::synchronize();
    const auto started = std::chrono::steady_clock::now();
    work();
    torch::cuda::synchronize();
    least = std::min(
        least, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  }
  return least;
}

// Two shares: each holds half the SMs or less (a compute-bound product takes far longer there
// than on the whole GPU), and the two run at once (both products take about as long as one).
TEST(SmPartitionsGpu, AShareRunsOnItsOwnSmsAndSharesRunAtOnce) {
  PIPETUNE_GPU_TEST_NEEDS(torch::cuda::is_available(), "no CUDA device");
  const exec::SmPartitions& shares = sm_partitions(0, 2);
  ASSERT_EQ(shares.sms.size(), 2u);
  ASSERT_EQ(shares.streams.size(), 2u);
  EXPECT_EQ(shares.sms[0], shares.sms[1]);
  EXPECT_LE(shares.sms[0] + shares.sms[1], shares.device_sms);
  EXPECT_GE(shares.sms[0], shares.device_sms / 4);
  EXPECT_EQ(&sm_partitions(0, 2), &shares);  // made once

  const auto options = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  const at::Tensor a = at::randn({4096, 4096}, options), b = at::randn({4096, 4096}, options);
  auto products = [&](int count) {
    for (int k = 0; k < count; ++k) at::mm(a, b);
  };
  constexpr int kProducts = 8;
  products(kProducts);  // the kernels loaded
  const double whole = least_seconds([&] { products(kProducts); });
  auto on_share = [&](int share) {
    c10::StreamGuard guard(shares.streams[static_cast<std::size_t>(share)]);
    products(kProducts);
  };
  on_share(0);
  on_share(1);
  const double one = least_seconds([&] { on_share(0); });
  const double both = least_seconds([&] {
    std::thread other([&] { on_share(1); });
    on_share(0);
    other.join();
  });
  // Half the SMs: twice as long, ideally; the bounds leave room for clocks and the memory bus.
  EXPECT_GT(one, 1.4 * whole) << "whole GPU " << whole << " s, one share " << one << " s";
  EXPECT_LT(both, 1.4 * one) << "one share " << one << " s, both at once " << both << " s";
}

}  // namespace
}  // namespace pipetune
