#pragma once

// One process of a distributed run: who it is (the launcher's environment), and its connection
// to the others on torch.distributed's c10d: a TCPStore for the rendezvous, the clock alignment
// and the step reports, and a Gloo process group for the tensors. The header is free of c10d.

#include <memory>
#include <string>

#include "executor/transport.hpp"

namespace pipetune::distributed {

/// What torchrun, `pipetune launch` and Slurm (through the variables it maps) give a process.
struct LaunchEnvironment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;  ///< ranks on this machine (they share its cores)
  std::string master_addr;
  int master_port = 0;
};

/// Reads RANK, WORLD_SIZE, LOCAL_RANK (default: RANK), LOCAL_WORLD_SIZE (default: WORLD_SIZE),
/// MASTER_ADDR, MASTER_PORT. Throws
/// InputError naming the variable that is missing or malformed.
LaunchEnvironment read_launch_environment();

/// Whether this build has c10d's Gloo backend (it needs gloo's headers at build time).
bool gloo_built();

/// Meets the other ranks: rank 0 hosts the store at MASTER_ADDR:MASTER_PORT, every rank waits up
/// to `timeout_s` for all to arrive, then the ranks align their clocks on rank 0's and open the
/// Gloo group. `timeout_s` is also how long any rank later waits for another. Throws WorkError
/// when the others do not come, InputError when this build has no Gloo.
std::shared_ptr<exec::Transport> connect(const LaunchEnvironment& env, double timeout_s);

}  // namespace pipetune::distributed
