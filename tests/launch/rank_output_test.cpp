// --tag-output's line tagging on real pipes: whole lines only, each with its rank's prefix.

#include "launch/rank_output.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

namespace pipetune::launcher {
namespace {

struct Pipes {
  int from_rank[2] = {-1, -1};  // what the rank writes
  int to_reader[2] = {-1, -1};  // what the launcher writes out
  Pipes() {
    EXPECT_EQ(pipe(from_rank), 0);
    EXPECT_EQ(pipe(to_reader), 0);
    // Room for the longest line a test writes, so the writes never block this one thread.
    fcntl(from_rank[1], F_SETPIPE_SZ, 1 << 20);
    fcntl(to_reader[1], F_SETPIPE_SZ, 1 << 20);
    fcntl(from_rank[0], F_SETFL, fcntl(from_rank[0], F_GETFL) | O_NONBLOCK);
    fcntl(to_reader[0], F_SETFL, fcntl(to_reader[0], F_GETFL) | O_NONBLOCK);
  }
  ~Pipes() {
    for (int fd : {from_rank[1], to_reader[0], to_reader[1]}) {
      if (fd >= 0) close(fd);
    }
  }
  void rank_writes(const std::string& text) { write_all(from_rank[1], text); }
  std::string written() {
    std::string out;
    char buffer[4096];
    for (ssize_t n; (n = read(to_reader[0], buffer, sizeof buffer)) > 0;)
      out.append(buffer, static_cast<std::size_t>(n));
    return out;
  }
};

TEST(RankOutput, OnlyWholeLinesEachWithThePrefix) {
  Pipes p;
  TaggedStream stream{p.from_rank[0], p.to_reader[1], "[rank 1] ", {}};
  p.rank_writes("one\ntw");
  EXPECT_EQ(stream.pump(), 6u);
  EXPECT_EQ(p.written(), "[rank 1] one\n");  // "tw" waits for its end
  p.rank_writes("o\nthree\n");
  stream.pump();
  EXPECT_EQ(p.written(), "[rank 1] two\n[rank 1] three\n");
}

TEST(RankOutput, ALastLineWithoutNewlineIsEndedWhenTheRankIsDone) {
  Pipes p;
  TaggedStream stream{p.from_rank[0], p.to_reader[1], "[rank 0] ", {}};
  p.rank_writes("done\nno newline");
  close(p.from_rank[1]);
  p.from_rank[1] = -1;
  stream.drain();
  EXPECT_EQ(stream.fd, -1);
  EXPECT_EQ(p.written(), "[rank 0] done\n[rank 0] no newline\n");
}

TEST(RankOutput, AnEndlessLineIsCutRatherThanHeld) {
  Pipes p;
  TaggedStream stream{p.from_rank[0], p.to_reader[1], "[r] ", {}};
  const std::string endless(TaggedStream::kMaxHeldLine + 10, 'x');
  p.rank_writes(endless);
  while (stream.pump() > 0) {
  }
  EXPECT_EQ(p.written(), "[r] " + endless + "\n");
  EXPECT_TRUE(stream.held.empty());
}

}  // namespace
}  // namespace pipetune::launcher
