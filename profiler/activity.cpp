#include "profiler/activity.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace pipetune::profiler {

void ActivityAttribution::add(std::span<const ActivityRecord> buffer) {
  for (const auto& r : buffer) {
    if (r.kind == ActivityRecord::Kind::ExternalCorrelation) {
      external_of_[r.correlation_id] = r.external_id;
    } else {
      work_.push_back(r);
    }
  }
}

std::map<std::uint64_t, RegionTime> ActivityAttribution::regions() const {
  std::map<std::uint64_t, RegionTime> out;
  for (const auto& r : work_) {
    auto it = external_of_.find(r.correlation_id);
    if (it == external_of_.end()) continue;
    RegionTime& t = out[it->second];
    if (t.records == 0 || r.start_ns < t.first_start_ns) t.first_start_ns = r.start_ns;
    if (t.records == 0 || r.end_ns > t.last_end_ns) t.last_end_ns = r.end_ns;
    t.busy_ms += static_cast<double>(r.end_ns - r.start_ns) / 1e6;
    ++t.records;
  }
  for (auto& [id, t] : out) t.span_ms = static_cast<double>(t.last_end_ns - t.first_start_ns) / 1e6;
  // The device's own time: the union of the region's work in start order, with the short gaps.
  std::map<std::uint64_t, std::vector<std::pair<std::uint64_t, std::uint64_t>>> intervals;
  for (const auto& r : work_) {
    auto it = external_of_.find(r.correlation_id);
    if (it != external_of_.end()) intervals[it->second].emplace_back(r.start_ns, r.end_ns);
  }
  for (auto& [id, spans] : intervals) {
    std::sort(spans.begin(), spans.end());
    std::uint64_t total = 0, reached = spans.front().first;
    for (const auto& [start, end] : spans) {
      if (start > reached) {
        if (start - reached <= kQueuedGapNs) total += start - reached;
        reached = start;
      }
      if (end > reached) {
        total += end - reached;
        reached = end;
      }
    }
    out[id].device_ms = static_cast<double>(total) / 1e6;
  }
  return out;
}

std::size_t ActivityAttribution::unmatched() const {
  return static_cast<std::size_t>(std::count_if(
      work_.begin(), work_.end(),
      [&](const ActivityRecord& r) { return !external_of_.count(r.correlation_id); }));
}

std::vector<std::string> ActivityAttribution::warnings() const {
  std::vector<std::string> out;
  if (dropped_ > 0) {
    out.push_back(
        fmt::format("CUPTI dropped {} activity records (its buffers were full): the affected "
                    "layers' times are too short; "
                    "profile with fewer repeats or time the layers with CUDA events",
                    dropped_));
  }
  // Work between layers (inputs made, gradients cleared) is expected to match no layer; work
  // that matches none at all means the join failed and every layer reads as free.
  if (const auto n = unmatched(); n > 0 && n == work_.size()) {
    out.push_back(
        fmt::format("none of the {} GPU activities could be joined to a measured layer: time the "
                    "layers with CUDA events",
                    n));
  }
  return out;
}

void ActivityAttribution::clear() {
  work_.clear();
  external_of_.clear();
  dropped_ = 0;
}

}  // namespace pipetune::profiler
