#pragma once

// Strict, path-aware reading of JSON documents, shared by every loader in sim/.
// Included only by .cpp files: nlohmann/json is heavy.

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pipetune::json_reader {

/// Parses `text`; a syntax error becomes InputError "<source>: invalid JSON at line L, column C:
/// …".
nlohmann::json parse_document(std::string_view text, const std::string& source);

/// A value inside a document together with the file it came from and its JSON path
/// (`layers[3].forward_ms[2]`), so every complaint can say where it points.
class Node {
 public:
  Node(const nlohmann::json& value, const std::string& source, std::string path = {});

  const nlohmann::json& value() const { return *value_; }
  const std::string& path() const { return path_; }
  const std::string& source() const { return *source_; }

  /// "<source>: <path>: expected <expected>, got <what is there>".
  [[noreturn]] void fail(std::string_view expected) const;
  /// "<source>: <path>: <message>".
  [[noreturn]] void fail_message(std::string_view message) const;

  // Objects.
  Node field(std::string_view key) const;  ///< required member
  std::optional<Node> optional_field(std::string_view key) const;
  /// Rejects members outside `keys`: in a hand-written file an unknown key is a typo.
  void allow_only(std::initializer_list<std::string_view> keys) const;

  // Arrays.
  std::vector<Node> elements() const;
  std::vector<Node> elements(std::size_t expected_size, std::string_view what) const;

  // Scalars.
  std::string string() const;
  std::string non_empty_string() const;
  bool boolean() const;
  double number() const;
  double non_negative_number() const;
  double positive_number() const;
  std::int64_t integer() const;
  std::int64_t non_negative_integer() const;
  std::int64_t positive_integer() const;
  /// A duration: a non-negative number of milliseconds up to limits::kMaxMs.
  double milliseconds() const;
  /// A byte count: a non-negative integer up to limits::kMaxBytes.
  std::int64_t bytes() const;
  /// A number in [low, high] (NaN and infinities fail); `expected` says so in the message.
  double number_in(double low, double high, std::string_view expected) const;

 private:
  std::int64_t integer_or_fail(std::string_view expected) const;

  const nlohmann::json* value_;
  const std::string* source_;
  std::string path_;
};

/// The "format" member of `object`: exactly `expected` ("pipetune.profile/1" and the like),
/// which tells one kind of file from another.
void check_format(const Node& object, std::string_view expected);

/// A short description of a value for error messages: `-1.5`, `"abc"`, `an array of 3 elements`.
std::string describe(const nlohmann::json& value);

}  // namespace pipetune::json_reader
