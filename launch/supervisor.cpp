#include "launch/supervisor.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>

namespace pipetune::launcher {

namespace {
std::string seconds(std::chrono::duration<double> d) {
  return fmt::format("{:g} s", d.count());
}
}  // namespace

const char* stop_signal_name(int signal) {
  return signal == SIGINT ? "SIGINT" : "SIGTERM";
}

Supervisor::Supervisor(int ranks, double timeout_s, double kill_after_s, Actions actions)
    : running_(static_cast<std::size_t>(ranks), true),
      signal_sent_(static_cast<std::size_t>(ranks), 0),
      timeout_(timeout_s),
      kill_after_(kill_after_s),
      actions_(std::move(actions)) {}

bool Supervisor::any_running() const {
  return std::find(running_.begin(), running_.end(), true) != running_.end();
}

void Supervisor::send(int signal) {
  actions_.signal_ranks(signal);
  for (std::size_t r = 0; r < running_.size(); ++r) {
    if (running_[r]) signal_sent_[r] = signal;
  }
}

void Supervisor::stop(std::string cause, Clock::time_point now) {
  if (state_ != State::Running) return;  // already stopping: the first cause stands
  state_ = State::Stopping;
  since_ = now;
  stop_cause_ = std::move(cause);
}

void Supervisor::stop_signal(int signal, Clock::time_point now) {
  if (++stop_signals_ == 1) {
    interrupted_by_ = signal;
    actions_.report(fmt::format("pipetune launch: got {}; passed it on to every rank",
                                stop_signal_name(signal)));
    send(signal);
    stop(fmt::format("the {}", stop_signal_name(signal)), now);
  } else if (state_ != State::Killed) {
    // A second Ctrl-C means now: do not wait out the timeout.
    actions_.report(fmt::format("pipetune launch: got {} again; sent SIGKILL to every rank",
                                stop_signal_name(signal)));
    send(SIGKILL);
    state_ = State::Killed;
    since_ = now;
  }
}

void Supervisor::rank_exited(int rank, int status, Clock::time_point now) {
  const auto r = static_cast<std::size_t>(rank);
  running_[r] = false;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  if (WIFSIGNALED(status) && WTERMSIG(status) == signal_sent_[r]) return;  // stopped by us
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::string line =
      WIFEXITED(status)
          ? fmt::format("pipetune launch: rank {} exited with code {}", rank, code)
          : fmt::format("pipetune launch: rank {} killed by signal {}", rank, WTERMSIG(status));
  if (!first_failure_) {
    first_failure_ = code;
    if (running_.size() > 1) line += " (first failure)";
    if (state_ == State::Running && any_running()) {
      line += "; stopping the other ranks";
      stop(fmt::format("rank {}'s failure", rank), now);
    }
  }
  actions_.report(line);
}

void Supervisor::tick(Clock::time_point now) {
  if (state_ == State::Stopping && now - since_ >= timeout_) {
    for (std::size_t r = 0; r < running_.size(); ++r) {
      if (running_[r]) {
        actions_.report(
            fmt::format("pipetune launch: rank {} did not exit within {} of {}; sent SIGTERM", r,
                        seconds(timeout_), stop_cause_));
      }
    }
    send(SIGTERM);
    state_ = State::Terminating;
    since_ = now;
  }
  if (state_ == State::Terminating && now - since_ >= kill_after_) {
    for (std::size_t r = 0; r < running_.size(); ++r) {
      if (running_[r]) {
        actions_.report(
            fmt::format("pipetune launch: rank {} did not exit within {} of SIGTERM; sent SIGKILL",
                        r, seconds(kill_after_)));
      }
    }
    send(SIGKILL);
    state_ = State::Killed;
    since_ = now;
  }
}

int Supervisor::exit_code() const {
  if (first_failure_) return *first_failure_;
  if (interrupted_by_ != 0) return 128 + interrupted_by_;
  return 0;
}

}  // namespace pipetune::launcher
