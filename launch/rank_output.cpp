#include "launch/rank_output.hpp"

#include <unistd.h>

#include <cerrno>

namespace pipetune::launcher {

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the reader is gone; the ranks' output has nowhere to go
    data.remove_prefix(static_cast<std::size_t>(n));
  }
}

void TaggedStream::emit(bool at_end) {
  std::string out;
  std::size_t start = 0;
  for (std::size_t newline; (newline = held.find('\n', start)) != std::string::npos;
       start = newline + 1) {
    out += prefix;
    out.append(held, start, newline + 1 - start);
  }
  held.erase(0, start);
  if (!held.empty() && (at_end || held.size() > kMaxHeldLine)) {
    out += prefix + held + '\n';
    held.clear();
  }
  write_all(target, out);
}

std::size_t TaggedStream::pump() {
  char buffer[65536];
  std::size_t got = 0;
  for (int reads = 0; fd >= 0 && reads < 16; ++reads) {
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n > 0) {
      held.append(buffer, static_cast<std::size_t>(n));
      got += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    close_stream();  // end of file, or an error that will not go away
  }
  if (fd >= 0) emit(false);
  return got;
}

void TaggedStream::drain() {
  while (fd >= 0 && pump() > 0) {
  }
  close_stream();
}

void TaggedStream::close_stream() {
  if (fd < 0) return;
  close(fd);
  fd = -1;
  emit(true);
}

}  // namespace pipetune::launcher
