#include "sim/planner/layer_device_bound.hpp"

#include <algorithm>
#include <limits>
#include <numeric>

namespace pipetune::planning {

double layer_device_bound(const CostModel& costs, const std::vector<std::int64_t>& sizes,
                          bool split, double max_speed, double task_overhead) {
  const int layers = costs.layer_count();
  if (layers == 0 || sizes.empty() || !(max_speed > 0.0)) return 0.0;
  const double inf = std::numeric_limits<double>::infinity();
  // Per layer: its forwards and backwards over every micro-batch (a forward with or without
  // autograd, a backward whole or as I + W, whichever is less), and its least forward and
  // backward step of a round trip (the I where split) at any size.
  std::vector<double> forwards(layers, 0.0), backwards(layers, 0.0);
  std::vector<double> forward_step(layers, inf), back_step(layers, inf);
  for (std::int64_t size : sizes) {
    const SizeCosts& s = costs.at(size);
    for (int k = 0; k < layers; ++k) {
      forwards[k] += s.least_forward_ms(k);
      backwards[k] += s.least_backward_ms(k);
      forward_step[k] = std::min(forward_step[k], s.least_forward_ms(k));
      back_step[k] =
          std::min(back_step[k], split ? s.least_input_backward_ms(k) : s.backward_ms[k]);
    }
  }
  const double forward_trip = std::accumulate(forward_step.begin(), forward_step.end(), 0.0);
  const double back_trip = std::accumulate(back_step.begin(), back_step.end(), 0.0);
  const double tasks = task_overhead * static_cast<double>(sizes.size());
  double best = 0.0, forward_before = 0.0, back_before = 0.0;
  for (int h = 0; h < layers; ++h) {
    const double tail = split ? 0.0 : back_before;  // back through the layers before h
    const double whole = forward_before + forwards[h] + backwards[h] + tail;
    const double forwards_first = forward_trip - forward_step[h] + forwards[h] + back_trip;
    const double back_after = back_trip - back_before - back_step[h];  // through those after h
    const double backwards_last = forward_trip + back_after + backwards[h] + tail;
    best = std::max({best, whole / max_speed + 2.0 * tasks, forwards_first / max_speed + tasks,
                     backwards_last / max_speed + tasks});
    forward_before += forward_step[h];
    back_before += back_step[h];
  }
  return best;
}

}  // namespace pipetune::planning
