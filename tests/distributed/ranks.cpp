#include "tests/distributed/ranks.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "launch/launch.hpp"
#include "tests/support/scratch_dir.hpp"

namespace pipetune::testing {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

Ranks::Ranks(const std::vector<std::string>& argv, int world) {
  std::string pattern = (scratch_dir() / "ranks-XXXXXX").string();
  if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
  directory_ = pattern;
  const std::string port = std::to_string(launcher::pick_free_port());
  started_ = now_s();
  for (int r = 0; r < world; ++r) {
    out_paths_.push_back(directory_ + "/out" + std::to_string(r));
    err_paths_.push_back(directory_ + "/err" + std::to_string(r));
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      const int null = open("/dev/null", O_RDONLY);
      dup2(null, STDIN_FILENO);
      dup2(open(out_paths_[r].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), STDOUT_FILENO);
      dup2(open(err_paths_[r].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), STDERR_FILENO);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", port.c_str(), 1);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    pids_.push_back(pid);
  }
}

std::string Ranks::err(int rank) const {
  return slurp(err_paths_[rank]);
}

std::vector<RankResult> Ranks::wait(double timeout_s) {
  std::vector<RankResult> results(pids_.size());
  std::vector<bool> done(pids_.size(), false);
  std::size_t left = pids_.size();
  const double deadline = now_s() + timeout_s;
  while (left > 0) {
    for (std::size_t r = 0; r < pids_.size(); ++r) {
      if (done[r]) continue;
      int status = 0;
      if (now_s() > deadline) kill(pids_[r], SIGKILL);
      if (waitpid(pids_[r], &status, now_s() > deadline ? 0 : WNOHANG) == pids_[r]) {
        results[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        results[r].seconds = now_s() - started_;
        done[r] = true;
        --left;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (std::size_t r = 0; r < pids_.size(); ++r) {
    results[r].out = slurp(out_paths_[r]);
    results[r].err = slurp(err_paths_[r]);
  }
  pids_.clear();
  return results;
}

Ranks::~Ranks() {
  for (const int pid : pids_) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  std::error_code ignored;
  std::filesystem::remove_all(directory_, ignored);
}

}  // namespace pipetune::testing
