#include "sim/corun.hpp"

#include <algorithm>

namespace pipetune {

std::vector<double> corun_shares(std::span<const ComputeSpan> tasks, int co_runners) {
  // Breakpoints of every span; between two of them the number of busy devices is constant.
  std::vector<double> times;
  times.reserve(2 * tasks.size());
  for (const ComputeSpan& t : tasks) {
    if (t.end_ms > t.start_ms) {
      times.push_back(t.start_ms);
      times.push_back(t.end_ms);
    }
  }
  std::sort(times.begin(), times.end());
  times.erase(std::unique(times.begin(), times.end()), times.end());
  const auto index_of = [&](double t) {
    return static_cast<std::size_t>(std::lower_bound(times.begin(), times.end(), t) -
                                    times.begin());
  };
  std::vector<int> busy_change(times.size() + 1, 0);
  for (const ComputeSpan& t : tasks) {
    if (t.end_ms > t.start_ms) {
      ++busy_change[index_of(t.start_ms)];
      --busy_change[index_of(t.end_ms)];
    }
  }
  // slowed[k]: the integral, up to times[k], of the co-running weight seen by a device that is
  // itself busy: the other busy devices, counted up to co_runners.
  std::vector<double> slowed(times.size(), 0.0);
  int busy = 0;
  for (std::size_t k = 0; k + 1 < times.size(); ++k) {
    busy += busy_change[k];
    const double weight =
        std::min(1.0, static_cast<double>(std::max(0, busy - 1)) / static_cast<double>(co_runners));
    slowed[k + 1] = slowed[k] + weight * (times[k + 1] - times[k]);
  }
  std::vector<double> shares(tasks.size(), 0.0);
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    const ComputeSpan& t = tasks[i];
    if (t.end_ms <= t.start_ms) continue;
    shares[i] =
        (slowed[index_of(t.end_ms)] - slowed[index_of(t.start_ms)]) / (t.end_ms - t.start_ms);
  }
  return shares;
}

}  // namespace pipetune
