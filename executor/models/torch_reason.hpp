#pragma once

// Torch's own reason for a failure, in one line: a TorchScript error's first line is "The
// following operation failed in the TorchScript interpreter." and its last the reason, with the
// script's traceback between them.

#include <exception>
#include <string>

namespace pipetune::models {

/// The reason without the backtrace or the TorchScript traceback: what follows the last
/// "RuntimeError: ", else the message's first line.
std::string torch_reason(const std::exception& e);

}  // namespace pipetune::models
