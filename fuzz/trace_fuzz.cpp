// libFuzzer target: parse_trace must accept a document or throw InputError, and whatever it
// accepts must survive trace_to_json and a second read: the same tasks, devices and counters.
// Times are written in microseconds with three decimals, so they are compared with a tolerance.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_support.hpp"
#include "sim/error.hpp"
#include "sim/trace.hpp"

namespace {

bool close(double a, double b) {
  return std::fabs(a - b) <= 2e-6 + 1e-9 * std::max(std::fabs(a), std::fabs(b));
}

bool same(const pipetune::Trace& a, const pipetune::Trace& b) {
  if (a.kind != b.kind || a.model != b.model || a.plan != b.plan ||
      a.micro_batch_sizes != b.micro_batch_sizes || a.iteration_ms != b.iteration_ms ||
      a.throughput_samples_per_s != b.throughput_samples_per_s ||
      a.bubble_fraction != b.bubble_fraction || a.devices.size() != b.devices.size() ||
      a.tasks.size() != b.tasks.size()) {
    return false;
  }
  for (std::size_t i = 0; i < a.devices.size(); ++i) {
    const auto &x = a.devices[i], &y = b.devices[i];
    if (x.name != y.name || x.stages != y.stages || x.busy_ms != y.busy_ms ||
        x.peak_memory_bytes != y.peak_memory_bytes ||
        x.memory_capacity_bytes != y.memory_capacity_bytes || x.memory.size() != y.memory.size()) {
      return false;
    }
    for (std::size_t k = 0; k < x.memory.size(); ++k) {
      if (x.memory[k].value != y.memory[k].value || !close(x.memory[k].time, y.memory[k].time)) {
        return false;
      }
    }
  }
  for (std::size_t i = 0; i < a.tasks.size(); ++i) {
    const auto &x = a.tasks[i], &y = b.tasks[i];
    if (x.kind != y.kind || x.stage != y.stage || x.micro_batch != y.micro_batch ||
        x.device != y.device || x.peer != y.peer || x.bytes != y.bytes || x.step != y.step ||
        !close(x.start_ms, y.start_ms) || !close(x.end_ms, y.end_ms)) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pipetune;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto trip = fuzz::round_trip(text, "trace", parse_trace, trace_to_json);
  if (!trip) return 0;
  fuzz::require(same(trip->accepted, trip->again), "the trace changed on a round trip",
                trip->written);
  return 0;
}
