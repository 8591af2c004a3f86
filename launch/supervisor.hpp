#pragma once

// What the launcher does while its ranks run, as a state machine driven by three events: a
// rank exited, a stop signal reached the launcher, time passed. Each rule is one transition,
// tested without starting a process (the actions are callbacks).
//
//   Running ──first failure (others still up), or a stop signal──▶ Stopping
//   Stopping ──timeout_s later──▶ Terminating (SIGTERM to the ranks left)
//   Terminating ──kill_after_s later──▶ Killed (SIGKILL)
//   any state ──a second stop signal──▶ Killed at once
//
// A rank that exits 0, or dies of the signal the launcher last sent it, has not failed.

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace pipetune::launcher {

class Supervisor {
 public:
  using Clock = std::chrono::steady_clock;
  enum class State { Running, Stopping, Terminating, Killed };

  struct Actions {
    std::function<void(int signal)> signal_ranks;  ///< to every rank still running, and their group
    std::function<void(const std::string& line)> report;  ///< one line for stderr
  };

  Supervisor(int ranks, double timeout_s, double kill_after_s, Actions actions);

  /// A SIGINT or SIGTERM reached the launcher: the first is passed on, a second means SIGKILL.
  void stop_signal(int signal, Clock::time_point now);
  /// Rank `rank` exited with waitpid's `status`.
  void rank_exited(int rank, int status, Clock::time_point now);
  /// Time passed: escalates where a deadline is over.
  void tick(Clock::time_point now);

  State state() const { return state_; }
  bool running(int rank) const { return running_[static_cast<std::size_t>(rank)]; }
  const std::vector<bool>& running() const { return running_; }
  bool any_running() const;
  /// 0 when no rank failed and no signal came; else the first failing rank's exit code (128 +
  /// the signal that killed it), else 128 + the stop signal the launcher received.
  int exit_code() const;

 private:
  void send(int signal);
  void stop(std::string cause, Clock::time_point now);

  std::vector<bool> running_;
  std::vector<int> signal_sent_;  // the last signal sent to each rank: dying of it is no failure
  std::chrono::duration<double> timeout_, kill_after_;
  Actions actions_;
  State state_ = State::Running;
  Clock::time_point since_{};  // when the current state began
  std::string stop_cause_;     // "rank 1's failure", "the SIGINT"
  std::optional<int> first_failure_;
  int interrupted_by_ = 0;
  int stop_signals_ = 0;
};

/// "SIGINT", "SIGTERM".
const char* stop_signal_name(int signal);

}  // namespace pipetune::launcher
