#pragma once

// The links between the processes of a distributed run, measured with the transport the pipeline
// uses (header and data, as a stage sends them), for the simulator's hardware model.

#include <string>
#include <vector>

#include "executor/transport.hpp"
#include "sim/hardware.hpp"

namespace pipetune::distributed {

/// Every rank calls it. For each pair of ranks, a one-way copy of a small and of a large tensor
/// is timed as half a round trip; latency + bytes / bandwidth is fitted to the medians. Rank 0
/// gets a Hardware naming `device_names` (rank i runs device i), the first pair's link as the
/// default and one override per pair; the other ranks get an empty Hardware.
Hardware probe_process_links(exec::Transport& transport,
                             const std::vector<std::string>& device_names,
                             std::int64_t large_bytes = 16 << 20);

}  // namespace pipetune::distributed
