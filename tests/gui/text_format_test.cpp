#include "gui/model/text_format.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "sim/plan.hpp"

namespace pipetune::gui {
namespace {

TEST(TextFormat, DurationsInTheUnitThatFits) {
  EXPECT_EQ(format_duration(12.345), QStringLiteral("12.3 ms"));
  EXPECT_EQ(format_duration(0.85), QStringLiteral("850 µs"));
  EXPECT_EQ(format_duration(1250), QStringLiteral("1.25 s"));
  EXPECT_EQ(format_duration(0.0000425), QStringLiteral("42.5 ns"));
  EXPECT_EQ(format_duration(0), QStringLiteral("0.00 ms"));
}

TEST(TextFormat, TickLabelsTellNeighboursApart) {
  EXPECT_EQ(format_tick(0, 10), QStringLiteral("0"));
  EXPECT_EQ(format_tick(20, 10), QStringLiteral("20 ms"));
  EXPECT_EQ(format_tick(2.5, 0.5), QStringLiteral("2.5 ms"));
  EXPECT_EQ(format_tick(3.22, 0.02), QStringLiteral("3.22 ms"));
  EXPECT_EQ(format_tick(3.215, 0.005), QStringLiteral("3215 µs"));
  EXPECT_EQ(format_tick(4000, 2000), QStringLiteral("4 s"));
  EXPECT_EQ(format_tick(0.0025, 0.0005), QStringLiteral("2.5 µs"));
}

TEST(TextFormat, ErrorsAreSignedPercentages) {
  EXPECT_EQ(format_error(0.125), QStringLiteral("+12.5 %"));
  EXPECT_EQ(format_error(-0.03), QStringLiteral("−3.0 %"));
  EXPECT_EQ(format_error(0.0), QStringLiteral("0.0 %"));
  EXPECT_EQ(format_error(1.5), QStringLiteral("+150 %"));
  EXPECT_EQ(format_error(NAN), QStringLiteral("—"));
}

TEST(TextFormat, BalancesRoundTrip) {
  EXPECT_EQ(parse_balance(QStringLiteral("3,3,2")), (std::vector<int>{3, 3, 2}));
  EXPECT_EQ(parse_balance(QStringLiteral(" [ 1, 5 ] ")), (std::vector<int>{1, 5}));
  EXPECT_EQ(parse_balance(QStringLiteral("4 2")), (std::vector<int>{4, 2}));
  EXPECT_TRUE(parse_balance(QStringLiteral("3,0")).empty());
  EXPECT_TRUE(parse_balance(QStringLiteral("3,x")).empty());
  EXPECT_EQ(parse_balance(format_balance({7, 1, 12})), (std::vector<int>{7, 1, 12}));
}

TEST(TextFormat, SizesAndBandwidthsParseWhatTheyPrint) {
  EXPECT_EQ(parse_size(QStringLiteral("16 GiB")), 16LL << 30);
  EXPECT_EQ(parse_size(QStringLiteral("512MiB")), 512LL << 20);
  EXPECT_EQ(parse_size(QStringLiteral("8e9")), 8'000'000'000LL);
  EXPECT_EQ(parse_size(QStringLiteral("unlimited")), 0);
  EXPECT_EQ(parse_size(QStringLiteral("lots")), -1);
  EXPECT_EQ(parse_size(format_size(128LL << 20)), 128LL << 20);
  EXPECT_TRUE(std::isinf(parse_bandwidth(QStringLiteral("ideal"))));
  EXPECT_DOUBLE_EQ(parse_bandwidth(QStringLiteral("25 GB/s")), 25e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth(QStringLiteral("1e8")), 1e8);
  EXPECT_TRUE(std::isnan(parse_bandwidth(QStringLiteral("fast"))));
  // The hardware file's ceilings (docs/formats.md): 64 TiB at most, 1 B/s at least.
  EXPECT_EQ(parse_size(QStringLiteral("64 TiB")), 64LL << 40);
  EXPECT_EQ(parse_size(QStringLiteral("65 TiB")), -1);
  EXPECT_TRUE(std::isnan(parse_bandwidth(QStringLiteral("0.4"))));
  for (double b : {1e8, 2.5e10, 4.5e11}) {
    EXPECT_DOUBLE_EQ(parse_bandwidth(format_bandwidth(b)), b);
  }
}

TEST(TextFormat, SchedulesNameTheirStagesPerDeviceWhenNotOne) {
  Plan plan;
  EXPECT_EQ(format_schedule(plan), QStringLiteral("gpipe"));
  plan.schedule = ScheduleKind::Interleaved1F1B;
  plan.stages_per_device = 3;
  EXPECT_EQ(format_schedule(plan), QStringLiteral("interleaved-1f1b, 3/device"));
  plan.schedule = ScheduleKind::ZBV;
  plan.stages_per_device = 2;
  EXPECT_EQ(format_schedule(plan), QStringLiteral("zbv, 2/device"));
}

}  // namespace
}  // namespace pipetune::gui
