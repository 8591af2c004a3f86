// The launcher's states, driven by fabricated exits, signals and clock readings: each rule of
// launch/supervisor.hpp checked without starting a process. (tests/cli/launch_test.cpp runs the
// same rules with real processes.)

#include "launch/supervisor.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <string>
#include <vector>

namespace pipetune::launcher {
namespace {

using State = Supervisor::State;
using namespace std::chrono_literals;

struct Recorder {
  std::vector<int> signals;
  std::vector<std::string> lines;
  Supervisor::Actions actions() {
    return {[this](int s) { signals.push_back(s); },
            [this](const std::string& l) { lines.push_back(l); }};
  }
};

const Supervisor::Clock::time_point t0{};

TEST(Supervisor, AllRanksSucceedingIsSilent) {
  Recorder r;
  Supervisor s(3, 30, 5, r.actions());
  for (int k = 0; k < 3; ++k) s.rank_exited(k, W_EXITCODE(0, 0), t0);
  EXPECT_FALSE(s.any_running());
  EXPECT_EQ(s.state(), State::Running);
  EXPECT_EQ(s.exit_code(), 0);
  EXPECT_TRUE(r.lines.empty());
  EXPECT_TRUE(r.signals.empty());
}

TEST(Supervisor, FirstFailureStopsTheOthersThenTermThenKill) {
  Recorder r;
  Supervisor s(3, 2.0, 1.0, r.actions());
  s.rank_exited(1, W_EXITCODE(3, 0), t0);
  EXPECT_EQ(s.state(), State::Stopping);
  ASSERT_EQ(r.lines.size(), 1u);
  EXPECT_EQ(r.lines[0],
            "pipetune launch: rank 1 exited with code 3 (first failure); stopping the other ranks");
  EXPECT_TRUE(r.signals.empty());  // the others get timeout_s to notice by themselves

  s.tick(t0 + 1900ms);
  EXPECT_EQ(s.state(), State::Stopping);
  s.tick(t0 + 2s);
  EXPECT_EQ(s.state(), State::Terminating);
  EXPECT_EQ(r.signals, std::vector<int>{SIGTERM});
  EXPECT_EQ(r.lines.size(), 3u);  // one line for each rank still running
  EXPECT_EQ(r.lines[1],
            "pipetune launch: rank 0 did not exit within 2 s of rank 1's failure; sent SIGTERM");

  // Rank 0 dies of our SIGTERM: no failure. Rank 2 ignores it and is killed a second later.
  s.rank_exited(0, W_EXITCODE(0, SIGTERM), t0 + 2100ms);
  EXPECT_EQ(r.lines.size(), 3u);
  s.tick(t0 + 3s);
  EXPECT_EQ(s.state(), State::Killed);
  EXPECT_EQ(r.signals, (std::vector<int>{SIGTERM, SIGKILL}));
  EXPECT_EQ(r.lines.back(),
            "pipetune launch: rank 2 did not exit within 1 s of SIGTERM; sent SIGKILL");
  s.rank_exited(2, W_EXITCODE(0, SIGKILL), t0 + 3s);
  EXPECT_FALSE(s.any_running());
  EXPECT_EQ(s.exit_code(), 3);  // the first failure's code
}

TEST(Supervisor, ZeroTimeoutsEscalateInOneTick) {
  Recorder r;
  Supervisor s(2, 0, 0, r.actions());
  s.rank_exited(0, W_EXITCODE(1, 0), t0);
  s.tick(t0);
  EXPECT_EQ(s.state(), State::Killed);
  EXPECT_EQ(r.signals, (std::vector<int>{SIGTERM, SIGKILL}));
}

TEST(Supervisor, ARankKilledByASignalWeDidNotSendHasFailed) {
  Recorder r;
  Supervisor s(2, 30, 5, r.actions());
  s.rank_exited(0, W_EXITCODE(0, SIGKILL), t0);
  EXPECT_EQ(r.lines.at(0),
            "pipetune launch: rank 0 killed by signal 9 (first failure); stopping the other ranks");
  s.rank_exited(1, W_EXITCODE(0, 0), t0);
  EXPECT_EQ(s.exit_code(), 128 + SIGKILL);
}

TEST(Supervisor, LaterFailuresAreReportedButTheFirstDecides) {
  Recorder r;
  Supervisor s(3, 30, 5, r.actions());
  s.rank_exited(2, W_EXITCODE(4, 0), t0);
  s.rank_exited(0, W_EXITCODE(5, 0), t0 + 1s);
  EXPECT_EQ(r.lines.at(1), "pipetune launch: rank 0 exited with code 5");
  s.rank_exited(1, W_EXITCODE(0, 0), t0 + 1s);
  EXPECT_EQ(s.exit_code(), 4);
}

TEST(Supervisor, ALastRankFailingAloneStopsNothing) {
  Recorder r;
  Supervisor s(1, 30, 5, r.actions());
  s.rank_exited(0, W_EXITCODE(2, 0), t0);
  EXPECT_EQ(r.lines.at(0),
            "pipetune launch: rank 0 exited with code 2");  // no "first failure" of one
  EXPECT_EQ(s.state(), State::Running);
  EXPECT_EQ(s.exit_code(), 2);
}

TEST(Supervisor, AStopSignalIsPassedOnAndASecondOneKills) {
  Recorder r;
  Supervisor s(2, 30, 5, r.actions());
  s.stop_signal(SIGINT, t0);
  EXPECT_EQ(s.state(), State::Stopping);
  EXPECT_EQ(r.signals, std::vector<int>{SIGINT});
  EXPECT_EQ(r.lines.at(0), "pipetune launch: got SIGINT; passed it on to every rank");
  // Dying of the SIGINT we passed on is no failure; the launcher reports the interruption.
  s.rank_exited(0, W_EXITCODE(0, SIGINT), t0 + 1s);
  s.stop_signal(SIGINT, t0 + 2s);
  EXPECT_EQ(s.state(), State::Killed);
  EXPECT_EQ(r.signals, (std::vector<int>{SIGINT, SIGKILL}));
  EXPECT_EQ(r.lines.at(1), "pipetune launch: got SIGINT again; sent SIGKILL to every rank");
  s.rank_exited(1, W_EXITCODE(0, SIGKILL), t0 + 2s);
  EXPECT_EQ(s.exit_code(), 128 + SIGINT);
}

TEST(Supervisor, ASignalDuringAStopKeepsTheFirstCause) {
  Recorder r;
  Supervisor s(3, 2, 5, r.actions());
  s.rank_exited(0, W_EXITCODE(1, 0), t0);
  s.stop_signal(SIGTERM, t0 + 1s);
  EXPECT_EQ(s.state(), State::Stopping);
  s.tick(t0 + 2s);  // two seconds after the failure, not after the signal
  EXPECT_EQ(s.state(), State::Terminating);
  EXPECT_NE(r.lines.back().find("of rank 0's failure"), std::string::npos) << r.lines.back();
  EXPECT_EQ(s.exit_code(), 1);
}

}  // namespace
}  // namespace pipetune::launcher
