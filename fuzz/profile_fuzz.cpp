// libFuzzer target: parse_profile must accept a document or throw InputError, whatever it
// accepts must survive profile_to_json and a second read unchanged, and the simulator must run
// a simple plan on it (as `pipetune simulate --balance ...` would) without undefined behaviour.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_support.hpp"
#include "sim/error.hpp"
#include "sim/plan.hpp"
#include "sim/profile.hpp"
#include "sim/simulator.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pipetune;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto trip = fuzz::round_trip(text, "profile", parse_profile, profile_to_json);
  if (!trip) return 0;
  const std::string& written = trip->written;
  fuzz::require(profile_to_json(trip->again) == written, "the profile changed on a round trip",
                written);
  const Profile& profile = trip->accepted;

  // Every profile the loader accepts is simulated: its ceilings (sim/limits.hpp) keep the
  // cost and memory models' sums within int64, whatever the batch.
  Plan plan;
  const int layers = static_cast<int>(profile.layer_count());
  plan.balance =
      layers == 1 ? std::vector<int>{1} : std::vector<int>{layers / 2, layers - layers / 2};
  plan.chunks = static_cast<int>(std::min<std::int64_t>(profile.batch_size, 4));
  plan.checkpoint = size % 2 ? CheckpointMode::ExceptLast : CheckpointMode::Never;
  plan.schedule = size % 3 ? ScheduleKind::GPipe : ScheduleKind::OneFOneB;
  const Hardware hardware = replicate_device(profile.device, plan.stages());
  check_plan(plan, profile, hardware, "fuzz plan");  // built to fit: InputError here is a bug
  const Simulator simulator(profile, hardware);
  fuzz::check_result(simulator.run(plan), written);
  return 0;
}
