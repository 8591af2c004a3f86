#include "cli/launch.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "sim/error.hpp"

extern char** environ;

namespace pipetune::cli {

namespace {

using Clock = std::chrono::steady_clock;

// Written by the handler, read by the wait loop: the last SIGINT/SIGTERM and how many came.
volatile sig_atomic_t g_stop_signal = 0;
volatile sig_atomic_t g_stop_signal_count = 0;

void on_stop_signal(int signal) {
  g_stop_signal = signal;
  g_stop_signal_count = g_stop_signal_count + 1;
}

const char* signal_name(int signal) {
  return signal == SIGINT ? "SIGINT" : "SIGTERM";
}

// Catches SIGINT and SIGTERM while the ranks run, so they are passed on instead of killing the
// launcher (whose death would SIGKILL the ranks before they could clean up).
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    g_stop_signal_count = 0;
    for (int k = 0; k < 2; ++k) {
      sigaction(kSignals[k], nullptr, &original_[k]);
      // A signal ignored on entry (a background job's SIGINT) stays ignored, as shells expect.
      if (original_[k].sa_handler == SIG_IGN) continue;
      struct sigaction handler {};
      handler.sa_handler = on_stop_signal;
      sigemptyset(&handler.sa_mask);
      sigaction(kSignals[k], &handler, nullptr);
    }
  }
  ~StopSignals() {
    for (int k = 0; k < 2; ++k) sigaction(kSignals[k], &original_[k], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // In a child before execve: it starts with the dispositions the launcher found.
  void restore_in_child() const {
    for (int k = 0; k < 2; ++k) sigaction(kSignals[k], &original_[k], nullptr);
  }

 private:
  static constexpr int kSignals[2] = {SIGINT, SIGTERM};
  struct sigaction original_[2]{};
};

// A partial line longer than this is written out as a line of its own rather than held.
constexpr std::size_t kMaxHeldLine = 64 * 1024;

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the reader is gone; the ranks' output has nowhere to go
    data.remove_prefix(static_cast<std::size_t>(n));
  }
}

// One rank's stdout or stderr under --tag-output: read from a pipe, written whole lines at a
// time with the rank's prefix, so lines of different ranks never interleave mid-line.
struct TaggedStream {
  int fd = -1;  // the pipe's read end; -1 once closed
  int target = -1;
  std::string prefix;
  std::string held;  // the start of a line whose end has not come yet

  void emit(bool at_end) {
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

  // Reads what the pipe holds now (bounded, so one chatty rank cannot starve the loop);
  // returns how many bytes came.
  std::size_t pump() {
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

  // After the rank exited: what it wrote is all in the pipe. A process it started may keep the
  // write end open, so read what is there without waiting for end of file.
  void drain() {
    while (fd >= 0 && pump() > 0) {
    }
    close_stream();
  }

  void close_stream() {
    if (fd < 0) return;
    close(fd);
    fd = -1;
    emit(true);
  }
};

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int signal_sent = 0;  // the last signal the launcher sent it; dying of it is no failure
  TaggedStream out, err;
};

// Both pipe ends close on exec, so no rank inherits another's; dup2 clears it on 1 and 2.
void make_pipe(int fds[2]) {
  if (pipe2(fds, O_CLOEXEC) != 0) {
    throw WorkError(fmt::format("launch: cannot make a pipe: {}", std::strerror(errno)));
  }
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);  // only the launcher's end
}

std::vector<std::string> rank_environment(const LaunchOptions& options, int port, int rank) {
  static constexpr std::string_view kOwned[] = {
      "RANK",        "LOCAL_RANK",  "WORLD_SIZE",       "LOCAL_WORLD_SIZE",
      "MASTER_ADDR", "MASTER_PORT", "PIPETUNE_LAUNCHED"};
  std::vector<std::string> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const std::string_view name = text.substr(0, text.find('='));
    bool owned = false;
    for (const std::string_view o : kOwned) owned = owned || name == o;
    if (!owned) env.emplace_back(text);
  }
  env.push_back(fmt::format("RANK={}", rank));
  env.push_back(fmt::format("LOCAL_RANK={}", rank));
  env.push_back(fmt::format("WORLD_SIZE={}", options.nproc));
  env.push_back(fmt::format("LOCAL_WORLD_SIZE={}", options.nproc));
  env.push_back("MASTER_ADDR=" + options.master_addr);
  env.push_back(fmt::format("MASTER_PORT={}", port));
  env.push_back("PIPETUNE_LAUNCHED=1");
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

void check_options(const LaunchOptions& options) {
  if (options.nproc < 1 || options.nproc > kLaunchMaxProcesses) {
    throw InputError(
        fmt::format("launch: --nproc must be 1 to {}, not {}", kLaunchMaxProcesses, options.nproc));
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

// Sends `signal` to every rank still running and to their process group, which reaches the
// processes they started too (a rank that left the group still gets it by pid).
void signal_ranks(std::vector<Rank>& ranks, pid_t group, int signal) {
  if (group > 0) kill(-group, signal);
  for (Rank& rank : ranks) {
    if (!rank.running) continue;
    kill(rank.pid, signal);
    rank.signal_sent = signal;
  }
}

// When fork fails midway: the ranks already started must not outlive the launcher.
void kill_and_reap(std::vector<Rank>& ranks) {
  for (Rank& rank : ranks) {
    if (!rank.running) continue;
    kill(rank.pid, SIGKILL);
    while (waitpid(rank.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    rank.running = false;
  }
}

std::string format_seconds(double seconds) {
  return fmt::format("{:g} s", seconds);
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

  // Everything the children need is built before fork: between fork and execve a child only
  // makes async-signal-safe calls.
  std::vector<std::string> args = options.args;
  const std::vector<char*> argv = c_strings(args);
  std::vector<std::vector<std::string>> environments;
  std::vector<std::vector<char*>> envps;
  for (int r = 0; r < options.nproc; ++r)
    environments.push_back(rank_environment(options, port, r));
  for (auto& env : environments) envps.push_back(c_strings(env));
  const std::string exec_failed = fmt::format("pipetune launch: cannot run {}: ", options.program);

  const StopSignals stop_signals;
  std::fflush(stdout);  // or the children would print what the launcher had buffered
  std::fflush(stderr);
  const pid_t launcher = getpid();
  std::vector<Rank> ranks(static_cast<std::size_t>(options.nproc));
  pid_t group = 0;  // the ranks' own process group: the first rank's pid

  for (int r = 0; r < options.nproc; ++r) {
    Rank& rank = ranks[static_cast<std::size_t>(r)];
    int out_pipe[2] = {-1, -1};
    int err_pipe[2] = {-1, -1};
    try {
      if (options.tag_output) {
        make_pipe(out_pipe);
        make_pipe(err_pipe);
      }
    } catch (...) {
      for (int fd : {out_pipe[0], out_pipe[1]}) {
        if (fd >= 0) close(fd);
      }
      kill_and_reap(ranks);
      throw;
    }
    const pid_t pid = fork();
    if (pid == 0) {
      // The launcher dying (even by SIGKILL) kills the rank. If it died before prctl took
      // effect, the rank was already reparented: give up rather than run unsupervised.
      if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != launcher) _exit(127);
      setpgid(0, group);  // 0 for the first rank: it leads the group
      stop_signals.restore_in_child();
      // Ranks run outside the terminal's foreground group, where reading it would stop them.
      const int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (null >= 0) dup2(null, STDIN_FILENO);
      if (options.tag_output) {
        dup2(out_pipe[1], STDOUT_FILENO);
        dup2(err_pipe[1], STDERR_FILENO);
      }
      execve(options.program.c_str(), argv.data(), envps[static_cast<std::size_t>(r)].data());
      const char* reason = std::strerror(errno);
      write_all(STDERR_FILENO, exec_failed);
      write_all(STDERR_FILENO, reason);
      write_all(STDERR_FILENO, "\n");
      _exit(127);
    }
    const int fork_error = errno;
    for (int fd : {out_pipe[1], err_pipe[1]}) {
      if (fd >= 0) close(fd);
    }
    if (pid < 0) {
      for (int fd : {out_pipe[0], err_pipe[0]}) {
        if (fd >= 0) close(fd);
      }
      kill_and_reap(ranks);
      throw WorkError(
          fmt::format("launch: cannot start rank {}: {}", r, std::strerror(fork_error)));
    }
    // Also here, as the parent may signal the group before the child got to its setpgid.
    setpgid(pid, group == 0 ? pid : group);
    if (group == 0) group = pid;
    rank.pid = pid;
    rank.running = true;
    if (options.tag_output) {
      rank.out = {out_pipe[0], STDOUT_FILENO, fmt::format("[rank {}] ", r), {}};
      rank.err = {err_pipe[0], STDERR_FILENO, fmt::format("[rank {}] ", r), {}};
    }
  }

  std::optional<int> first_failure;  // its exit code, 128 + signal when one killed it
  int interrupted_by = 0;
  int signals_handled = 0;
  std::optional<Clock::time_point> stopping_since;  // the first failure, or the signal
  std::string stopping_cause;
  std::optional<Clock::time_point> terminated_at;
  bool killed = false;
  const auto timeout = std::chrono::duration<double>(options.timeout_s);
  const auto kill_after = std::chrono::duration<double>(options.kill_after_s);
  const auto any_running = [&] {
    for (const Rank& rank : ranks) {
      if (rank.running) return true;
    }
    return false;
  };

  for (;;) {
    if (g_stop_signal_count != signals_handled) {
      const int signal = g_stop_signal;
      const bool again = signals_handled > 0;
      signals_handled = g_stop_signal_count;
      if (!again) {
        interrupted_by = signal;
        std::fprintf(stderr, "pipetune launch: got %s; passed it on to every rank\n",
                     signal_name(signal));
        signal_ranks(ranks, group, signal);
        if (!stopping_since) {
          stopping_since = Clock::now();
          stopping_cause = fmt::format("the {}", signal_name(signal));
        }
      } else if (!killed) {
        // A second Ctrl-C means now: do not wait out the timeout.
        std::fprintf(stderr, "pipetune launch: got %s again; sent SIGKILL to every rank\n",
                     signal_name(signal));
        signal_ranks(ranks, group, SIGKILL);
        killed = true;
      }
    }

    for (std::size_t r = 0; r < ranks.size(); ++r) {
      Rank& rank = ranks[r];
      if (!rank.running) continue;
      int status = 0;
      const pid_t done = waitpid(rank.pid, &status, WNOHANG);
      if (done != rank.pid) continue;
      rank.running = false;
      rank.out.drain();
      rank.err.drain();
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
      if (WIFSIGNALED(status) && WTERMSIG(status) == rank.signal_sent) continue;  // stopped by us
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      std::string line =
          WIFEXITED(status)
              ? fmt::format("pipetune launch: rank {} exited with code {}", r, code)
              : fmt::format("pipetune launch: rank {} killed by signal {}", r, WTERMSIG(status));
      if (!first_failure) {
        first_failure = code;
        if (options.nproc > 1) line += " (first failure)";
        if (!stopping_since && any_running()) {
          line += "; stopping the other ranks";
          stopping_since = Clock::now();
          stopping_cause = fmt::format("rank {}'s failure", r);
        }
      }
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    if (!any_running()) break;

    const Clock::time_point now = Clock::now();
    if (stopping_since && !terminated_at && !killed && now - *stopping_since >= timeout) {
      for (std::size_t r = 0; r < ranks.size(); ++r) {
        if (!ranks[r].running) continue;
        std::fprintf(stderr,
                     "pipetune launch: rank %zu did not exit within %s of %s; sent SIGTERM\n", r,
                     format_seconds(options.timeout_s).c_str(), stopping_cause.c_str());
      }
      signal_ranks(ranks, group, SIGTERM);
      terminated_at = now;
    }
    if (terminated_at && !killed && now - *terminated_at >= kill_after) {
      for (std::size_t r = 0; r < ranks.size(); ++r) {
        if (!ranks[r].running) continue;
        std::fprintf(stderr,
                     "pipetune launch: rank %zu did not exit within %s of SIGTERM; sent SIGKILL\n",
                     r, format_seconds(options.kill_after_s).c_str());
      }
      signal_ranks(ranks, group, SIGKILL);
      killed = true;
    }

    // Sleep until output comes, a signal interrupts, or it is time to look at the ranks again.
    std::vector<pollfd> readable;
    std::vector<TaggedStream*> streams;
    for (Rank& rank : ranks) {
      for (TaggedStream* stream : {&rank.out, &rank.err}) {
        if (stream->fd < 0) continue;
        readable.push_back({stream->fd, POLLIN, 0});
        streams.push_back(stream);
      }
    }
    if (poll(readable.data(), readable.size(), kLaunchPollMs) > 0) {
      for (std::size_t k = 0; k < readable.size(); ++k) {
        if (readable[k].revents != 0) streams[k]->pump();
      }
    }
  }

  if (first_failure) return *first_failure;
  if (interrupted_by != 0) return 128 + interrupted_by;
  return 0;
}

}  // namespace pipetune::cli
