#pragma once

#include <vector>

#include "sim/cost_model.hpp"
#include "sim/hardware.hpp"
#include "sim/plan.hpp"

namespace pipetune {

/// The balance that minimises the busiest device's compute per iteration (forward, backward and
/// recompute of every micro-batch, at each device's speed), for `stages` stages with the other
/// fields of `shape` (chunks, checkpoint, devices). Exact (min_max_partition). This is what the
/// sweep uses when no balance is given, and the planner's starting point. Empty when the
/// profile has fewer layers than stages.
std::vector<int> time_balanced(const CostModel& costs, const Hardware& hardware, int stages,
                               const Plan& shape);

}  // namespace pipetune
