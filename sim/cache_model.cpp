#include "sim/cache_model.hpp"

#include <algorithm>
#include <map>
#include <utility>

namespace pipetune {

std::vector<double> cache_coldness(std::span<const CacheTask> tasks, int devices,
                                   std::int64_t cache_bytes) {
  const auto count = static_cast<std::size_t>(std::max(devices, 0));
  std::vector<double> clock(count, 0.0), last_free(count, 0.0);
  // When each (stage, micro-batch)'s kept tensors were last touched, on the clock of its device.
  std::map<std::pair<int, int>, double> touched;
  const double cache = static_cast<double>(std::max<std::int64_t>(cache_bytes, 1));
  auto coldness = [&](double distance) { return std::clamp(distance / cache, 0.0, 1.0); };
  std::vector<double> out;
  out.reserve(tasks.size());
  for (const CacheTask& t : tasks) {
    const auto d = static_cast<std::size_t>(t.device);
    const auto key = std::pair{t.stage, t.micro_batch};
    const double kept = static_cast<double>(t.kept_bytes);
    double w = 0.0;
    switch (t.kind) {
      case TaskKind::Forward:
      case TaskKind::Recompute: {
        w = coldness(clock[d] - last_free[d]);
        if (t.kind == TaskKind::Recompute || t.keeps) {
          clock[d] += kept;
          touched[key] = clock[d];
        }
        break;
      }
      case TaskKind::Backward:
      case TaskKind::InputGrad:
      case TaskKind::WeightGrad: {
        const auto it = touched.find(key);
        // Nothing kept on record (a profile without the forward's bytes): as the profile timed it.
        w = it == touched.end() ? 0.0 : coldness(clock[d] - it->second);
        clock[d] += kept;
        if (t.kind == TaskKind::InputGrad) {
          touched[key] = clock[d];
        } else {
          touched.erase(key);
          last_free[d] = clock[d];
        }
        break;
      }
      default:
        break;
    }
    out.push_back(w);
  }
  return out;
}

}  // namespace pipetune
