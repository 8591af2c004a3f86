#include "launch/spawn.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "sim/error.hpp"

extern char** environ;

namespace pipetune::launcher {

namespace {

// Both pipe ends close on exec, so no rank inherits another's; dup2 clears it on 1 and 2.
void make_pipe(int fds[2]) {
  if (pipe2(fds, O_CLOEXEC) != 0) {
    throw WorkError(fmt::format("launch: cannot make a pipe: {}", std::strerror(errno)));
  }
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);  // only the launcher's end
}

void close_all(std::initializer_list<int> fds) {
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// When a start fails midway: the ranks already started must not outlive the launcher.
void kill_and_reap(std::vector<RankProcess>& ranks) {
  for (RankProcess& rank : ranks) {
    if (rank.pid <= 0) continue;
    kill(rank.pid, SIGKILL);
    while (waitpid(rank.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    rank.pid = -1;
    rank.out.close_stream();
    rank.err.close_stream();
  }
}

}  // namespace

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

StartedRanks start_ranks(const LaunchOptions& options, int port, const StopSignals& stop_signals) {
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

  std::fflush(stdout);  // or the children would print what the launcher had buffered
  std::fflush(stderr);
  const pid_t launcher = getpid();
  StartedRanks started;
  started.ranks.resize(static_cast<std::size_t>(options.nproc));
  pid_t& group = started.group;

  for (int r = 0; r < options.nproc; ++r) {
    RankProcess& rank = started.ranks[static_cast<std::size_t>(r)];
    int out_pipe[2] = {-1, -1};
    int err_pipe[2] = {-1, -1};
    try {
      if (options.tag_output) {
        make_pipe(out_pipe);
        make_pipe(err_pipe);
      }
    } catch (...) {
      close_all({out_pipe[0], out_pipe[1]});
      kill_and_reap(started.ranks);
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
    close_all({out_pipe[1], err_pipe[1]});
    if (pid < 0) {
      close_all({out_pipe[0], err_pipe[0]});
      kill_and_reap(started.ranks);
      throw WorkError(
          fmt::format("launch: cannot start rank {}: {}", r, std::strerror(fork_error)));
    }
    // Also here, as the parent may signal the group before the child got to its setpgid.
    setpgid(pid, group == 0 ? pid : group);
    if (group == 0) group = pid;
    rank.pid = pid;
    if (options.tag_output) {
      rank.out = {out_pipe[0], STDOUT_FILENO, fmt::format("[rank {}] ", r), {}};
      rank.err = {err_pipe[0], STDERR_FILENO, fmt::format("[rank {}] ", r), {}};
    }
  }
  return started;
}

void signal_ranks(const StartedRanks& started, const std::vector<bool>& running, int signal) {
  if (started.group > 0) kill(-started.group, signal);
  for (std::size_t r = 0; r < started.ranks.size(); ++r) {
    if (running[r]) kill(started.ranks[r].pid, signal);
  }
}

}  // namespace pipetune::launcher
