#pragma once

// What both `pipetune` programs do with a parsed command line: run the chosen subcommand and
// turn whatever it throws into one line on stderr and an exit status (2 bad input, 1 failure).

#include <CLI/CLI.hpp>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.hpp"

namespace pipetune::cli {

/// A one-line account of an error and its exit status.
struct ErrorLine {
  int exit_code = 1;
  std::string text;  ///< printed after "pipetune: error: "
};

/// Recognises errors of libraries the caller links (LibTorch's), before they count as bugs.
using ForeignErrors = std::function<std::optional<ErrorLine>(const std::exception&)>;

/// The app's description, --version and the requirement of one subcommand.
void describe_app(CLI::App& app);

/// Parses, runs the chosen command and returns the exit status; every error is one line.
int run_app(CLI::App& app, const std::vector<Command>& commands, int argc, char** argv,
            const ForeignErrors& foreign = {});

}  // namespace pipetune::cli
