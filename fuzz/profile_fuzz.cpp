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

namespace {

// Batch at most 1024 and every byte count at most 2^36 (64 GiB): extrapolated to the batch and
// summed over the layers a 64 KiB input can hold, the totals stay far below 2^63.
bool plausible(const pipetune::Profile& p) {
  constexpr std::int64_t kMaxBytes = std::int64_t{1} << 36;
  const auto small = [&](const std::vector<std::int64_t>& v) {
    return std::all_of(v.begin(), v.end(), [&](std::int64_t b) { return b <= kMaxBytes; });
  };
  if (p.batch_size > 1024 || p.device.memory_bytes > kMaxBytes || !small(p.input_bytes)) {
    return false;
  }
  return std::all_of(p.layers.begin(), p.layers.end(), [&](const pipetune::LayerProfile& l) {
    return l.param_bytes <= kMaxBytes && small(l.output_bytes) && small(l.saved_bytes) &&
           small(l.workspace_bytes) && small(l.backward_peak_bytes) &&
           small(l.backward_accumulate_peak_bytes);
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pipetune;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto trip = fuzz::round_trip(text, "profile", parse_profile, profile_to_json);
  if (!trip) return 0;
  const std::string& written = trip->written;
  fuzz::require(profile_to_json(trip->again) == written, "the profile changed on a round trip",
                written);
  const Profile& profile = trip->accepted;

  // Simulate only profiles of plausible size. Beyond that, sums of byte counts overflow int64
  // in the cost and memory models, and the cost model's cache (a vector indexed by micro-batch
  // size) grows with the batch: both reported, outside the loaders.
  if (!plausible(profile)) return 0;
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
