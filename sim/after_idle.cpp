#include "sim/after_idle.hpp"

#include <algorithm>
#include <stdexcept>

#include "sim/compare.hpp"

namespace pipetune {

double after_idle_extra_ms(std::span<const AfterIdlePoint> points, double idle_ms) {
  if (points.empty() || idle_ms <= 0.0) return 0.0;
  if (idle_ms >= points.back().idle_ms) return points.back().extra_ms;
  double x0 = 0.0, y0 = 0.0;
  for (const AfterIdlePoint& p : points) {
    if (idle_ms <= p.idle_ms) {
      const double span = p.idle_ms - x0;
      return span > 0.0 ? y0 + (p.extra_ms - y0) * (idle_ms - x0) / span : p.extra_ms;
    }
    x0 = p.idle_ms;
    y0 = p.extra_ms;
  }
  return points.back().extra_ms;
}

double AfterIdleDebt::pay(std::span<const AfterIdlePoint> points, double idle_ms, double work_ms) {
  owed_ms_ = std::max(owed_ms_, after_idle_extra_ms(points, idle_ms));
  const double paid = std::min(owed_ms_, std::max(0.0, work_ms));
  owed_ms_ -= paid;
  return paid;
}

std::vector<AfterIdlePoint> fit_after_idle(std::span<const double> idle_ms,
                                           std::span<const std::vector<double>> samples_ms) {
  if (idle_ms.size() < 2 || idle_ms.size() != samples_ms.size())
    throw std::invalid_argument("fit_after_idle: two or more idles, each with its samples");
  for (const auto& s : samples_ms)
    if (s.empty()) throw std::invalid_argument("fit_after_idle: an idle without samples");
  const double back_to_back = median(samples_ms[0]);
  // Pool adjacent violators: blocks of (mean, weight) that never fall.
  struct Block {
    double value, weight;
    std::size_t count;
  };
  std::vector<Block> blocks;
  for (std::size_t k = 1; k < idle_ms.size(); ++k) {
    blocks.push_back(
        {median(samples_ms[k]) - back_to_back, static_cast<double>(samples_ms[k].size()), 1});
    while (blocks.size() >= 2 && blocks[blocks.size() - 2].value > blocks.back().value) {
      const Block top = blocks.back();
      blocks.pop_back();
      Block& below = blocks.back();
      below.value =
          (below.value * below.weight + top.value * top.weight) / (below.weight + top.weight);
      below.weight += top.weight;
      below.count += top.count;
    }
  }
  std::vector<AfterIdlePoint> points;
  std::size_t k = 1;
  for (const Block& b : blocks)
    for (std::size_t i = 0; i < b.count; ++i, ++k)
      points.push_back({idle_ms[k], std::max(0.0, b.value)});
  return points;
}

LayerRun cheapest_run(std::span<const double> forward_ms, double at_least) {
  LayerRun best{0, forward_ms.size(), 0.0};
  for (const double ms : forward_ms) best.ms += ms;
  if (best.ms < at_least) return best;
  double sum = 0.0;
  for (std::size_t first = 0, end = 0; first < forward_ms.size(); ++first) {
    while (end < forward_ms.size() && sum < at_least) sum += forward_ms[end++];
    if (sum < at_least) break;
    if (sum < best.ms) best = {first, end, sum};
    sum -= forward_ms[first];
  }
  return best;
}

}  // namespace pipetune
