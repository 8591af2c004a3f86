#pragma once

#include <vector>

#include "sim/cost_model.hpp"
#include "sim/hardware.hpp"
#include "sim/plan.hpp"

namespace pipetune {

/// The balance that minimises the busiest device's compute per iteration (forward, backward and
/// recompute of every micro-batch, at each device's speed), for `stages` stages with the other
/// fields of `shape` (chunks, checkpoint, devices), by min_max_partition: exact, devices of
/// different speeds included. The sweep, validate and the GUI's device-count edits use it when
/// no balance is given. Empty when the profile has fewer layers than stages.
std::vector<int> time_balanced(const CostModel& costs, const Hardware& hardware, int stages,
                               const Plan& shape);

}  // namespace pipetune
