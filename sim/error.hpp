#pragma once

#include <stdexcept>
#include <string>

namespace pipetune {

/// Bad input from a user: a file, a field of it, or a flag. The message already names the
/// file (or flag), the JSON path and what was expected, so front ends print it as one line
/// and exit non-zero. Anything else thrown is a bug in pipetune, not in the input.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The input was fine but the work could not be done: no plan fits the devices, a stage failed
/// while running, the build lacks what the command needs. Front ends print the message as one
/// line and exit 1, apart from bad input (2) and pipetune's own bugs ("internal error").
class WorkError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Work that waited its whole time bound for someone else (a peer rank that neither answered
/// nor died). A type, so callers tell a hang from a failure without reading the message.
class TimeoutError : public WorkError {
 public:
  using WorkError::WorkError;
};

}  // namespace pipetune
