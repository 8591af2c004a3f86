#include "gui/model/hardware_edits.hpp"

#include <algorithm>
#include <cctype>
#include <string>
#include <utility>

namespace pipetune::gui {

namespace {

// "gpu1" -> ("gpu", 1); "cpu:0" -> ("cpu:", 0); "host" -> ("host-", 0).
std::pair<std::string, int> name_stem(const std::string& name) {
  std::size_t digits = name.size();
  while (digits > 0 && std::isdigit(static_cast<unsigned char>(name[digits - 1]))) --digits;
  if (digits == name.size() || name.size() - digits > 6) return {name + "-", 0};
  return {name.substr(0, digits), std::stoi(name.substr(digits))};
}

}  // namespace

Hardware apply_edits(const Hardware& base, const HardwareEdits& edits) {
  Hardware hw = base;
  const int count =
      edits.device_count > 0 ? edits.device_count : static_cast<int>(base.devices.size());
  if (count < static_cast<int>(hw.devices.size())) {
    hw = first_devices(std::move(hw), count);
  } else if (!hw.devices.empty()) {
    const HardwareDevice last = hw.devices.back();
    auto [stem, number] = name_stem(last.name);
    while (static_cast<int>(hw.devices.size()) < count) {
      HardwareDevice copy = last;
      do {
        copy.name = stem + std::to_string(++number);
      } while (hw.device_index(copy.name) >= 0);
      hw.devices.push_back(copy);
    }
  }
  if (edits.memory_bytes) {
    for (auto& d : hw.devices) d.memory_bytes = *edits.memory_bytes;
  }
  if (edits.bandwidth_bytes_per_s) set_all_links(hw, edits.bandwidth_bytes_per_s, std::nullopt);
  return hw;
}

}  // namespace pipetune::gui
