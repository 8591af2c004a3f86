#pragma once

// `pipetune` is two programs. The one users call (pipetune) holds the commands that need no
// tensor (simulate, plan, sweep, launch) and starts in milliseconds; the commands that run a
// model (profile, run, validate, demo) live in pipetune-torch beside it, which links LibTorch
// and the CUDA libraries and so pays their start-up of most of a second. pipetune hands those
// commands over by exec, with the same arguments, so users see one command.

#include <optional>
#include <string>
#include <string_view>

namespace pipetune::cli {

/// The program that runs models, next to this one.
inline constexpr std::string_view kTorchProgram = "pipetune-torch";

/// Whether `subcommand` runs a model, and so belongs to pipetune-torch.
bool runs_a_model(std::string_view subcommand);

/// pipetune-torch beside `own_program`, when it is there and executable.
std::optional<std::string> torch_program_beside(const std::string& own_program);

/// Replaces this process with `program`, same arguments (argv[0] kept, so messages and --help
/// still say "pipetune"). Returns only when the exec failed, with the reason.
std::string exec_torch_part(const std::string& program, char** argv);

}  // namespace pipetune::cli
