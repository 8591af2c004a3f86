// pipetune launch: the ranks' environment, how failures and signals end a launch, and that no
// rank outlives the launcher. The ranks are mostly `sh -c` scripts (program mode).

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/support/run_command.hpp"

namespace pipetune {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A fresh folder for one test's files, removed afterwards.
class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("pipetune_launch_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static testing::CommandResult launch(const std::vector<std::string>& args,
                                       double timeout_s = 60) {
    std::vector<std::string> argv{PIPETUNE_CLI, "launch"};
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::run_command(argv, PIPETUNE_SOURCE_DIR, timeout_s);
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Alive and not a zombie: an orphan the init process has not reaped yet is dead all the same.
bool alive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const std::size_t paren = line.rfind(')');
  return paren == std::string::npos || line.size() < paren + 3 || line[paren + 2] != 'Z';
}

// Each rank writes its pid to DIR/pidN; waits until all `count` files hold one.
std::vector<pid_t> wait_for_pids(const std::string& dir, int count, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    std::vector<pid_t> pids;
    for (int r = 0; r < count; ++r) {
      const std::string text = read_file(dir + "/pid" + std::to_string(r));
      if (!text.empty() && text.back() == '\n') pids.push_back(std::stoi(text));
    }
    if (static_cast<int>(pids.size()) == count || Clock::now() > deadline) return pids;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_F(LaunchTest, EveryRankGetsItsEnvironment) {
  const auto r = launch({"-n", "3", "--", "sh", "-c",
                         "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR "
                         "$MASTER_PORT $PIPETUNE_LAUNCHED\" > " +
                             dir_.string() + "/rank$RANK"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  int port = -1;
  for (int rank = 0; rank < 3; ++rank) {
    std::istringstream in(read_file(path("rank" + std::to_string(rank))));
    int got_rank = -1, world = -1, local_rank = -1, local_world = -1, got_port = -1, launched = -1;
    std::string addr;
    ASSERT_TRUE(in >> got_rank >> world >> local_rank >> local_world >> addr >> got_port >>
                launched)
        << "rank " << rank;
    EXPECT_EQ(got_rank, rank);
    EXPECT_EQ(local_rank, rank);
    EXPECT_EQ(world, 3);
    EXPECT_EQ(local_world, 3);
    EXPECT_EQ(addr, "127.0.0.1");
    EXPECT_GT(got_port, 0);
    EXPECT_LT(got_port, 65536);
    EXPECT_EQ(launched, 1);
    if (port >= 0) {
      EXPECT_EQ(got_port, port) << "every rank must meet at the same port";
    }
    port = got_port;
  }
}

TEST_F(LaunchTest, MasterAddressAndPortAsGiven) {
  const auto r = launch({"-n", "1", "--master-addr", "10.1.2.3", "--master-port", "29555", "--",
                         "sh", "-c", "echo $MASTER_ADDR:$MASTER_PORT"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "10.1.2.3:29555\n");
}

TEST_F(LaunchTest, FlagsAfterDashDashReachTheRankUnparsed) {
  const auto r =
      launch({"-n", "1", "--", "sh", "-c", "echo \"$@\"", "sh", "--nproc", "5", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "--nproc 5 --json\n");
}

TEST_F(LaunchTest, FailureStopsHungRanksAndLeavesNoneBehind) {
  const auto start = Clock::now();
  const auto r = launch({"-n", "3", "--timeout", "2", "--", "sh", "-c",
                         "echo $$ > " + dir_.string() +
                             "/pid$RANK; if [ $RANK = 1 ]; then exit 7; fi; exec sleep 60"});
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 7) << r.err;
  EXPECT_LT(elapsed, 15.0);
  EXPECT_NE(r.err.find("pipetune launch: rank 1 exited with code 7 (first failure); stopping the "
                       "other ranks\n"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("pipetune launch: rank 0 did not exit within 2 s of rank 1's failure; sent "
                       "SIGTERM\n"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("rank 2 did not exit within 2 s"), std::string::npos) << r.err;
  EXPECT_EQ(count(r.err, "\n"), 3u) << "one line per failure or kill: " << r.err;
  const std::vector<pid_t> pids = wait_for_pids(dir_.string(), 3, 0);
  ASSERT_EQ(pids.size(), 3u);
  for (const pid_t pid : pids) {
    EXPECT_EQ(kill(pid, 0), -1) << "pid " << pid << " outlived the launcher";
    EXPECT_EQ(errno, ESRCH);
  }
}

TEST_F(LaunchTest, RankThatIgnoresSigtermIsKilled) {
  const auto start = Clock::now();
  // Rank 0 fails only once rank 1 ignores SIGTERM, which sleep inherits across exec.
  const std::string ready = path("ready");
  const auto r = launch({"-n", "2", "--timeout", "0", "--", "sh", "-c",
                         "if [ $RANK = 0 ]; then while [ ! -e " + ready +
                             " ]; do sleep 0.02; done; exit 1; fi; trap '' TERM; touch " + ready +
                             "; exec sleep 60"});
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_LT(elapsed, 15.0);
  EXPECT_NE(r.err.find("rank 1 did not exit within 5 s of SIGTERM; sent SIGKILL"),
            std::string::npos)
      << r.err;
}

TEST_F(LaunchTest, RankKilledBySignal) {
  const auto r =
      launch({"-n", "2", "--", "sh", "-c", "if [ $RANK = 0 ]; then kill -9 $$; fi; exit 0"});
  EXPECT_EQ(r.exit_code, 137) << r.err;
  EXPECT_NE(r.err.find("pipetune launch: rank 0 killed by signal 9"), std::string::npos) << r.err;
}

TEST_F(LaunchTest, AllRanksSucceedingIsSilent) {
  const auto r = launch({"-n", "4", "--", "true"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "");
}

TEST_F(LaunchTest, SigkilledLauncherLeavesNoOrphans) {
  const pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    const int null = open("/dev/null", O_RDWR);
    dup2(null, STDIN_FILENO);
    dup2(null, STDOUT_FILENO);
    dup2(null, STDERR_FILENO);
    const std::string script = "echo $$ > " + dir_.string() + "/pid$RANK; exec sleep 60";
    execl(PIPETUNE_CLI, PIPETUNE_CLI, "launch", "-n", "3", "--", "sh", "-c", script.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  const std::vector<pid_t> pids = wait_for_pids(dir_.string(), 3, 20);
  kill(launcher, SIGKILL);
  int status = 0;
  waitpid(launcher, &status, 0);
  ASSERT_EQ(pids.size(), 3u) << "the ranks never started";
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  for (const pid_t pid : pids) {
    while (alive(pid) && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_FALSE(alive(pid)) << "rank pid " << pid << " outlived its SIGKILLed launcher";
  }
}

TEST_F(LaunchTest, SigtermIsPassedOnToTheRanks) {
  const auto r = testing::run_command_signalled(
      {PIPETUNE_CLI, "launch", "-n", "1", "--", "sh", "-c",
       "trap 'echo stopped >&2; exit 3' TERM; echo ready >&2; while :; do sleep 0.05; done"},
      "ready", SIGTERM, 60);
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("pipetune launch: got SIGTERM; passed it on to every rank"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("stopped"), std::string::npos) << r.err;
}

TEST_F(LaunchTest, TagOutputPrefixesEveryLine) {
  const auto r = launch({"-n", "2", "--tag-output", "--", "sh", "-c",
                         "echo out$RANK; echo err$RANK >&2; printf 'a\\nb\\n'; printf tail$RANK"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const std::string rank : {"0", "1"}) {
    const std::string tag = "[rank " + rank + "] ";
    EXPECT_NE(r.out.find(tag + "out" + rank + "\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(tag + "tail" + rank + "\n"), std::string::npos) << r.out;
    EXPECT_NE(r.err.find(tag + "err" + rank + "\n"), std::string::npos) << r.err;
    EXPECT_EQ(count(r.out, tag + "a\n"), 1u) << r.out;
    EXPECT_EQ(count(r.out, tag + "b\n"), 1u) << r.out;
  }
  EXPECT_EQ(count(r.out, "\n"), 8u) << r.out;
  EXPECT_EQ(count(r.out, "[rank "), 8u) << r.out;
}

TEST_F(LaunchTest, PipetuneSubcommandRunsInEveryRank) {
  const auto r = launch({"-n", "2", "--", "simulate", "--profile", "tests/data/tiny.profile.json",
                         "--plan", "tests/data/plan-2x4.json", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(r.out, "\"iteration_ms\""), 2u) << r.out;
}

TEST_F(LaunchTest, SubcommandFailureIsPropagated) {
  const auto r = launch({"-n", "2", "--", "simulate", "--profile", "nowhere.json", "--plan",
                         "tests/data/plan-2x4.json"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("exited with code 2 (first failure)"), std::string::npos) << r.err;
}

TEST_F(LaunchTest, BadInputIsRefusedWithExitTwo) {
  const std::vector<std::vector<std::string>> cases{
      {"-n", "0", "--", "sh", "-c", "true"},
      {"-n", "1025", "--", "sh", "-c", "true"},
      {"-n", "2"},
      {"-n", "2", "--"},
      {"--", "sh", "-c", "true"},
      {"-n", "2", "--timeout", "-1", "--", "true"},
      {"-n", "2", "--master-port", "70000", "--", "true"},
      {"-n", "2", "--", "no-such-program-for-pipetune-launch"},
      {"-n", "2", "--", "launch", "-n", "2", "--", "true"},
  };
  for (const auto& args : cases) {
    const auto r = launch(args);
    std::string shown;
    for (const auto& a : args) shown += a + " ";
    EXPECT_EQ(r.exit_code, 2) << shown << "\n" << r.err;
    EXPECT_EQ(count(r.err, "\n"), 1u) << shown << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("pipetune: ", 0), 0u) << shown << "\n" << r.err;
    EXPECT_EQ(r.out, "") << shown;
  }
  EXPECT_NE(launch({"-n", "2", "--", "simulat"}).err.find("neither a pipetune subcommand"),
            std::string::npos);
}

}  // namespace
}  // namespace pipetune
