#pragma once

// A walk over a pickle's opcodes before LibTorch's unpickler sees it. The unpickler trusts the
// numbers a pickle carries: a memo index of 2^32 grows its memo table to that many entries and a
// string length of 4 GiB is reserved before it is read, so one flipped bit in a batch file could
// take tens of GiB (found by fuzzing the batch file). A pickle that torch.save wrote numbers its
// memo entries in order and holds every byte it announces; this checks both, and every opcode's
// argument, without building anything.

#include <optional>
#include <string>
#include <string_view>

namespace pipetune::models {

/// Why `pickle` is not a pickle torch.save could have written (an unknown opcode, an argument
/// or a length past the end, a memo index out of order, no STOP), naming the byte offset; or
/// nothing.
std::optional<std::string> pickle_refusal(std::string_view pickle);

}  // namespace pipetune::models
