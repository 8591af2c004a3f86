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
  const auto trip = fuzz::round_trip(text, "hardware", parse_hardware, hardware_to_json);
  if (!trip) return 0;
  fuzz::require(hardware_to_json(trip->again) == trip->written,
                "the hardware changed on a round trip", trip->written);
  const Hardware& hardware = trip->accepted;
  // What the simulator and planner derive from it right away.
  for (int busy = 1; busy <= 3; ++busy) (void)calibrated(hardware, busy);
  const int devices = static_cast<int>(hardware.devices.size());
  for (int from = 0; from < devices && from < 8; ++from) {
    for (int to = 0; to < devices && to < 8; ++to) (void)hardware.link_between(from, to);
  }
  return 0;
}
