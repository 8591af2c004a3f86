#pragma once

// Checks for numeric flags that say their range in words. They run on the text before CLI11
// converts it, so a malformed value ("abc", "1e999") and an out-of-range one get the same one
// line: "--devices: expected a whole number from 1 to 1024, got \"0\"".

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace pipetune::cli {

/// Every number validator's name starts with this; the rest is "whole:MIN:MAX" or
/// "real:MIN:MAX", so tests can find each numeric flag and its range from the app itself.
inline constexpr const char* kNumberValidatorPrefix = "number:";

/// A whole number from `min` to `max` (both included).
CLI::Validator whole_number(std::int64_t min, std::int64_t max);
/// A whole number of at least `min`, up to what the flag's type holds.
CLI::Validator whole_number_from(std::int64_t min);
/// A finite real number from `min` to `max` (both included).
CLI::Validator real_number(double min, double max);
/// A finite real number above zero, at most `max`.
CLI::Validator positive_real(double max);

/// What a number validator allows, read back from its name (tests use it).
struct NumberRange {
  bool whole = true;
  bool min_excluded = false;
  double min = 0;
  double max = 0;
  std::int64_t whole_min =
      0;  ///< exact bounds of a whole range (a double loses int64's last digits)
  std::int64_t whole_max = 0;
};
std::optional<NumberRange> number_range(const std::string& validator_name);

}  // namespace pipetune::cli
