#pragma once

// One rank's stdout or stderr under --tag-output: read from a pipe, written whole lines at a
// time with the rank's prefix ("[rank 1] "), so lines of different ranks never interleave
// mid-line.

#include <cstddef>
#include <string>
#include <string_view>

namespace pipetune::launcher {

/// Writes all of `data` to `fd`, retrying after signals; gives up quietly when the reader is gone.
void write_all(int fd, std::string_view data);

struct TaggedStream {
  /// A partial line longer than this is written out as a line of its own rather than held.
  static constexpr std::size_t kMaxHeldLine = 64 * 1024;

  int fd = -1;  ///< the pipe's read end (non-blocking); -1 once closed
  int target = -1;
  std::string prefix;
  std::string held;  ///< the start of a line whose end has not come yet

  /// Reads what the pipe holds now (bounded, so one chatty rank cannot starve the loop) and
  /// writes the complete lines; returns how many bytes came.
  std::size_t pump();
  /// After the rank exited: what it wrote is all in the pipe. A process it started may keep
  /// the write end open, so this reads what is there without waiting for end of file.
  void drain();
  void close_stream();

 private:
  void emit(bool at_end);
};

}  // namespace pipetune::launcher
