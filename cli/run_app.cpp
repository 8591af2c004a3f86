#include "cli/run_app.hpp"

#include <cstdio>

#include "cli/error_text.hpp"
#include "sim/error.hpp"

namespace pipetune::cli {

namespace {

// A library's message can span lines (a backtrace, a note); the first line says what failed.
std::string first_line(const std::string& text) {
  const auto end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

}  // namespace

void describe_app(CLI::App& app) {
  app.description(
      "pipetune: profile a model, predict and plan its GPipe pipeline, run it, compare");
  app.require_subcommand(1);
  app.set_version_flag("--version", "pipetune " PIPETUNE_VERSION);
}

int run_app(CLI::App& app, const std::vector<Command>& commands, int argc, char** argv,
            const ForeignErrors& foreign) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::fprintf(stderr, "pipetune: %s (see --help)\n", first_line(e.what()).c_str());
    return 2;
  }
  try {
    for (const auto& [sub, run] : commands) {
      if (sub->parsed()) return run();
    }
  } catch (const InputError& e) {
    std::fprintf(stderr, "pipetune: error: %s\n", first_line(error_text(e)).c_str());
    return 2;
  } catch (const WorkError& e) {
    std::fprintf(stderr, "pipetune: error: %s\n", first_line(e.what()).c_str());
    return 1;
  } catch (const std::exception& e) {
    if (foreign) {
      if (const std::optional<ErrorLine> line = foreign(e)) {
        std::fprintf(stderr, "pipetune: error: %s\n", first_line(line->text).c_str());
        return line->exit_code;
      }
    }
    std::fprintf(stderr, "pipetune: internal error: %s\n", first_line(e.what()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace pipetune::cli
