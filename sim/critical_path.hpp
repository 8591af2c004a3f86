#pragma once

#include <vector>

#include "sim/simulator.hpp"

namespace pipetune {

/// The chain of tasks that sets the iteration time: the longest path through the task graph
/// (dependencies plus stream order), each task weighted by its duration. Task indices into
/// result.tasks, in time order. Needs a result simulated with record_tasks and record_edges.
/// Because every task starts as soon as its predecessors finish, the path's length equals the
/// iteration time; a mismatch would mean the engine inserted idle time.
std::vector<int> critical_path(const SimulationResult& result);

}  // namespace pipetune
