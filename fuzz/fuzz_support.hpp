#pragma once

// Shared by the libFuzzer targets: how a broken invariant is reported, and the small fixed
// profile and hardware that plans and command lines are checked against.

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "sim/error.hpp"
#include "sim/hardware.hpp"
#include "sim/profile.hpp"
#include "sim/simulator.hpp"

namespace pipetune::fuzz {

/// A loader that accepted an input must not break what follows (the writer, a re-read):
/// abort, so that libFuzzer keeps the input as a crash.
[[noreturn]] inline void fail(std::string_view what, std::string_view detail = {}) {
  std::fprintf(stderr, "fuzz invariant broken: %.*s\n%.*s\n", static_cast<int>(what.size()),
               what.data(), static_cast<int>(detail.size()), detail.data());
  std::abort();
}

inline void require(bool ok, std::string_view what, std::string_view detail = {}) {
  if (!ok) fail(what, detail);
}

/// A document a loader accepted, what the writer made of it, and that text read back.
template <typename Document>
struct RoundTrip {
  Document accepted;
  std::string written;
  Document again;
};

/// The loaders' contract: an input is accepted or refused with InputError (then: nothing), and
/// what is accepted is written and must load again. Whether `again` is the same document is the
/// target's to judge: each format has its own sameness (text, ==, times to a tolerance).
template <typename Parse, typename Write>
auto round_trip(std::string_view text, const std::string& kind, Parse parse, Write write)
    -> std::optional<RoundTrip<decltype(parse(text, kind))>> {
  RoundTrip<decltype(parse(text, kind))> trip;
  try {
    trip.accepted = parse(text, "fuzz." + kind + ".json");
  } catch (const InputError&) {
    return std::nullopt;
  }
  trip.written = write(trip.accepted);
  try {
    trip.again = parse(trip.written, "rewritten." + kind + ".json");
  } catch (const InputError& e) {
    fail("the written " + kind + " does not load again", e.what());
  }
  return trip;
}

/// What any simulation of an accepted input must give: no NaN, no negative time or memory
/// (a negative peak is an int64 overflow or an out-of-range llround upstream).
inline void check_result(const SimulationResult& result, std::string_view input) {
  require(result.iteration_ms >= 0, "iteration time negative or NaN", input);
  require(result.bubble_fraction == result.bubble_fraction, "bubble fraction NaN", input);
  for (const auto& d : result.devices) {
    require(d.busy_ms >= 0, "busy time negative or NaN", input);
    require(d.peak_memory_bytes >= 0, "negative peak memory", input);
  }
}

// Four layers, batch 8: every plan that passes check_plan simulates in microseconds.
inline constexpr std::string_view kProfileJson = R"({
  "format": "pipetune.profile/1",
  "model": "fuzz-4",
  "device": {"type": "cpu", "name": "fuzz", "memory_bytes": 0},
  "dtype": "float32",
  "batch_size": 8,
  "micro_batch_sizes": [1, 4, 8],
  "input_bytes": [16, 64, 128],
  "layers": [
    {"name": "0", "param_bytes": 400, "forward_ms": [0.5, 1.0, 1.5], "backward_ms": [1.0, 2.0, 3.0],
     "output_bytes": [40, 160, 320], "saved_bytes": [4, 16, 32], "workspace_bytes": [0, 0, 0]},
    {"name": "1", "param_bytes": 0, "forward_ms": [0.1, 0.2, 0.4], "backward_ms": [0.1, 0.2, 0.4],
     "output_bytes": [40, 160, 320], "saved_bytes": [40, 160, 320], "workspace_bytes": [8, 8, 8]},
    {"name": "2", "param_bytes": 4000, "forward_ms": [0.3, 0.6, 1.1], "backward_ms": [0.6, 1.1, 2.0],
     "output_bytes": [20, 80, 160], "saved_bytes": [0, 0, 0], "workspace_bytes": [4, 4, 4]},
    {"name": "3", "param_bytes": 100, "forward_ms": [0.1, 0.1, 0.2], "backward_ms": [0.1, 0.2, 0.3],
     "output_bytes": [4, 16, 32], "saved_bytes": [4, 16, 32], "workspace_bytes": [0, 0, 0]}
  ]
})";

inline constexpr std::string_view kHardwareJson = R"({
  "format": "pipetune.hardware/1",
  "devices": [
    {"name": "cpu:0", "memory_bytes": 0},
    {"name": "cpu:1", "memory_bytes": 100000, "speed": 2.0},
    {"name": "gpu:0", "memory_bytes": 5000, "speed": 0.5}
  ],
  "link": {"bandwidth_bytes_per_s": 1.0e6, "latency_ms": 0.01},
  "links": [{"between": ["cpu:0", "gpu:0"], "bandwidth_bytes_per_s": null, "latency_ms": 0}],
  "launch_overhead_ms": 0.004,
  "calibration": {"compute_scale": {"2": 1.2}, "task_overhead_ms": 0.1, "fitted_on": ["[2,2] x2 never gpipe"]}
})";

inline constexpr std::string_view kPlanJson = R"({
  "format": "pipetune.plan/1",
  "balance": [2, 2],
  "chunks": 4,
  "checkpoint": "except_last",
  "schedule": "1f1b"
})";

inline const Profile& fixed_profile() {
  static const Profile profile = parse_profile(kProfileJson, "fuzz fixture profile");
  return profile;
}

inline const Hardware& fixed_hardware() {
  static const Hardware hardware = parse_hardware(kHardwareJson, "fuzz fixture hardware");
  return hardware;
}

}  // namespace pipetune::fuzz
