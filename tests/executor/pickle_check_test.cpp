// The pickle walk against pickles written by hand from the protocol (Python's pickle.dumps
// gives the same bytes for these values), and the ways a corrupted one lies about its sizes.

#include "executor/models/pickle_check.hpp"

#include <gtest/gtest.h>

#include <string>

namespace pipetune::models {
namespace {

using namespace std::string_literals;

// pickle.dumps([1, "a"], protocol=2): PROTO 2, EMPTY_LIST, BINPUT 0, MARK, BININT1 1,
// BINUNICODE "a", BINPUT 1, APPENDS, STOP.
const std::string kList =
    "\x80\x02]q\x00(K\x01X\x01\x00\x00\x00"
    "aq\x01"
    "e."s;

TEST(PickleCheck, APickleAsPythonWritesItPasses) {
  EXPECT_EQ(pickle_refusal(kList), std::nullopt);
  // A get of an entry set before, a text PUT and GET (protocol 0), a frame (protocol 4).
  EXPECT_EQ(pickle_refusal("\x80\x02]q\x00h\x00\x86."s), std::nullopt);
  EXPECT_EQ(pickle_refusal("(lp0\ng0\n."s), std::nullopt);
  EXPECT_EQ(pickle_refusal("\x80\x04\x95\x03\x00\x00\x00\x00\x00\x00\x00]\x94."s), std::nullopt);
}

TEST(PickleCheck, MemoIndicesOutOfOrderAreRefused) {
  // LONG_BINPUT 2^31 - 1 as the first entry: LibTorch would grow its memo to 2^31 entries.
  EXPECT_EQ(pickle_refusal("\x80\x02]r\xff\xff\xff\x7f."s),
            "pickle memo index 2147483647 at byte 3 is out of order (0 set so far)");
  EXPECT_EQ(pickle_refusal("\x80\x02]q\x05."s),
            "pickle memo index 5 at byte 3 is out of order (0 set so far)");
  // A get of an entry never set.
  EXPECT_EQ(pickle_refusal("\x80\x02]q\x00h\x01."s),
            "pickle memo index 1 at byte 5 is out of order (1 set so far)");
  EXPECT_EQ(pickle_refusal("(lp0\np7\n."s),
            "pickle memo index 7 at byte 5 is out of order (1 set so far)");
}

TEST(PickleCheck, LengthsPastTheEndAreRefused) {
  // BINUNICODE announcing 4 GiB - 1: LibTorch would reserve it before reading.
  EXPECT_EQ(pickle_refusal("\x80\x02X\xff\xff\xff\xff"
                           "ab."s),
            "pickle opcode 0x58 at byte 2 announces 4294967295 bytes, but 3 are left");
  EXPECT_EQ(pickle_refusal("\x80\x02\x8d\x00\x00\x00\x00\x00\x00\x00\x80."s),
            "pickle opcode 0x8d at byte 2 announces 9223372036854775808 bytes, but 1 are left");
  EXPECT_EQ(pickle_refusal("\x80\x02r\x00\x00"s),
            "pickle opcode 0x72 at byte 2 runs past the end (2 bytes left)");
  EXPECT_EQ(pickle_refusal("\x80\x02"
                           "ctorch\n"s),
            "pickle opcode 0x63 at byte 2 runs past the end (6 bytes left)");
}

TEST(PickleCheck, UnknownOpcodesAndAMissingStopAreRefused) {
  EXPECT_EQ(pickle_refusal("\x80\x02\xff."s), "unknown pickle opcode 0xff at byte 2");
  EXPECT_EQ(pickle_refusal(kList.substr(0, kList.size() - 1)),
            "the pickle ends after 17 bytes without its STOP opcode");
  EXPECT_EQ(pickle_refusal(""), "the pickle ends after 0 bytes without its STOP opcode");
  // Whatever follows STOP is never read.
  EXPECT_EQ(pickle_refusal(kList + "\xff\xff"s), std::nullopt);
}

}  // namespace
}  // namespace pipetune::models
