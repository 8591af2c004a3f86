#pragma once

// pipetune launch as a library: a torchrun-style local launcher. It starts one process per rank
// on this machine with the rendezvous environment `pipetune run --distributed` reads, waits for
// all of them, and stops the rest when one fails. No rank outlives the launcher.
//
// The parts: spawn (fork, exec, the ranks' process group and environment), rank_output (the
// --tag-output line prefixes), stop_signals (Ctrl-C passed on), supervisor (what happens when a
// rank fails or a signal comes, as explicit states). cli/launch_command.cpp is its flags.

#include <optional>
#include <string>
#include <vector>

namespace pipetune::launcher {

struct LaunchOptions {
  int nproc = 0;  ///< ranks to start, 1 to kMaxProcesses
  std::string master_addr = "127.0.0.1";
  int master_port = 0;            ///< 0: pick a free port
  double timeout_s = 30.0;        ///< how long the others may take to exit after a failure
  double kill_after_s = 5.0;      ///< then SIGTERM; this long after it, SIGKILL
  bool tag_output = false;        ///< prefix every line a rank prints with "[rank N] "
  std::string program;            ///< the path executed (already resolved, see find_program)
  std::vector<std::string> args;  ///< the children's argv; args[0] is their argv[0]
};

inline constexpr int kMaxProcesses = 1024;
/// Interval of the loop that reaps children and checks deadlines.
inline constexpr int kPollMs = 20;

/// Starts the ranks and waits for all of them. Returns 0 when every rank exited 0, else the
/// first failing rank's exit code (128 + signal when a signal killed it), or 128 + the signal
/// the launcher received when it was interrupted and no rank failed. Reports failures on
/// stderr. Never returns while a rank it started is alive. Throws InputError on bad options,
/// WorkError when the processes cannot be started.
int launch(const LaunchOptions& options);

/// A TCP port that was free on 127.0.0.1 a moment ago (bound to port 0, read, closed).
int pick_free_port();

/// The path execve should run for `name`: as given when it contains a '/', else the first
/// executable match on $PATH, as execvp would find it; nothing when there is none.
std::optional<std::string> find_program(const std::string& name);

/// This program's own executable, for ranks that run a pipetune subcommand: what
/// /proc/self/exe links to, for their argv[0] (execve /proc/self/exe itself, which still works
/// when the file was rebuilt meanwhile).
std::string own_executable();

}  // namespace pipetune::launcher
