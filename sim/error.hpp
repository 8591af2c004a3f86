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

}  // namespace pipetune
