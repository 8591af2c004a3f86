#pragma once

// Runs a program the way a user would, capturing what it prints and how it exits.

#include <string>
#include <vector>

namespace pipetune::testing {

struct CommandResult {
  std::string out;
  std::string err;
  int exit_code = -1;  ///< the exit status, or 128 + signal
};

/// Runs `argv` (argv[0] is the program's path) with stdin closed, optionally in `directory`,
/// killing it after `timeout_s` seconds (then exit_code is 128 + SIGKILL).
CommandResult run_command(const std::vector<std::string>& argv, const std::string& directory = {},
                          double timeout_s = 120.0);

/// As run_command, but sends `signal` to the program once its stderr contains `trigger` (once).
CommandResult run_command_signalled(const std::vector<std::string>& argv,
                                    const std::string& trigger, int signal,
                                    double timeout_s = 120.0);

}  // namespace pipetune::testing
