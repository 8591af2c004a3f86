#pragma once
// One layer's device as a single machine with heads and tails (docs/planner.md, "One layer's
// device"): a balance-free bound on every plan of a multi-stage configuration.

#include <cstdint>
#include <vector>

#include "sim/cost_model.hpp"

namespace pipetune::planning {

/// Whatever the balance, one device runs layer h's forward and backward for every micro-batch
/// (inside its stage's tasks, which never overlap on a device), and none of those can start
/// before a micro-batch's forward has come through the layers before h, nor can the iteration
/// end before the gradient of the last of them has gone back through those layers. So for every
/// layer h the iteration is at least the largest of
/// - head + body + tail: the forward through the layers before h, then every micro-batch's
///   forward and backward of h, then the backward through the layers before h (zero bubble: no
///   tail, a W may come last);
/// - the forwards of h, then the rest of a round trip: after the device's last forward of h,
///   that micro-batch still goes forward through the layers after h and back through them all;
/// - the rest of a round trip, then the backwards of h: none starts before a micro-batch's
///   gradient has come back to h (then the tail, as in the first).
/// Compute at `max_speed` (the device and the others at best as fast as the fastest), the round
/// trips at each layer's least cost over `sizes`, each forward or backward task
/// `task_overhead` more. `split`: the schedule runs the backward as I and W (the round trips
/// count the I; on torch's runtime the first stage's I is empty and its W, the whole backward,
/// follows the gradient's arrival, so the same chain holds there).
double layer_device_bound(const CostModel& costs, const std::vector<std::int64_t>& sizes,
                          bool split, double max_speed, double task_overhead);

}  // namespace pipetune::planning
