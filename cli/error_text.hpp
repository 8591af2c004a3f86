#pragma once

// How the CLI words a library error: the library names a wrong input in its own words ("batch
// size: …"); the CLI names it by the flag that set it ("--batch: …").

#include <string>
#include <string_view>

#include "sim/error.hpp"

namespace pipetune::cli {

/// The flag that sets `input`: "--model", "--device", "--batch", …
std::string_view flag_of(Input input);

/// The error's message as the CLI prints it: the input at fault named by its flag.
std::string error_text(const InputError& error);

}  // namespace pipetune::cli
