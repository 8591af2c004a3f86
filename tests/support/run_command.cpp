#include "tests/support/run_command.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>

namespace pipetune::testing {

namespace {
CommandResult run(const std::vector<std::string>& argv, const std::string& directory,
                  double timeout_s, const std::string& trigger, int signal_to_send);
}  // namespace

CommandResult run_command(const std::vector<std::string>& argv, const std::string& directory,
                          double timeout_s) {
  return run(argv, directory, timeout_s, {}, 0);
}

CommandResult run_command_signalled(const std::vector<std::string>& argv,
                                    const std::string& trigger, int signal, double timeout_s) {
  return run(argv, {}, timeout_s, trigger, signal);
}

namespace {
CommandResult run(const std::vector<std::string>& argv, const std::string& directory,
                  double timeout_s, const std::string& trigger, int signal_to_send) {
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    const int null = open("/dev/null", O_RDONLY);
    dup2(null, STDIN_FILENO);
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    close(out_pipe[0]);
    close(err_pipe[0]);
    if (!directory.empty() && chdir(directory.c_str()) != 0) _exit(127);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  CommandResult result;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  bool killed = false;

  char buffer[65536];
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      kill(pid, SIGKILL);
      killed = true;
      break;
    }
    if (poll(fds, 2, static_cast<int>(std::min<long long>(left.count(), 1000))) < 0) break;
    for (int k = 0; k < 2; ++k) {
      if (fds[k].fd >= 0 && (fds[k].revents & (POLLIN | POLLHUP))) {
        const ssize_t n = read(fds[k].fd, buffer, sizeof buffer);
        if (n > 0) {
          sinks[k]->append(buffer, static_cast<std::size_t>(n));
          if (k == 1 && signal_to_send != 0 && !trigger.empty() &&
              result.err.find(trigger) != std::string::npos) {
            kill(pid, signal_to_send);
            signal_to_send = 0;
          }
        } else {
          close(fds[k].fd);
          fds[k].fd = -1;
          --open_fds;
        }
      }
    }
  }
  for (auto& f : fds) {
    if (f.fd >= 0) close(f.fd);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.exit_code = 128 + WTERMSIG(status);
  if (killed) result.exit_code = 128 + SIGKILL;
  return result;
}
}  // namespace

}  // namespace pipetune::testing
