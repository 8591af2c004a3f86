#pragma once

// Starting the ranks: one fork and execve each, in a process group of their own (so a signal
// reaches what they start too), dying with the launcher, with the rendezvous environment and,
// under --tag-output, their output through pipes.

#include <sys/types.h>

#include <string>
#include <vector>

#include "launch/launch.hpp"
#include "launch/rank_output.hpp"
#include "launch/stop_signals.hpp"

namespace pipetune::launcher {

struct RankProcess {
  pid_t pid = -1;
  TaggedStream out, err;  ///< fd -1 unless --tag-output
};

struct StartedRanks {
  std::vector<RankProcess> ranks;
  pid_t group = 0;  ///< the ranks' process group: the first rank's pid
};

/// This process's environment without the variables the launcher owns, plus RANK, LOCAL_RANK,
/// WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and PIPETUNE_LAUNCHED=1.
std::vector<std::string> rank_environment(const LaunchOptions& options, int port, int rank);

/// Starts every rank. Throws WorkError when one cannot be started, after killing and reaping
/// those that were.
StartedRanks start_ranks(const LaunchOptions& options, int port, const StopSignals& stop_signals);

/// Sends `signal` to the ranks' group and to each rank whose `running` flag is set (a rank that
/// left the group still gets it by pid).
void signal_ranks(const StartedRanks& started, const std::vector<bool>& running, int signal);

}  // namespace pipetune::launcher
