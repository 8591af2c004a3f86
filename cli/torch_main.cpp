// pipetune-torch: the part of `pipetune` that runs models (profile, run, validate, demo) on
// LibTorch. `pipetune` execs it for those commands with the same arguments (cli/torch_part.hpp);
// it also answers the others, so a rank process or a script can call it directly.

#include <c10/util/Exception.h>

#include <CLI/CLI.hpp>

#include "cli/commands.hpp"
#include "cli/run_app.hpp"
#include "executor/models/out_of_memory.hpp"

namespace {

// LibTorch's errors carry a backtrace after their first line; users get that line, and an
// allocation the machine could not give becomes bad input that says how much was asked for.
std::optional<pipetune::cli::ErrorLine> torch_error(const std::exception& e) {
  using pipetune::cli::ErrorLine;
  namespace models = pipetune::models;
  if (const auto bytes = models::refused_allocation_bytes(e)) {
    return ErrorLine{2, models::out_of_memory(models::take_failed_activity(), *bytes).what()};
  }
  if (const auto* oom = dynamic_cast<const c10::OutOfMemoryError*>(&e)) {
    return ErrorLine{2, oom->what_without_backtrace()};
  }
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) {
    return ErrorLine{1, std::string("LibTorch: ") + error->what_without_backtrace()};
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace pipetune;
  CLI::App app;
  cli::describe_app(app);
  std::vector<cli::Command> commands;
  cli::add_commands(app, commands);
  return cli::run_app(app, commands, argc, argv, torch_error);
}
