// The rank-merge codec: what a rank sends rank 0 after a step reads back as it was sent, a
// malformed part is refused by name, and rank 0 puts the parts on its own clock.

#include "executor/rank_merge.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "executor/executor.hpp"
#include "sim/error.hpp"

namespace pipetune::exec {
namespace {

TraceTask task(TaskKind kind, int stage, int micro_batch, int device, int peer, std::int64_t bytes,
               double start_ms, double end_ms) {
  TraceTask t;
  t.kind = kind;
  t.stage = stage;
  t.micro_batch = micro_batch;
  t.device = device;
  t.peer = peer;
  t.bytes = bytes;
  t.start_ms = start_ms;
  t.end_ms = end_ms;
  return t;
}

RankPart sample_part() {
  RankPart part;
  part.origin_ms = 1234.5678901234;
  part.loss = 0.1 + 0.2;  // not exactly 0.3: the codec must keep every bit
  part.step_ms = 17.25;
  part.peak_memory_bytes = (std::int64_t{1} << 40) + 3;
  part.library_memory_bytes = -512;  // a device may hold less than counted (never seen; kept whole)
  part.tasks = {task(TaskKind::Forward, 1, 0, 1, -1, 0, 0.5, 1.75),
                task(TaskKind::SendActivation, 1, 0, 1, 2, 4096, 1.75, 2.0 / 3.0),
                task(TaskKind::SendGradient, 2, 3, 2, 1, 8, 3.0, 3.5),
                task(TaskKind::Recompute, 1, 3, 1, -1, 0, 4.0, 4.25),
                task(TaskKind::Backward, 1, 3, 1, -1, 0, 4.25, 5.0),
                task(TaskKind::InputGrad, 0, 1, 0, -1, 0, 5.0, 5.5),
                task(TaskKind::WeightGrad, 0, 1, 0, -1, 0, 5.5, 6.0)};
  part.memory = {{0.0, 100}, {1.5, 4196}, {6.0, 100}};
  return part;
}

void expect_same(const RankPart& a, const RankPart& b) {
  EXPECT_EQ(a.origin_ms, b.origin_ms);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.step_ms, b.step_ms);
  EXPECT_EQ(a.peak_memory_bytes, b.peak_memory_bytes);
  EXPECT_EQ(a.library_memory_bytes, b.library_memory_bytes);
  ASSERT_EQ(a.tasks.size(), b.tasks.size());
  for (std::size_t k = 0; k < a.tasks.size(); ++k) {
    const TraceTask &x = a.tasks[k], &y = b.tasks[k];
    EXPECT_EQ(x.kind, y.kind) << k;
    EXPECT_EQ(x.stage, y.stage) << k;
    EXPECT_EQ(x.micro_batch, y.micro_batch) << k;
    EXPECT_EQ(x.device, y.device) << k;
    EXPECT_EQ(x.peer, y.peer) << k;
    EXPECT_EQ(x.bytes, y.bytes) << k;
    EXPECT_EQ(x.start_ms, y.start_ms) << k;
    EXPECT_EQ(x.end_ms, y.end_ms) << k;
  }
  ASSERT_EQ(a.memory.size(), b.memory.size());
  for (std::size_t k = 0; k < a.memory.size(); ++k) {
    EXPECT_EQ(a.memory[k].time, b.memory[k].time) << k;
    EXPECT_EQ(a.memory[k].value, b.memory[k].value) << k;
  }
}

TEST(RankMerge, APartReadsBackAsItWasSent) {
  const RankPart part = sample_part();
  expect_same(decode_rank_part(encode_rank_part(part), 1), part);
  expect_same(decode_rank_part(encode_rank_part(RankPart{}), 0), RankPart{});
}

TEST(RankMerge, FieldsAreNamedOnTheWire) {
  const std::string message = encode_rank_part(sample_part());
  for (const char* field : {"\"origin_ms\"", "\"peak_memory_bytes\"", "\"library_memory_bytes\"",
                            "\"kind\":\"send_activation\"", "\"micro_batch\"", "\"time_ms\""}) {
    EXPECT_THAT(message, ::testing::HasSubstr(field));
  }
}

std::string refusal(const std::string& message) {
  try {
    decode_rank_part(message, 2);
  } catch (const InputError& e) {
    return std::string("InputError: ") + e.what();  // a rank's message is not the user's input
  } catch (const WorkError& e) {
    return e.what();
  }
  return "accepted";
}

// `text` with its first `from` replaced by `to` (the test fails if there is none).
std::string with_replaced(const std::string& text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at == std::string::npos) return text;
  return text.substr(0, at) + to + text.substr(at + from.size());
}

TEST(RankMerge, AMalformedPartIsRefusedNamingTheRankAndField) {
  const std::string good = encode_rank_part(sample_part());
  const std::string prefix = "rank 2's part of the step: ";
  EXPECT_THAT(refusal("{\"origin_ms\": 1"), ::testing::StartsWith(prefix + "invalid JSON"));
  EXPECT_THAT(refusal("[1, 2]"), ::testing::StartsWith(prefix));
  const std::string unknown_field = with_replaced(good, "\"loss\"", "\"lost\"");
  EXPECT_THAT(refusal(unknown_field), ::testing::StartsWith(prefix));
  EXPECT_THAT(refusal(unknown_field), ::testing::HasSubstr("lost"));
  EXPECT_THAT(refusal(with_replaced(good, "\"forward\"", "\"sideways\"")),
              ::testing::StartsWith(prefix + "tasks[0].kind: expected a task kind"));
  EXPECT_THAT(refusal(with_replaced(good, "\"stage\":1", "\"stage\":\"1\"")),
              ::testing::StartsWith(prefix + "tasks[0].stage: expected"));
  EXPECT_THAT(refusal(with_replaced(good, "\"peak_memory_bytes\":", "\"peak_memory_bytes\":-")),
              ::testing::StartsWith(prefix + "peak_memory_bytes: expected"));
  // The libraries' bytes may be negative (kept whole), but they are a whole number.
  EXPECT_THAT(refusal(with_replaced(good, "\"library_memory_bytes\":-512",
                                    "\"library_memory_bytes\":\"-512\"")),
              ::testing::StartsWith(prefix + "library_memory_bytes: expected"));
}

// Whatever a broken or dying rank sends, rank 0 either reads a part or refuses it by name: every
// truncation of a good message and every byte of it changed to each of a few characters (the
// CI-run twin of a fuzzer for this format).
TEST(RankMerge, EveryTruncationAndByteChangeIsReadOrRefusedByName) {
  const std::string good = encode_rank_part(sample_part());
  const std::string prefix = "rank 2's part of the step: ";
  int refused = 0;
  auto check = [&](const std::string& message) {
    const std::string outcome = refusal(message);
    if (outcome == "accepted") return;
    ++refused;
    EXPECT_THAT(outcome, ::testing::StartsWith(prefix)) << message;
  };
  for (std::size_t n = 0; n < good.size(); ++n) check(good.substr(0, n));
  for (std::size_t at = 0; at < good.size(); ++at) {
    for (char c : {'"', '-', '9', '{', ']', 'e', '\0', '\xff'}) {
      std::string changed = good;
      changed[at] = c;
      check(changed);
    }
  }
  EXPECT_GE(refused, static_cast<int>(good.size()));  // every truncation at least
}

TEST(RankMerge, RankZeroPutsThePartsOnItsClock) {
  // Rank 1's step began 2.5 ms after rank 0's, so its times move 2.5 ms later.
  RankPart first;
  first.origin_ms = 100.0;
  first.loss = 0.0;
  first.step_ms = 9.0;
  first.peak_memory_bytes = 10;
  first.tasks = {task(TaskKind::Forward, 0, 0, 0, -1, 0, 1.0, 2.0)};
  first.memory = {{1.0, 10}};
  RankPart second;
  second.origin_ms = 102.5;
  second.loss = 0.75;
  second.step_ms = 11.0;
  second.peak_memory_bytes = 20;
  second.tasks = {task(TaskKind::Forward, 1, 0, 1, -1, 0, 0.5, 1.0)};
  second.memory = {{0.5, 20}};

  const StepRecord merged = merge_rank_parts({first, second}, 4, 100.0, true);
  EXPECT_EQ(merged.step, 4);
  EXPECT_EQ(merged.loss, 0.75);
  EXPECT_EQ(merged.step_ms, 11.0);
  EXPECT_EQ(merged.peak_memory_bytes, (std::vector<std::int64_t>{10, 20}));
  ASSERT_EQ(merged.tasks.size(), 2u);
  EXPECT_EQ(merged.tasks[0].start_ms, 1.0);
  EXPECT_EQ(merged.tasks[1].start_ms, 3.0);
  EXPECT_EQ(merged.tasks[1].end_ms, 3.5);
  EXPECT_EQ(merged.tasks[1].step, 4);
  ASSERT_EQ(merged.memory.size(), 2u);
  EXPECT_EQ(merged.memory[1][0].time, 3.0);
  EXPECT_EQ(merged.memory[1][0].value, 20);

  EXPECT_TRUE(merge_rank_parts({first, second}, 4, 100.0, false).memory.empty());
}

}  // namespace
}  // namespace pipetune::exec
