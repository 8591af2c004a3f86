// pipetune: the command-line shell around sim/ (and, where LibTorch is built in, the profiler
// and the executor). Every subcommand prints a one-line reason and exits 2 on bad input.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "cli/commands.hpp"
#include "cli/error_text.hpp"
#include "sim/error.hpp"

int main(int argc, char** argv) {
  using namespace pipetune;
  CLI::App app{"pipetune: profile a model, predict and plan its GPipe pipeline, run it, compare"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "pipetune " PIPETUNE_VERSION);
  std::vector<cli::Command> commands;
  cli::add_simulate_command(app, commands);
  cli::add_plan_command(app, commands);
  cli::add_sweep_command(app, commands);
  cli::add_profile_command(app, commands);
  cli::add_run_command(app, commands);
  cli::add_validate_command(app, commands);
  cli::add_demo_command(app, commands);
  cli::add_launch_command(app, commands);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::fprintf(stderr, "pipetune: %s (see --help)\n", e.what());
    return 2;
  }
  try {
    for (auto& [sub, run] : commands) {
      if (sub->parsed()) return run();
    }
  } catch (const InputError& e) {
    std::fprintf(stderr, "pipetune: error: %s\n", cli::error_text(e).c_str());
    return 2;
  } catch (const WorkError& e) {
    std::fprintf(stderr, "pipetune: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipetune: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}
