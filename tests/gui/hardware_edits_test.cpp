#include "gui/model/hardware_edits.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace pipetune::gui {
namespace {

Hardware two_gpus() {
  Hardware hw;
  hw.devices = {{"gpu0", 1 << 30, 1.0}, {"gpu1", 1 << 30, 1.5}};
  hw.link = {1e9, 0.01};
  hw.links = {{0, 1, {5e10, 0.002}}};
  return hw;
}

TEST(HardwareEdits, NothingEditedIsTheLoadedHardware) {
  const Hardware hw = apply_edits(two_gpus(), {});
  ASSERT_EQ(hw.devices.size(), 2u);
  EXPECT_EQ(hw.devices[1].name, "gpu1");
  EXPECT_EQ(hw.links.size(), 1u);
}

TEST(HardwareEdits, MoreDevicesCopyTheLastAndNameOnFromIt) {
  HardwareEdits edits;
  edits.device_count = 4;
  const Hardware hw = apply_edits(two_gpus(), edits);
  ASSERT_EQ(hw.devices.size(), 4u);
  EXPECT_EQ(hw.devices[2].name, "gpu2");
  EXPECT_EQ(hw.devices[3].name, "gpu3");
  EXPECT_DOUBLE_EQ(hw.devices[3].speed, 1.5);

  Hardware cpus = replicate_device({"cpu", "x", 0}, 1);
  EXPECT_EQ(apply_edits(cpus, edits).devices[3].name, "cpu:3");
  Hardware named;
  named.devices = {{"host", 0, 1.0}};
  const Hardware grown = apply_edits(named, edits);
  EXPECT_EQ(grown.devices[1].name, "host-1");
  EXPECT_EQ(grown.devices[3].name, "host-3");
}

TEST(HardwareEdits, FewerDevicesDropTheLinksThatNameThem) {
  HardwareEdits edits;
  edits.device_count = 1;
  const Hardware hw = apply_edits(two_gpus(), edits);
  ASSERT_EQ(hw.devices.size(), 1u);
  EXPECT_TRUE(hw.links.empty());
}

TEST(HardwareEdits, MemoryAndBandwidthApplyEverywhere) {
  HardwareEdits edits;
  edits.memory_bytes = 123456;
  edits.bandwidth_bytes_per_s = 2e8;
  const Hardware hw = apply_edits(two_gpus(), edits);
  for (const auto& d : hw.devices) {
    EXPECT_EQ(d.memory_bytes, 123456);
  }
  EXPECT_DOUBLE_EQ(hw.link.bandwidth_bytes_per_s, 2e8);
  EXPECT_DOUBLE_EQ(hw.links[0].link.bandwidth_bytes_per_s, 2e8);
  EXPECT_DOUBLE_EQ(hw.link_between(0, 1).bandwidth_bytes_per_s, 2e8);
  EXPECT_DOUBLE_EQ(hw.links[0].link.latency_ms, 0.002);  // latency untouched
}

}  // namespace
}  // namespace pipetune::gui
