#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace pipetune::cli {

/// A progress bar on stderr for long work: "[#####.....] 512/1000 plans  3.1 s". Drawn only when
/// stderr is a terminal (logs and pipes stay clean) and at most ten times a second.
class ProgressBar {
 public:
  explicit ProgressBar(std::string unit);
  ~ProgressBar();
  void update(std::size_t done, std::size_t total, const std::string& note = {});
  void finish();

 private:
  std::string unit_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point started_, last_draw_;
};

/// Progress of a job in phases on stderr: a bar per phase on a terminal ("bar"), "progress PHASE
/// DONE TOTAL" lines for programs such as the GUI and the tests ("lines"), or nothing ("none").
class PhaseProgress {
 public:
  explicit PhaseProgress(std::string mode) : mode_(std::move(mode)) {}
  void operator()(const std::string& phase, std::size_t done, std::size_t total);
  void finish();

 private:
  std::string mode_, phase_;
  std::unique_ptr<ProgressBar> bar_;
};

/// --progress's value, or its default: "bar" on a terminal, else "none".
std::string progress_mode(const std::string& flag);

}  // namespace pipetune::cli
