#include "launch/launch.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "launch/spawn.hpp"
#include "launch/stop_signals.hpp"
#include "launch/supervisor.hpp"
#include "sim/error.hpp"

namespace pipetune::launcher {

namespace {

void check_options(const LaunchOptions& options) {
  if (options.nproc < 1 || options.nproc > kMaxProcesses) {
    throw InputError(
        fmt::format("launch: --nproc must be 1 to {}, not {}", kMaxProcesses, options.nproc));
  }
  if (options.master_port < 0 || options.master_port > 65535) {
    throw InputError(
        fmt::format("launch: --master-port must be 0 to 65535, not {}", options.master_port));
  }
  if (!std::isfinite(options.timeout_s) || options.timeout_s < 0) {
    throw InputError(
        fmt::format("launch: --timeout must be 0 or more seconds, not {}", options.timeout_s));
  }
  if (!std::isfinite(options.kill_after_s) || options.kill_after_s < 0) {
    throw InputError("launch: the SIGKILL delay must be 0 or more seconds");
  }
  if (options.master_addr.empty()) throw InputError("launch: --master-addr is empty");
  if (options.program.empty() || options.args.empty()) {
    throw InputError("launch: nothing to launch: give the command after --");
  }
}

}  // namespace

int pick_free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    throw WorkError(fmt::format("launch: cannot open a socket: {}", std::strerror(errno)));
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;  // the kernel picks a free one
  socklen_t length = sizeof address;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const int error = errno;
    close(fd);
    throw WorkError(fmt::format("launch: cannot find a free port: {}", std::strerror(error)));
  }
  close(fd);
  return ntohs(address.sin_port);
}

std::optional<std::string> find_program(const std::string& name) {
  const auto runnable = [](const std::string& path) {
    struct stat info {};
    return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
           access(path.c_str(), X_OK) == 0;
  };
  if (name.empty()) return std::nullopt;
  if (name.find('/') != std::string::npos) {
    if (runnable(name)) return name;
    return std::nullopt;
  }
  const char* path_env = std::getenv("PATH");
  const std::string_view search = path_env != nullptr ? path_env : "/bin:/usr/bin";  // execvp's
  std::size_t start = 0;
  while (start <= search.size()) {
    std::size_t end = search.find(':', start);
    if (end == std::string_view::npos) end = search.size();
    const std::string_view dir = search.substr(start, end - start);
    const std::string candidate = (dir.empty() ? std::string(".") : std::string(dir)) + "/" + name;
    if (runnable(candidate)) return candidate;
    start = end + 1;
  }
  return std::nullopt;
}

std::string own_executable() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("/proc/self/exe") : exe.string();
}

int launch(const LaunchOptions& options) {
  check_options(options);
  const int port = options.master_port != 0 ? options.master_port : pick_free_port();
  const StopSignals stop_signals;
  StartedRanks started = start_ranks(options, port, stop_signals);

  // The supervisor knows which ranks still run; its actions are only called once it exists.
  Supervisor supervisor(
      options.nproc, options.timeout_s, options.kill_after_s,
      {[&](int signal) { signal_ranks(started, supervisor.running(), signal); },
       [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); }});
  int signals_seen = 0;
  for (;;) {
    if (StopSignals::count() != signals_seen) {  // several at once count as one
      signals_seen = StopSignals::count();
      supervisor.stop_signal(StopSignals::last(), Supervisor::Clock::now());
    }
    for (std::size_t r = 0; r < started.ranks.size(); ++r) {
      RankProcess& rank = started.ranks[r];
      if (!supervisor.running(static_cast<int>(r))) continue;
      int status = 0;
      if (waitpid(rank.pid, &status, WNOHANG) != rank.pid) continue;
      rank.out.drain();
      rank.err.drain();
      supervisor.rank_exited(static_cast<int>(r), status, Supervisor::Clock::now());
    }
    if (!supervisor.any_running()) break;
    supervisor.tick(Supervisor::Clock::now());

    // Sleep until output comes, a signal interrupts, or it is time to look at the ranks again.
    std::vector<pollfd> readable;
    std::vector<TaggedStream*> streams;
    for (RankProcess& rank : started.ranks) {
      for (TaggedStream* stream : {&rank.out, &rank.err}) {
        if (stream->fd < 0) continue;
        readable.push_back({stream->fd, POLLIN, 0});
        streams.push_back(stream);
      }
    }
    if (poll(readable.data(), readable.size(), kPollMs) > 0) {
      for (std::size_t k = 0; k < readable.size(); ++k) {
        if (readable[k].revents != 0) streams[k]->pump();
      }
    }
  }
  return supervisor.exit_code();
}

}  // namespace pipetune::launcher
