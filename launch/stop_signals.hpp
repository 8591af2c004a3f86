#pragma once

// SIGINT and SIGTERM caught while the ranks run, so the launcher passes them on instead of
// dying of them (its death would SIGKILL the ranks before they could clean up).

#include <signal.h>

namespace pipetune::launcher {

class StopSignals {
 public:
  StopSignals();   ///< catches both, except one ignored on entry (a background job's SIGINT)
  ~StopSignals();  ///< puts back what was there
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  /// How many stop signals came since construction, and the last one; async-signal-safe reads.
  static int count();
  static int last();

  /// In a child before execve: it starts with the dispositions the launcher found.
  void restore_in_child() const;

 private:
  static constexpr int kSignals[2] = {SIGINT, SIGTERM};
  struct sigaction original_[2]{};
};

}  // namespace pipetune::launcher
