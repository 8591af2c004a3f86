// This build has no LibTorch: the subcommands that run models say so instead of vanishing.

#include "cli/commands.hpp"
#include "sim/error.hpp"

namespace pipetune::cli {

void add_run_command(CLI::App& app, std::vector<Command>& commands) {
  CLI::App* sub =
      app.add_subcommand("run", "Train with a plan on the GPipe executor (needs LibTorch)");
  sub->allow_extras();
  commands.emplace_back(sub, []() -> int {
    throw WorkError(
        "run: this build of pipetune has no LibTorch; run scripts/setup.sh and rebuild");
  });
}

void add_profile_command(CLI::App& app, std::vector<Command>& commands) {
  CLI::App* sub =
      app.add_subcommand("profile", "Measure every layer on the real device (needs LibTorch)");
  sub->allow_extras();
  commands.emplace_back(sub, []() -> int {
    throw WorkError(
        "profile: this build of pipetune has no LibTorch; run scripts/setup.sh and rebuild");
  });
}

void add_validate_command(CLI::App& app, std::vector<Command>& commands) {
  CLI::App* sub =
      app.add_subcommand("validate", "Predict, run for real and compare (needs LibTorch)");
  sub->allow_extras();
  commands.emplace_back(sub, []() -> int {
    throw WorkError(
        "validate: this build of pipetune has no LibTorch; run scripts/setup.sh and rebuild");
  });
}

}  // namespace pipetune::cli
