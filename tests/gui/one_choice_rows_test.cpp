// "One choice away" rows (gui/model/one_choice_rows): hand-built alternatives whose changes
// against the best plan are worked out here, and the real alternatives of a small profile.

#include "gui/model/one_choice_rows.hpp"

#include <gtest/gtest.h>

#include "gui/model/text_format.hpp"
#include "sim/hardware.hpp"
#include "sim/profile.hpp"
#include "tests/gui/gui_test_support.hpp"

namespace pipetune::gui {
namespace {

PlanCandidate candidate(std::vector<int> balance, double iteration_ms,
                        std::vector<std::int64_t> peaks) {
  PlanCandidate c;
  c.plan.balance = std::move(balance);
  c.iteration_ms = iteration_ms;
  c.peak_memory_bytes = std::move(peaks);
  return c;
}

constexpr std::int64_t MiB = std::int64_t{1} << 20;

TEST(OneChoiceRows, SayHowFarEachAlternativeIsFromTheBestPlan) {
  OneChoiceAway away;
  away.best = candidate({3, 3}, 10.0, {100 * MiB, 200 * MiB});  // largest peak 200 MiB
  away.alternatives.push_back(
      {"checkpoint always", candidate({2, 4}, 12.0, {150 * MiB, 120 * MiB}), {}});
  away.alternatives.push_back({"schedule gpipe", std::nullopt, {}});
  away.alternatives.push_back(
      {"chunks 8 (8 micro-batches)", candidate({4, 2}, 9.0, {400 * MiB, 10 * MiB}), {}});
  away.alternatives.push_back({"schedule dualpipev, 2/device", std::nullopt, "torch refuses it"});

  const std::vector<OneChoiceRow> rows = one_choice_rows(away);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[3].balance, QStringLiteral("torch refuses it"));  // not "does not fit"
  EXPECT_FALSE(rows[3].plan);

  EXPECT_EQ(rows[0].change, QStringLiteral("checkpoint always"));
  EXPECT_EQ(rows[0].iteration, QStringLiteral("12.0 ms"));
  EXPECT_EQ(rows[0].time_change, QStringLiteral("+20.0 %"));    // 12 / 10 - 1
  EXPECT_EQ(rows[0].peak, format_size(150 * MiB));              // the larger of its two peaks
  EXPECT_EQ(rows[0].memory_change, QStringLiteral("−25.0 %"));  // 150 / 200 - 1
  EXPECT_EQ(rows[0].balance, QStringLiteral("[2,4]"));
  ASSERT_TRUE(rows[0].plan);
  EXPECT_EQ(rows[0].plan->balance, (std::vector<int>{2, 4}));

  EXPECT_EQ(rows[1].change, QStringLiteral("schedule gpipe"));
  EXPECT_EQ(rows[1].balance, QStringLiteral("does not fit"));
  EXPECT_EQ(rows[1].iteration, QStringLiteral("—"));
  EXPECT_EQ(rows[1].time_change, QStringLiteral("—"));
  EXPECT_FALSE(rows[1].plan);  // nothing to load

  EXPECT_EQ(rows[2].time_change, QStringLiteral("−10.0 %"));   // 9 / 10 - 1
  EXPECT_EQ(rows[2].memory_change, QStringLiteral("+100 %"));  // 400 / 200 - 1
  EXPECT_EQ(rows[2].peak, format_size(400 * MiB));
}

TEST(OneChoiceRows, WithoutAKnownPeakTheMemoryChangeIsUnknown) {
  OneChoiceAway away;
  away.best = candidate({1}, 4.0, {0});
  away.alternatives.push_back({"chunks 2 (2 micro-batches)", candidate({1}, 5.0, {0}), {}});
  const auto rows = one_choice_rows(away);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].memory_change, QStringLiteral("—"));
  EXPECT_EQ(rows[0].time_change, QStringLiteral("+25.0 %"));
}

TEST(OneChoiceRows, OfARealSearchListEveryAlternativeWithItsOwnPlan) {
  const Profile profile = load_profile(testing::data_path("tiny.profile.json"));
  const Hardware hardware = load_hardware(testing::data_path("hardware-2.json"));
  PlannerOptions options = single_stage_planner_options();
  const PlanSearchResult result = find_best_plans(profile, hardware, options);
  ASSERT_FALSE(result.ranked.empty());
  ASSERT_TRUE(result.stats.proven);  // so no alternative can be faster than the best
  OneChoiceAway away;
  away.best = result.ranked.front();
  away.alternatives = one_choice_away(profile, hardware, options, away.best);
  const auto rows = one_choice_rows(away);
  ASSERT_EQ(rows.size(), away.alternatives.size());
  ASSERT_FALSE(rows.empty());
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const Alternative& a = away.alternatives[k];
    EXPECT_EQ(rows[k].change.toStdString(), a.change);
    EXPECT_EQ(rows[k].plan.has_value(), a.best.has_value());
    if (!a.best) continue;
    EXPECT_EQ(*rows[k].plan, a.best->plan);
    EXPECT_NE(*rows[k].plan, away.best.plan);  // one choice changed
    // The best plan is the fastest: no alternative is quicker.
    EXPECT_GE(a.best->iteration_ms, away.best.iteration_ms - 1e-9) << a.change;
    EXPECT_FALSE(rows[k].time_change.startsWith(QStringLiteral("−"))) << a.change;
  }
}

}  // namespace
}  // namespace pipetune::gui
