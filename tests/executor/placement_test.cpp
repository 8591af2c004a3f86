// Which executor device each stage goes to, and how CPU devices share the machine's cores.

#include "executor/placement.hpp"

#include <gtest/gtest.h>

#include <thread>

#include "executor/device_runtime.hpp"
#include "sim/error.hpp"

namespace pipetune::exec {
namespace {

Plan plan_with(std::vector<int> balance, std::vector<std::string> devices) {
  Plan plan;
  plan.balance = std::move(balance);
  plan.devices = std::move(devices);
  return plan;
}

using Names = std::vector<std::string>;

TEST(Placement, OneDevicePerStageWhenThePlanNamesNone) {
  EXPECT_EQ(executor_devices(plan_with({2, 3, 1}, {}), "cpu"), (Names{"cpu:0", "cpu:1", "cpu:2"}));
}

TEST(Placement, ThePlansOwnNamesOfThatKindAreKept) {
  EXPECT_EQ(executor_devices(plan_with({2, 2, 2}, {"cpu:3", "cpu:1", "cpu:3"}), "cpu"),
            (Names{"cpu:3", "cpu:1"}));
}

TEST(Placement, OtherNamesAreNumberedByFirstUse) {
  // The simulator's names ("gpu1", or names of another kind) become cpu:0, cpu:1, … in the order
  // they first appear, so stages sharing a name share a device.
  EXPECT_EQ(executor_devices(plan_with({1, 1, 1, 1}, {"gpu1", "gpu0", "gpu1", "gpu2"}), "cpu"),
            (Names{"cpu:0", "cpu:1", "cpu:2"}));
  EXPECT_EQ(executor_devices(plan_with({1, 1}, {"cpu:0", "cuda:1"}), "cpu"), (Names{"cpu:0", "cpu:1"}));
  EXPECT_EQ(executor_devices(plan_with({1, 1}, {"cpu:x", "cpu:"}), "cpu"), (Names{"cpu:0", "cpu:1"}));
}

TEST(Placement, WithExecutorDevicesRenamesEveryStage) {
  const Plan plan = plan_with({1, 1, 1, 1}, {"gpu1", "gpu0", "gpu1", "gpu2"});
  const Plan renamed = with_executor_devices(plan, executor_devices(plan, "cpu"));
  EXPECT_EQ(renamed.devices, (Names{"cpu:0", "cpu:1", "cpu:0", "cpu:2"}));
  EXPECT_EQ(renamed.balance, plan.balance);
  EXPECT_TRUE(with_executor_devices(plan_with({2}, {}), {"cpu:0"}).devices.empty());
}

TEST(Placement, CudaIsRefusedInOneLineWhereThereIsNone) {
  if (cuda_built() && cuda_device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  try {
    executor_devices(plan_with({1, 1}, {}), "cuda");
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("device cuda: ", 0), 0u) << e.what();
    EXPECT_EQ(e.input(), Input::Device);
  }
}

TEST(Placement, CpuDevicesShareTheCoresEqually) {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_EQ(cpu_threads_per_device(1), cores);
  EXPECT_EQ(cpu_threads_per_device(0), cores);
  for (int n : {2, 3, 4, 7}) EXPECT_EQ(cpu_threads_per_device(n), std::max(1, cores / n)) << n;
  EXPECT_EQ(cpu_threads_per_device(cores + 1), 1);  // never zero
}

}  // namespace
}  // namespace pipetune::exec
