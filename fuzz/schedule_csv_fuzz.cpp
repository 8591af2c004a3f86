// libFuzzer target: parse_schedule_csv must accept a torch compute-only schedule CSV or throw
// InputError (a deadlock or an invalid order included: never logic_error or a crash). What it
// accepts must be written back by schedule_csv() and read again as the same programmes, and the
// simulator must run it (as `pipetune simulate --schedule-csv` would) on a profile with one
// layer per stage and one sample per micro-batch, every programme on its own device.

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_support.hpp"
#include "sim/error.hpp"
#include "sim/plan.hpp"
#include "sim/profile.hpp"
#include "sim/schedule_csv.hpp"
#include "sim/simulator.hpp"

namespace {

using namespace pipetune;

// `layers` equal layers; micro-batch sizes 1 and `batch`, so every chunk count up to the batch
// interpolates.
Profile profile_for(int layers, int batch) {
  const std::string sizes = batch == 1 ? "[1]" : fmt::format("[1, {}]", batch);
  const auto per_size = [&](double one) {
    return batch == 1 ? fmt::format("[{}]", one) : fmt::format("[{}, {}]", one, one * batch);
  };
  std::string layer_list;
  for (int l = 0; l < layers; ++l) {
    layer_list += fmt::format(
        R"({}{{"name": "{}", "param_bytes": 64, "forward_ms": {}, "backward_ms": {},
        "output_bytes": {}, "saved_bytes": {}, "workspace_bytes": {}}})",
        l ? "," : "", l, per_size(0.5 + 0.25 * (l % 3)), per_size(1.0), per_size(32), per_size(16),
        per_size(0));
  }
  return parse_profile(fmt::format(R"({{"format": "pipetune.profile/1", "model": "fuzz-csv",
      "device": {{"type": "cpu", "name": "fuzz", "memory_bytes": 0}}, "dtype": "float32",
      "batch_size": {}, "micro_batch_sizes": {}, "input_bytes": {}, "layers": [{}]}})",
                                   batch, sizes, per_size(32), layer_list),
                       "fuzz schedule profile");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Schedule schedule;
  try {
    schedule = parse_schedule_csv(text, "fuzz.csv");
  } catch (const InputError&) {
    return 0;
  }
  const std::string written = schedule_csv(schedule.per_rank);
  Schedule again;
  try {
    again = parse_schedule_csv(written, "rewritten.csv");
  } catch (const InputError& e) {
    fuzz::fail("the written schedule does not load again", e.what());
  }
  fuzz::require(again.per_rank == schedule.per_rank && again.stage_rank == schedule.stage_rank,
                "the schedule changed on a round trip", written);

  const Profile profile = profile_for(schedule.stages, schedule.micro_batches);
  const Hardware hardware = replicate_device(profile.device, schedule.ranks());
  Plan plan;
  plan.balance.assign(schedule.stages, 1);
  plan.chunks = schedule.micro_batches;
  plan.checkpoint = CheckpointMode::Never;
  for (int s = 0; s < schedule.stages; ++s) {
    plan.devices.push_back(hardware.devices[schedule.stage_rank[s]].name);
  }
  check_plan(plan, profile, hardware, "fuzz plan");  // built to fit: InputError here is a bug
  const Simulator simulator(profile, hardware);
  fuzz::check_result(simulator.run(plan, schedule), written);
  return 0;
}
