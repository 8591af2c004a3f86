// libFuzzer target: parse_plan must accept a document or throw InputError; whatever it accepts
// must survive plan_to_json unchanged, and check_plan against a small fixed profile and hardware
// must either reject it with InputError or pass a plan the simulator can run.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_support.hpp"
#include "sim/error.hpp"
#include "sim/plan.hpp"
#include "sim/simulator.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pipetune;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto trip = fuzz::round_trip(text, "plan", parse_plan, plan_to_json);
  if (!trip) return 0;
  const Plan& plan = trip->accepted;
  const std::string& written = trip->written;
  fuzz::require(trip->again == plan, "the plan changed on a round trip", written);
  (void)describe_plan(plan);

  const Profile& profile = fuzz::fixed_profile();
  const Hardware& hardware = fuzz::fixed_hardware();
  try {
    check_plan(plan, profile, hardware, "fuzz.plan.json");
  } catch (const InputError&) {
    return 0;
  }
  const Simulator simulator(profile, hardware);
  const SimulationResult result = simulator.run(plan);
  fuzz::check_result(result, written);
  return 0;
}
