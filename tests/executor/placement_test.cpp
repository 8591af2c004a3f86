// Which executor device each stage goes to, how CPU devices share the machine's cores, the one
// reading of a device string, and the checks a plan passes before the pipeline is built.

#include "executor/placement.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <thread>

#include "executor/device_name.hpp"
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
  EXPECT_EQ(executor_devices(plan_with({1, 1}, {"cpu:0", "cuda:1"}), "cpu"),
            (Names{"cpu:0", "cpu:1"}));
  EXPECT_EQ(executor_devices(plan_with({1, 1}, {"cpu:x", "cpu:"}), "cpu"),
            (Names{"cpu:0", "cpu:1"}));
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

TEST(DeviceName, GoodStrings) {
  struct Case {
    std::string text;
    DeviceKind kind;
    int index;
    bool has_index;
  };
  for (const Case& c :
       {Case{"cpu", DeviceKind::Cpu, 0, false}, Case{"cuda", DeviceKind::Cuda, 0, false},
        Case{"cpu:0", DeviceKind::Cpu, 0, true}, Case{"cpu:12", DeviceKind::Cpu, 12, true},
        Case{"cuda:3", DeviceKind::Cuda, 3, true},
        Case{"cuda:2147483647", DeviceKind::Cuda, 2147483647, true}}) {
    const DeviceName name = parse_device_name(c.text);
    EXPECT_EQ(name.kind, c.kind) << c.text;
    EXPECT_EQ(name.index, c.index) << c.text;
    EXPECT_EQ(name.has_index, c.has_index) << c.text;
    EXPECT_EQ(std::string(to_string(name.kind)), c.text.substr(0, c.text.find(':'))) << c.text;
  }
}

TEST(DeviceName, BadStringsAreRefusedNamingTheString) {
  for (const std::string text :
       {"", "gpu", "gpu:0", "CPU:0", "cpu:", "cuda:", "cpu:x", "cuda:-1", "cuda:1x", "cuda: 1",
        "cpu:0:1", "cpu0", "cuda:2147483648", "cpu:99999999999"}) {
    EXPECT_FALSE(try_parse_device_name(text).has_value()) << text;
    try {
      parse_device_name(text);
      ADD_FAILURE() << "accepted \"" << text << "\"";
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()), "device \"" + text + "\": expected cpu:<n> or cuda:<n>");
    }
  }
}

Plan gpipe(std::vector<int> balance, int chunks, std::vector<std::string> devices = {}) {
  Plan plan = plan_with(std::move(balance), std::move(devices));
  plan.chunks = chunks;
  plan.schedule = ScheduleKind::GPipe;
  return plan;
}

TEST(PlaceStages, StageIOnDeviceIWhenThePlanNamesNone) {
  const StagePlacement p =
      place_stages(gpipe({2, 2, 1}, 3), 5, "m", 7, {"cpu:0", "cpu:1", "cpu:2", "cpu:3"}, 0);
  EXPECT_EQ(p.device_names, (Names{"cpu:0", "cpu:1", "cpu:2"}));  // cpu:3 holds no stage
  EXPECT_EQ(p.device_of, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(p.micro_batch_sizes, (std::vector<std::int64_t>{3, 3, 1}));  // torch.chunk: ceil(7/3)
  EXPECT_FALSE(p.cuda);
  ASSERT_EQ(p.devices.size(), 3u);
  EXPECT_EQ(p.devices[2].index, 2);
}

TEST(PlaceStages, SharedDevicesKeepTheOrderGiven) {
  const StagePlacement p =
      place_stages(gpipe({1, 1, 1, 1}, 2, {"cpu:2", "cpu:0", "cpu:2", "cpu:0"}), 4, "m", 4,
                   {"cpu:0", "cpu:1", "cpu:2"}, 0);
  EXPECT_EQ(p.device_names, (Names{"cpu:0", "cpu:2"}));
  EXPECT_EQ(p.device_of, (std::vector<int>{1, 0, 1, 0}));
  EXPECT_EQ(p.micro_batch_sizes, (std::vector<std::int64_t>{2, 2}));
}

TEST(PlaceStages, ProgrammeROnDeviceRWhenThePlanNamesNone) {
  Plan zbv = gpipe({1, 1, 1, 1}, 4);
  zbv.schedule = ScheduleKind::ZBV;
  zbv.stages_per_device = 2;
  EXPECT_EQ(executor_devices(zbv, "cpu"), (Names{"cpu:0", "cpu:1"}));
  const StagePlacement p = place_stages(zbv, 4, "m", 8, {"cpu:0", "cpu:1"}, 0);
  EXPECT_EQ(p.device_of, (std::vector<int>{0, 1, 1, 0}));  // the V
  EXPECT_EQ(p.schedule, make_schedule(ScheduleKind::ZBV, 4, 4, CheckpointMode::ExceptLast, 2));
  // A schedule given from outside places the stages by its programmes and must fit the plan.
  Schedule given = make_schedule(ScheduleKind::Interleaved1F1B, 4, 4, CheckpointMode::Never, 2);
  const StagePlacement q =
      place_stages(gpipe({1, 1, 1, 1}, 4), 4, "m", 8, {"cpu:0", "cpu:1"}, 0, &given);
  EXPECT_EQ(q.device_of, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(q.schedule, given);
  try {
    place_stages(gpipe({1, 1, 1, 1}, 2), 4, "m", 8, {"cpu:0", "cpu:1"}, 0, &given);
    ADD_FAILURE() << "accepted 2 chunks for a schedule of 4 micro-batches";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "plan: chunks: the schedule has 4 micro-batches, the batch splits into 2");
  }
}

TEST(PlaceStages, BadPlansAndDevicesAreRefusedNamingWhat) {
  auto refused = [](const Plan& plan, int layers, const Names& devices, int world,
                    const std::string& message) {
    try {
      place_stages(plan, layers, "mlp-3x8", 6, devices, world);
      ADD_FAILURE() << "accepted: " << message;
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
  };
  const Names two{"cpu:0", "cpu:1"};
  refused(gpipe({}, 1), 4, two, 0, "plan: balance: expected at least one stage");
  refused(gpipe({2, 0, 2}, 1), 4, {"cpu:0", "cpu:1", "cpu:2"}, 0,
          "plan: balance[1]: expected a positive integer (every stage needs a layer), got 0");
  refused(gpipe({2, 3}, 2), 4, two, 0,
          "plan: balance: expected layer counts summing to 4 (the layers of mlp-3x8), got 5");
  refused(gpipe({2, 2}, 0), 4, two, 0, "plan: chunks: expected 1 to 6 (the batch size), got 0");
  Plan interleaved = gpipe({1, 1, 1, 1}, 2);
  interleaved.schedule = ScheduleKind::Interleaved1F1B;
  interleaved.stages_per_device = 2;
  refused(interleaved, 4, {"cpu:0"}, 0,
          "plan: 2 programmes of stages but 1 devices (name the plan's devices to put several "
          "stages on one device)");
  interleaved.stages_per_device = 3;
  refused(interleaved, 4, two, 0,
          "plan: balance: expected a multiple of 3 stages (stages_per_device), got 4");
  interleaved.stages_per_device = 2;
  Plan zbv = interleaved;
  zbv.schedule = ScheduleKind::ZBV;
  zbv.stages_per_device = 1;
  refused(zbv, 4, two, 0, "plan: schedule: zbv runs exactly 2 stages per device, got 1");
  Plan split = interleaved;
  split.devices = {"cpu:0", "cpu:1", "cpu:1", "cpu:1"};
  refused(split, 4, two, 0,
          "plan: devices[2]: expected \"cpu:0\" (stages 0 and 2 are one programme), got \"cpu:1\"");
  Plan one_stage = gpipe({2, 2}, 2);
  one_stage.stages_per_device = 2;
  refused(one_stage, 4, two, 0, "plan: stages_per_device: expected 1 for gpipe, got 2");
  refused(gpipe({2, 2}, 2), 4, {"cpu:0", "tpu:1"}, 0,
          "device \"tpu:1\": expected cpu:<n> or cuda:<n>");
  refused(gpipe({2, 2}, 2), 4, two, 3,
          "plan: 2 devices (cpu:0, cpu:1) but WORLD_SIZE is 3: a distributed run puts each device "
          "in its own "
          "process");
}

}  // namespace
}  // namespace pipetune::exec
