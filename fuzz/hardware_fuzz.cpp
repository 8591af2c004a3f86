// libFuzzer target: parse_hardware must accept a document or throw InputError, and whatever it
// accepts must survive hardware_to_json and a second read unchanged.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_support.hpp"
#include "sim/error.hpp"
#include "sim/hardware.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pipetune;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Hardware hardware;
  try {
    hardware = parse_hardware(text, "fuzz.hardware.json");
  } catch (const InputError&) {
    return 0;
  }
  const std::string written = hardware_to_json(hardware);
  Hardware again;
  try {
    again = parse_hardware(written, "rewritten.hardware.json");
  } catch (const InputError& e) {
    fuzz::fail("the written hardware does not load again", e.what());
  }
  fuzz::require(hardware_to_json(again) == written, "the hardware changed on a round trip",
                written);
  // What the simulator and planner derive from it right away.
  for (int busy = 1; busy <= 3; ++busy) (void)calibrated(hardware, busy);
  const int devices = static_cast<int>(hardware.devices.size());
  for (int from = 0; from < devices && from < 8; ++from) {
    for (int to = 0; to < devices && to < 8; ++to) (void)hardware.link_between(from, to);
  }
  return 0;
}
