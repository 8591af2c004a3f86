#include "cli/torch_part.hpp"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace pipetune::cli {

bool runs_a_model(std::string_view subcommand) {
  constexpr std::array<std::string_view, 4> kModelCommands{"profile", "run", "validate", "demo"};
  for (const std::string_view name : kModelCommands) {
    if (name == subcommand) return true;
  }
  return false;
}

std::optional<std::string> torch_program_beside(const std::string& own_program) {
  const std::filesystem::path candidate =
      std::filesystem::path(own_program).parent_path() / kTorchProgram;
  if (::access(candidate.c_str(), X_OK) != 0) return std::nullopt;
  return candidate.string();
}

std::string exec_torch_part(const std::string& program, char** argv) {
  ::execv(program.c_str(), argv);
  return program + ": " + std::strerror(errno);
}

}  // namespace pipetune::cli
