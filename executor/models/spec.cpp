#include "executor/models/spec.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>

#include "sim/error.hpp"

namespace pipetune::models {

Spec::Spec(std::string name, const std::map<std::string, std::string>& values)
    : name_(std::move(name)), values_(values) {}

Spec Spec::parse(const std::string& text) {
  const auto colon = text.find(':');
  std::string name = text.substr(0, colon);
  std::map<std::string, std::string> values;
  if (colon != std::string::npos) {
    std::string rest = text.substr(colon + 1);
    std::size_t at = 0;
    while (at <= rest.size() && !rest.empty()) {
      const auto comma = rest.find(',', at);
      const std::string item =
          rest.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
      const auto equals = item.find('=');
      if (equals == std::string::npos || equals == 0) {
        throw InputError(Input::Model,
                         fmt::format("\"{}\": expected key=value, got \"{}\"", text, item));
      }
      values[item.substr(0, equals)] = item.substr(equals + 1);
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
  }
  return Spec(std::move(name), values);
}

void Spec::fail(const std::string& key, const std::string& expected) const {
  throw InputError(Input::Model, fmt::format("{}: {}: expected {}, got \"{}\"", name_, key,
                                             expected, values_.count(key) ? values_.at(key) : ""));
}

void Spec::allow_only(const std::set<std::string>& keys) const {
  for (const auto& [key, value] : values_) {
    if (!keys.count(key)) {
      std::string list;
      for (const auto& k : keys) list += (list.empty() ? "" : ", ") + k;
      throw InputError(Input::Model, fmt::format("{}: unknown key \"{}\" (expected one of: {})",
                                                 name_, key, list));
    }
  }
}

std::int64_t Spec::positive(const std::string& key, std::int64_t fallback) {
  std::int64_t value = fallback;
  if (auto it = values_.find(key); it != values_.end()) {
    char* end = nullptr;
    errno = 0;
    const long long parsed = std::strtoll(it->second.c_str(), &end, 10);
    if (it->second.empty() || *end != '\0' || errno != 0 || parsed < 1)
      fail(key, "a positive integer");
    value = parsed;
  }
  used_ += fmt::format("{}{}={}", used_.empty() ? "" : ",", key, value);
  return value;
}

double Spec::fraction(const std::string& key, double fallback) {
  double value = fallback;
  if (auto it = values_.find(key); it != values_.end()) {
    char* end = nullptr;
    value = std::strtod(it->second.c_str(), &end);
    if (it->second.empty() || *end != '\0' || !(value >= 0.0 && value < 1.0))
      fail(key, "a number in [0, 1)");
  }
  used_ += fmt::format("{}{}={}", used_.empty() ? "" : ",", key, value);
  return value;
}

std::string Spec::text(const std::string& key, const std::string& fallback) {
  std::string value = fallback;
  if (auto it = values_.find(key); it != values_.end()) value = it->second;
  used_ += fmt::format("{}{}={}", used_.empty() ? "" : ",", key, value);
  return value;
}

std::string Spec::canonical() const {
  return used_.empty() ? name_ : name_ + ":" + used_;
}

}  // namespace pipetune::models
