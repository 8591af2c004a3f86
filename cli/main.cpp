// pipetune: the command users call. It answers the commands that need no tensor itself (sim/
// work: simulate, plan, sweep; and launch) without loading LibTorch, and hands the commands that
// run a model to pipetune-torch beside it (cli/torch_part.hpp). Every subcommand prints a
// one-line reason and exits 2 on bad input.

#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.hpp"
#include "cli/run_app.hpp"
#include "cli/torch_part.hpp"
#include "launch/launch.hpp"

int main(int argc, char** argv) {
  using namespace pipetune;
  if (argc > 1 && cli::runs_a_model(argv[1])) {
    if (const auto program = cli::torch_program_beside(launcher::own_executable())) {
      const std::string why = cli::exec_torch_part(*program, argv);
      std::fprintf(stderr, "pipetune: error: cannot start %s\n", why.c_str());
      return 1;
    }
    // No pipetune-torch: this build has no LibTorch. demo falls back to a what-if below;
    // profile, run and validate refuse in one line.
  }
  CLI::App app;
  cli::describe_app(app);
  std::vector<cli::Command> commands;
  cli::add_commands(app, commands);
  return cli::run_app(app, commands, argc, argv);
}
