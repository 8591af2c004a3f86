#pragma once

// "name:key=value,key=value" model specs, with the errors a user needs when one is wrong.

#include <cstdint>
#include <map>
#include <set>
#include <string>

namespace pipetune::models {

class Spec {
 public:
  /// Parses `text`; `allowed` lists the keys of the named model (others are rejected).
  Spec(std::string name, const std::map<std::string, std::string>& values);
  static Spec parse(const std::string& text);

  const std::string& name() const { return name_; }
  void allow_only(const std::set<std::string>& keys) const;
  std::int64_t positive(const std::string& key, std::int64_t fallback);
  double fraction(const std::string& key, double fallback);  ///< in [0, 1)
  std::string text(const std::string& key, const std::string& fallback);
  bool has(const std::string& key) const { return values_.count(key) > 0; }
  /// The spec with every key actually used and its value, in the order used.
  std::string canonical() const;

 private:
  [[noreturn]] void fail(const std::string& key, const std::string& expected) const;
  std::string name_;
  std::map<std::string, std::string> values_;
  std::string used_;
};

}  // namespace pipetune::models
