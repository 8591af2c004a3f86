// The stepping thread's OpenMP pool is let go: the pools' threads, counted by the kernel, end.

#include "executor/openmp_pool.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "executor/executor.hpp"

namespace pipetune::exec {
namespace {

// The process's threads, as the kernel lists them.
int threads_in_process() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task"))
    ++n;
  return n;
}

// Whether GNU libgomp is loaded (LibTorch's OpenMP runtime on Linux), as the kernel's map of
// the process says: the one runtime whose pools a step releases.
bool libgomp_loaded() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("libgomp") != std::string::npos) return true;
  }
  return false;
}

bool torch_uses_libgomp() {
  if (at::get_parallel_info().find("OpenMP") == std::string::npos || !libgomp_loaded())
    return false;
  // Where it is loaded, the release must find it (this releases nothing yet: no pool is built).
  EXPECT_TRUE(release_openmp_pool_of_this_thread());
  return true;
}

// Runs one parallel region on `threads` threads: the calling thread's pool then holds the
// others. An ATen kernel's, built with LibTorch's OpenMP: an at::parallel_for compiled here,
// without OpenMP, would run on another pool.
void make_pool(int threads) {
  at::set_num_threads(threads);
  at::Tensor ones = at::ones({1 << 20});
  ones.add_(1);
  ASSERT_EQ(ones.sum().item<double>(), 2.0 * (1 << 20));
}

// Waits (up to 10 s) for the process to have at most `at_most` threads: a released pool's
// threads wake to exit.
int wait_for_threads(int at_most) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  int n = threads_in_process();
  while (n > at_most && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    n = threads_in_process();
  }
  return n;
}

TEST(OpenMpPool, ReleaseEndsTheCallingThreadsPool) {
  if (!torch_uses_libgomp()) GTEST_SKIP() << "LibTorch's OpenMP runtime is not GNU libgomp";
  // On a thread of its own, so that no other test's pool is in the count.
  std::thread([] {
    make_pool(3);
    const int with_pool = threads_in_process();
    ASSERT_TRUE(release_openmp_pool_of_this_thread());
    EXPECT_LE(wait_for_threads(with_pool - 2), with_pool - 2);
    // The runtime is still usable: the next parallel region builds a pool again.
    make_pool(3);
    EXPECT_EQ(threads_in_process(), with_pool);
  }).join();
}

TEST(OpenMpPool, ACpuStepReleasesTheSteppingThreadsPool) {
  if (!torch_uses_libgomp()) GTEST_SKIP() << "LibTorch's OpenMP runtime is not GNU libgomp";
  std::thread([] {
    models::ModelOptions model_options;
    model_options.seed = 3;
    models::Model model = models::build_model("mlp:layers=2,width=8,classes=4", model_options);
    Plan plan;
    plan.balance = {static_cast<int>(model.layer_names.size())};
    plan.chunks = 2;
    ExecutorOptions options;
    options.devices = {"cpu:0"};
    options.threads_per_cpu_device = 1;  // the device's thread makes no pool of its own
    Pipeline pipeline(model, plan, 4, options);
    auto [input, target] = model.make_batch(4, 1, 0);
    pipeline.step(input, target);
    make_pool(3);  // as loading or profiling on this thread would
    const int with_pool = threads_in_process();
    pipeline.step(input, target);
    EXPECT_LE(wait_for_threads(with_pool - 2), with_pool - 2);
  }).join();
}

}  // namespace
}  // namespace pipetune::exec
