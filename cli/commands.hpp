#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <utility>
#include <vector>

namespace pipetune::cli {

/// A subcommand and what runs when it was given; returns the exit code.
using Command = std::pair<CLI::App*, std::function<int()>>;

void add_simulate_command(CLI::App& app, std::vector<Command>& commands);
void add_sweep_command(CLI::App& app, std::vector<Command>& commands);
void add_plan_command(CLI::App& app, std::vector<Command>& commands);
void add_demo_command(CLI::App& app, std::vector<Command>& commands);
/// launch: start the ranks of a distributed run on this machine (launch/launch.hpp).
void add_launch_command(CLI::App& app, std::vector<Command>& commands);
/// run, profile, validate: the real thing with LibTorch, a one-line refusal without it.
void add_run_command(CLI::App& app, std::vector<Command>& commands);
void add_profile_command(CLI::App& app, std::vector<Command>& commands);
void add_validate_command(CLI::App& app, std::vector<Command>& commands);

/// Every subcommand, in the order --help lists them. Which profile, run, validate and demo
/// they are depends on the library linked: the refusals and the what-if, or the LibTorch ones.
inline void add_commands(CLI::App& app, std::vector<Command>& commands) {
  add_simulate_command(app, commands);
  add_plan_command(app, commands);
  add_sweep_command(app, commands);
  add_profile_command(app, commands);
  add_run_command(app, commands);
  add_validate_command(app, commands);
  add_demo_command(app, commands);
  add_launch_command(app, commands);
}

}  // namespace pipetune::cli
