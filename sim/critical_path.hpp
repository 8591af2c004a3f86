#pragma once

#include <vector>

#include "sim/simulator.hpp"

namespace pipetune {

/// The chain of tasks that sets the iteration time: the longest path through the task graph
/// (dependencies plus stream order), each task weighted by its duration. Task indices into
/// result.tasks, in time order. Needs a result simulated with record_tasks and record_edges.
/// Where every task starts as soon as its predecessors finish, the path's length equals the
/// iteration time. Under launch pacing (a profile with launch times) a device task may also wait
/// for its launch, which is not an edge of the graph: the path is then the device's chain of
/// tasks, as long as the iteration less those waits.
std::vector<int> critical_path(const SimulationResult& result);

}  // namespace pipetune
