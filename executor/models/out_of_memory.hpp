#pragma once

// An allocation LibTorch could not make is the user's input asking for more memory than the
// machine has (a model or a batch too large), not a bug: it becomes one line that says what
// pipetune was doing, how many bytes were asked for and what the machine has.

#include <cstdint>
#include <exception>
#include <optional>
#include <string>

#include "sim/error.hpp"

namespace pipetune::models {

/// Names what the code in its scope is doing ("building layer block0 of mlp-2x100000"). An
/// exception that leaves the scope records the innermost one it left, for the error line.
class Activity {
 public:
  explicit Activity(std::string what);
  ~Activity();
  Activity(const Activity&) = delete;
  Activity& operator=(const Activity&) = delete;

 private:
  std::string what_;
  int exceptions_at_start_;
};

/// What the innermost Activity that the last exception left was doing ("" when none), and
/// forgets it.
std::string take_failed_activity();

/// The bytes of the CPU allocation `error` reports it could not make, when it is that report.
std::optional<std::int64_t> refused_allocation_bytes(const std::exception& error);

/// The error line for `bytes` that could not be allocated while doing `what`, with the memory
/// of this machine: "building layer block0 of mlp-2x100000: out of memory: a tensor of …".
InputError out_of_memory(const std::string& what, std::int64_t bytes);

}  // namespace pipetune::models
