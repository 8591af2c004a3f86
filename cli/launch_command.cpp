// pipetune launch: start the ranks of a distributed run on this machine (launch/launch.hpp).

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <memory>

#include "cli/commands.hpp"
#include "cli/number_flags.hpp"
#include "launch/launch.hpp"
#include "sim/error.hpp"

namespace pipetune::cli {

namespace {
struct LaunchFlags {
  launcher::LaunchOptions options;
  std::vector<std::string> command;  // everything after --, verbatim
};

std::vector<std::string> subcommand_names(CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_name() != "launch") names.push_back(sub->get_name());
  }
  return names;
}
}  // namespace

void add_launch_command(CLI::App& app, std::vector<Command>& commands) {
  auto flags = std::make_shared<LaunchFlags>();
  CLI::App* sub = app.add_subcommand(
      "launch", "Start N processes of a distributed run on this machine, as torchrun does");
  sub->add_option("-n,--nproc", flags->options.nproc, "processes (ranks) to start, 1 to 1024")
      ->required()
      ->check(whole_number(1, launcher::kMaxProcesses));
  sub->add_option("--master-addr", flags->options.master_addr,
                  "address rank 0 listens on, passed as MASTER_ADDR (default 127.0.0.1)")
      ->type_name("ADDR");
  sub->add_option("--master-port", flags->options.master_port,
                  "port passed as MASTER_PORT (default 0: a free one)")
      ->check(whole_number(0, 65535));
  sub->add_option("--timeout", flags->options.timeout_s,
                  "seconds the other ranks get to exit after one failed, then SIGTERM (default 30)")
      ->type_name("SECONDS")
      ->check(real_number(0.0, 86400.0));
  sub->add_flag("--tag-output", flags->options.tag_output,
                "prefix every line a rank prints with [rank N]");
  // A positional vector: after "--" CLI11 hands it every word, flags included, unparsed.
  sub->add_option("command", flags->command,
                  "after --: a pipetune subcommand and its flags, or a program and its arguments")
      ->type_name("ARGS");
  sub->footer("example: pipetune launch -n 2 -- run --distributed --model mlp --plan plan.json");

  commands.emplace_back(sub, [flags, &app] {
    launcher::LaunchOptions options = flags->options;
    const std::vector<std::string>& command = flags->command;
    if (command.empty()) {
      throw InputError(
          "launch: nothing to launch: give a subcommand or a program after --, e.g. "
          "pipetune launch -n 2 -- run --distributed ...");
    }
    const std::vector<std::string> subcommands = subcommand_names(app);
    const std::string& first = command.front();
    options.args = command;
    if (first == "launch") throw InputError("launch: a launch cannot start launches");
    if (std::find(subcommands.begin(), subcommands.end(), first) != subcommands.end()) {
      // Every rank runs this very pipetune, whatever PATH says.
      options.program = "/proc/self/exe";
      options.args.insert(options.args.begin(), launcher::own_executable());
    } else if (const std::optional<std::string> program = launcher::find_program(first)) {
      options.program = *program;  // like torchrun --no-python
    } else {
      throw InputError(
          fmt::format("launch: {} is neither a pipetune subcommand ({}) nor a program on PATH",
                      first, fmt::join(subcommands, ", ")));
    }
    return launcher::launch(options);
  });
}

}  // namespace pipetune::cli
