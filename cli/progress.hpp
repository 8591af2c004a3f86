#pragma once

#include <chrono>
#include <cstddef>
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

}  // namespace pipetune::cli
