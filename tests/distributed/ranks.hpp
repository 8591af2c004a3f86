#pragma once

// Starts the ranks of a distributed run on this machine, as a launcher would (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT), each with its output in a file, so a test can signal one rank and
// watch how the others end. Every rank still alive when the Ranks object goes is killed.

#include <string>
#include <vector>

namespace pipetune::testing {

struct RankResult {
  int exit_code = -1;    ///< the exit status, or 128 + signal
  double seconds = 0.0;  ///< from start() to its exit
  std::string out, err;
};

class Ranks {
 public:
  /// Starts `world` processes of `argv` (argv[0] is the program's path).
  Ranks(const std::vector<std::string>& argv, int world);
  ~Ranks();
  Ranks(const Ranks&) = delete;
  Ranks& operator=(const Ranks&) = delete;

  int pid(int rank) const { return pids_[rank]; }
  /// The rank's stderr so far.
  std::string err(int rank) const;
  /// Waits for every rank, killing those still running after `timeout_s`.
  std::vector<RankResult> wait(double timeout_s = 120.0);

 private:
  std::vector<int> pids_;
  std::vector<std::string> out_paths_, err_paths_;
  std::string directory_;
  double started_ = 0.0;
};

}  // namespace pipetune::testing
