#pragma once

// Timelines in the Chrome Trace Event format (opens in Perfetto), predicted or measured
// (docs/formats.md). One pid per device, one tid per stream: 0 is compute, 1 + p is the copy
// stream towards the device with pid p.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sim/event_engine.hpp"
#include "sim/plan.hpp"
#include "sim/simulator.hpp"

namespace pipetune {

struct TraceTask {
  TaskKind kind = TaskKind::Forward;
  int stage = 0;
  int micro_batch = 0;
  int device = 0;  ///< pid: index into Trace::devices
  int peer = -1;   ///< copies: receiving device's pid
  double start_ms = 0.0;
  double end_ms = 0.0;
  std::int64_t bytes = 0;
  int step = 0;  ///< measured traces may hold several training steps

  double duration_ms() const { return end_ms - start_ms; }
  std::string label() const;
  int stream() const { return is_compute(kind) ? 0 : 1 + peer; }
};

struct TraceDevice {
  std::string name;
  std::vector<int> stages;
  double busy_ms = 0.0;
  std::int64_t peak_memory_bytes = 0;
  std::int64_t memory_capacity_bytes = 0;
  std::vector<CounterSample> memory;  ///< time (ms) -> allocated bytes
};

struct Trace {
  std::string kind = "predicted";  ///< "predicted" or "measured"
  std::string model;
  std::optional<Plan> plan;
  std::vector<std::int64_t> micro_batch_sizes;
  double iteration_ms = 0.0;
  double throughput_samples_per_s = 0.0;
  double bubble_fraction = 0.0;
  std::vector<TraceDevice> devices;
  std::vector<TraceTask> tasks;
};

inline constexpr std::string_view kTraceFormat = "pipetune.trace/1";

/// The predicted timeline of a simulation (simulate with record_tasks and record_memory).
Trace trace_from_simulation(const SimulationResult& result, const std::string& model);

std::string trace_to_json(const Trace& trace);
Trace parse_trace(std::string_view text, const std::string& source);
Trace load_trace(const std::string& path);
void save_trace(const Trace& trace, const std::string& path);

}  // namespace pipetune
