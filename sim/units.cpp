#include "sim/units.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "sim/limits.hpp"

namespace pipetune {

std::string format_bytes(std::int64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::fabs(value) >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return fmt::format("{} B", bytes);
  if (std::fabs(value) >= 100) return fmt::format("{:.0f} {}", value, kUnits[unit]);
  if (std::fabs(value) >= 10) return fmt::format("{:.1f} {}", value, kUnits[unit]);
  return fmt::format("{:.2f} {}", value, kUnits[unit]);
}

std::int64_t parse_bytes(const std::string& text) {
  if (text.empty()) return -1;
  char* end = nullptr;
  const double number = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !std::isfinite(number) || number < 0) return -1;
  std::string unit(end);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double scale = 1;
  if (unit.empty() || unit == "b") {
    scale = 1;
  } else if (unit == "kib" || unit == "k") {
    scale = 1024.0;
  } else if (unit == "mib" || unit == "m") {
    scale = 1024.0 * 1024;
  } else if (unit == "gib" || unit == "g") {
    scale = 1024.0 * 1024 * 1024;
  } else if (unit == "tib" || unit == "t") {
    scale = 1024.0 * 1024 * 1024 * 1024;
  } else if (unit == "kb") {
    scale = 1e3;
  } else if (unit == "mb") {
    scale = 1e6;
  } else if (unit == "gb") {
    scale = 1e9;
  } else if (unit == "tb") {
    scale = 1e12;
  } else {
    return -1;
  }
  // llround's result is unspecified beyond int64: "1e30" must not come back as a negative size.
  const double bytes = number * scale;
  if (!(bytes < 0x1p63)) return -1;
  return std::llround(bytes);
}

namespace {

std::string lower_without_spaces(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) {
      out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    }
  }
  return out;
}

}  // namespace

std::string format_bandwidth(double bytes_per_s) {
  if (std::isinf(bytes_per_s)) return "ideal";
  if (bytes_per_s >= 1e9) return fmt::format("{:.3g} GB/s", bytes_per_s / 1e9);
  if (bytes_per_s >= 1e6) return fmt::format("{:.3g} MB/s", bytes_per_s / 1e6);
  return fmt::format("{:.3g} B/s", bytes_per_s);
}

double parse_bandwidth(const std::string& text) {
  std::string cleaned = lower_without_spaces(text);
  if (cleaned == "ideal" || cleaned == "inf") return std::numeric_limits<double>::infinity();
  if (cleaned.size() > 2 && cleaned.ends_with("/s")) cleaned.resize(cleaned.size() - 2);
  const std::int64_t bytes = parse_bytes(cleaned);
  // Slower links turn the largest copies into times beyond any meaning.
  return static_cast<double>(bytes) >= limits::kMinBandwidth
             ? static_cast<double>(bytes)
             : std::numeric_limits<double>::quiet_NaN();
}

std::string format_balance(const std::vector<int>& balance) {
  return fmt::format("[{}]", fmt::join(balance, ","));
}

std::vector<int> parse_balance(const std::string& text) {
  std::vector<int> balance;
  std::string token;
  auto flush = [&]() {
    if (token.empty()) return true;
    char* end = nullptr;
    const long n = std::strtol(token.c_str(), &end, 10);
    const bool ok = *end == '\0' && n >= 1 && n <= std::numeric_limits<int>::max();
    if (ok) balance.push_back(static_cast<int>(n));
    token.clear();
    return ok;
  };
  std::string inner = text;
  std::erase(inner, '[');
  std::erase(inner, ']');
  for (char c : inner) {
    if (c == ',' || std::isspace(static_cast<unsigned char>(c))) {
      if (!flush()) return {};
    } else {
      token.push_back(c);
    }
  }
  if (!flush()) return {};
  return balance;
}

}  // namespace pipetune
