#include "cli/number_flags.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdlib>

namespace pipetune::cli {

namespace {

std::string in_quotes(const std::string& text) {
  return fmt::format("\"{}\"", text);
}

std::string real_text(double value) {
  return fmt::format("{:g}", value);
}

CLI::Validator whole(std::int64_t min, std::int64_t max) {
  const std::string range = fmt::format("from {} to {}", min, max);
  return CLI::Validator(
      [min, max, range](std::string& text) -> std::string {
        std::int64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [stop, error] = std::from_chars(text.data(), end, value);
        if (text.empty() || error == std::errc::invalid_argument || stop != end ||
            (error == std::errc() && (value < min || value > max)) ||
            error == std::errc::result_out_of_range) {
          return fmt::format("expected a whole number {}, got {}", range, in_quotes(text));
        }
        return {};
      },
      fmt::format("[{} to {}]", min, max),
      fmt::format("{}whole:{}:{}", kNumberValidatorPrefix, min, max));
}

CLI::Validator real(double min, double max, bool min_excluded) {
  const std::string range =
      min_excluded ? fmt::format("above {} and at most {}", real_text(min), real_text(max))
                   : fmt::format("from {} to {}", real_text(min), real_text(max));
  return CLI::Validator(
      [min, max, min_excluded, range](std::string& text) -> std::string {
        char* stop = nullptr;
        const double value = text.empty() ? NAN : std::strtod(text.c_str(), &stop);
        const bool parsed = !text.empty() && stop == text.c_str() + text.size();
        const bool below = min_excluded ? !(value > min) : !(value >= min);
        if (!parsed || !std::isfinite(value) || below || value > max) {
          return fmt::format("expected a number {}, got {}", range, in_quotes(text));
        }
        return {};
      },
      min_excluded ? fmt::format("[above {}, to {}]", real_text(min), real_text(max))
                   : fmt::format("[{} to {}]", real_text(min), real_text(max)),
      fmt::format("{}real{}:{}:{}", kNumberValidatorPrefix, min_excluded ? ">" : "", real_text(min),
                  real_text(max)));
}

}  // namespace

CLI::Validator whole_number(std::int64_t min, std::int64_t max) {
  return whole(min, max);
}

CLI::Validator whole_number_from(std::int64_t min) {
  return whole(min, std::numeric_limits<int>::max());
}

CLI::Validator real_number(double min, double max) {
  return real(min, max, false);
}

CLI::Validator positive_real(double max) {
  return real(0.0, max, true);
}

std::optional<NumberRange> number_range(const std::string& name) {
  const std::string prefix = kNumberValidatorPrefix;
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  const std::string rest = name.substr(prefix.size());
  const auto first = rest.find(':');
  const auto second = rest.find(':', first + 1);
  if (first == std::string::npos || second == std::string::npos) return std::nullopt;
  NumberRange range;
  const std::string kind = rest.substr(0, first);
  range.whole = kind == "whole";
  range.min_excluded = kind == "real>";
  const std::string min = rest.substr(first + 1, second - first - 1), max = rest.substr(second + 1);
  range.min = std::strtod(min.c_str(), nullptr);
  range.max = std::strtod(max.c_str(), nullptr);
  if (range.whole) {
    range.whole_min = std::strtoll(min.c_str(), nullptr, 10);
    range.whole_max = std::strtoll(max.c_str(), nullptr, 10);
  }
  return range;
}

}  // namespace pipetune::cli
