// Sizes, bandwidths and balances as text: the one form the CLI and the GUI both write and read.

#include "sim/units.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace pipetune {
namespace {

TEST(Units, BytesInBinaryUnitsWithThreeDigits) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(12 * 1024 + 512), "12.5 KiB");
  EXPECT_EQ(format_bytes(150LL << 20), "150 MiB");
  EXPECT_EQ(format_bytes(3LL << 29), "1.50 GiB");
}

TEST(Units, BytesParseDecimalAndBinaryUnits) {
  EXPECT_EQ(parse_bytes("80GiB"), 80LL << 30);
  EXPECT_EQ(parse_bytes("512MiB"), 512LL << 20);
  EXPECT_EQ(parse_bytes("16GB"), 16'000'000'000LL);
  EXPECT_EQ(parse_bytes("1.5e9"), 1'500'000'000LL);
  EXPECT_EQ(parse_bytes("4k"), 4096);
  EXPECT_EQ(parse_bytes(""), -1);
  EXPECT_EQ(parse_bytes("-1"), -1);
  EXPECT_EQ(parse_bytes("12 parsecs"), -1);
}

TEST(Units, BandwidthInDecimalUnits) {
  EXPECT_EQ(format_bandwidth(25e9), "25 GB/s");
  EXPECT_EQ(format_bandwidth(1.234e10), "12.3 GB/s");
  EXPECT_EQ(format_bandwidth(3e8), "300 MB/s");
  EXPECT_EQ(format_bandwidth(5e5), "5e+05 B/s");
  EXPECT_EQ(format_bandwidth(INFINITY), "ideal");
}

TEST(Units, BandwidthParsesWhatItWritesAndWhatUsersType) {
  EXPECT_DOUBLE_EQ(parse_bandwidth("25 GB/s"), 25e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("25GB"), 25e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("1e8"), 1e8);
  EXPECT_DOUBLE_EQ(parse_bandwidth("2 GiB/s"), 2.0 * (1LL << 30));
  EXPECT_TRUE(std::isinf(parse_bandwidth("ideal")));
  EXPECT_TRUE(std::isinf(parse_bandwidth(" Inf ")));
  for (const char* bad : {"fast", "", "0", "-5GB/s", "/s", "25 GB/h"}) {
    EXPECT_TRUE(std::isnan(parse_bandwidth(bad))) << bad;
  }
  // Every value with three significant digits comes back exactly, in each unit range.
  for (double b : {7e2, 5e5, 1e6, 3.5e8, 1e9, 2.5e10, 4.56e11, 1.23e13}) {
    EXPECT_DOUBLE_EQ(parse_bandwidth(format_bandwidth(b)), b) << format_bandwidth(b);
  }
}

TEST(Units, BalanceTextBothWays) {
  EXPECT_EQ(format_balance({3, 3, 2}), "[3,3,2]");
  EXPECT_EQ(format_balance({}), "[]");
  EXPECT_EQ(parse_balance("3,3,2"), (std::vector<int>{3, 3, 2}));
  EXPECT_EQ(parse_balance(" [ 1, 5 ] "), (std::vector<int>{1, 5}));
  EXPECT_EQ(parse_balance("4 2"), (std::vector<int>{4, 2}));
  EXPECT_EQ(parse_balance(format_balance({7, 1, 12})), (std::vector<int>{7, 1, 12}));
  for (const char* bad : {"3,0", "3,x", "2,-1", "1.5,2", "99999999999"}) {
    EXPECT_TRUE(parse_balance(bad).empty()) << bad;
  }
}

}  // namespace
}  // namespace pipetune
