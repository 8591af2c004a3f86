#include "sim/json_reader.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "sim/error.hpp"
#include "sim/limits.hpp"

namespace pipetune::json_reader {

namespace {

// nlohmann reports a byte offset; people count lines and columns.
std::pair<std::size_t, std::size_t> line_and_column(std::string_view text, std::size_t byte) {
  std::size_t line = 1, column = 1;
  for (std::size_t i = 0; i < byte && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

// "[json.exception.parse_error.101] parse error at line 1, column 2: syntax error while parsing
// value - invalid literal; last read: 'x'" -> "syntax error while parsing value - invalid literal;
// last read: 'x'".
std::string strip_nlohmann_prefix(std::string message) {
  if (auto colon = message.find(": ");
      colon != std::string::npos && message.starts_with("[json.")) {
    message = message.substr(colon + 2);
  }
  return message;
}

}  // namespace

nlohmann::json parse_document(std::string_view text, const std::string& source) {
  // No pipetune document nests deeper than a few levels. A bound keeps the recursive writer
  // (dump, which re-indents every level) from exhausting the stack or memory on a free-form
  // field such as a profile's meta.
  constexpr int kMaxDepth = 64;
  const auto limit_depth = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
    // `depth` counts the containers around the one starting.
    const bool opens = event == nlohmann::json::parse_event_t::object_start ||
                       event == nlohmann::json::parse_event_t::array_start;
    if (opens && depth >= kMaxDepth) {
      throw InputError(
          fmt::format("{}: invalid JSON: nested deeper than {} levels", source, kMaxDepth));
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text, limit_depth);
  } catch (const nlohmann::json::out_of_range& e) {
    // A number beyond double's range ("1e400") is reported as out_of_range, not parse_error:
    // "[json.exception.out_of_range.406] number overflow parsing '1e400'".
    const std::string_view what = e.what();
    const auto end = what.find("] ");
    throw InputError(fmt::format("{}: invalid JSON: {}", source,
                                 end == std::string_view::npos ? what : what.substr(end + 2)));
  } catch (const nlohmann::json::parse_error& e) {
    auto [line, column] = line_and_column(text, e.byte == 0 ? 0 : e.byte - 1);
    if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
      throw InputError(source + ": empty file, expected a JSON document");
    }
    throw InputError(fmt::format("{}: invalid JSON at line {}, column {}: {}", source, line, column,
                                 strip_nlohmann_prefix(e.what())));
  }
}

std::string describe(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::boolean:
      return value.get<bool>() ? "true" : "false";
    case nlohmann::json::value_t::string: {
      auto s = value.get<std::string>();
      if (s.size() > 40) s = s.substr(0, 37) + "...";
      return "\"" + s + "\"";
    }
    case nlohmann::json::value_t::array:
      return fmt::format("an array of {} element{}", value.size(), value.size() == 1 ? "" : "s");
    case nlohmann::json::value_t::object:
      return "an object";
    default:
      return value.dump();
  }
}

Node::Node(const nlohmann::json& value, const std::string& source, std::string path)
    : value_(&value), source_(&source), path_(std::move(path)) {}

void Node::fail(std::string_view expected) const {
  fail_message(fmt::format("expected {}, got {}", expected, describe(*value_)));
}

void Node::fail_message(std::string_view message) const {
  if (path_.empty()) throw InputError(fmt::format("{}: {}", *source_, message));
  throw InputError(fmt::format("{}: {}: {}", *source_, path_, message));
}

Node Node::field(std::string_view key) const {
  if (!value_->is_object()) fail("an object");
  auto it = value_->find(key);
  if (it == value_->end()) fail_message(fmt::format("missing field \"{}\"", key));
  return Node(*it, *source_, path_.empty() ? std::string(key) : path_ + "." + std::string(key));
}

std::optional<Node> Node::optional_field(std::string_view key) const {
  if (!value_->is_object()) fail("an object");
  auto it = value_->find(key);
  if (it == value_->end()) return std::nullopt;
  return Node(*it, *source_, path_.empty() ? std::string(key) : path_ + "." + std::string(key));
}

void Node::allow_only(std::initializer_list<std::string_view> keys) const {
  if (!value_->is_object()) fail("an object");
  for (const auto& [key, member] : value_->items()) {
    bool known = false;
    for (auto k : keys) known = known || k == key;
    if (!known) {
      std::string list;
      for (auto k : keys) list += (list.empty() ? "" : ", ") + std::string(k);
      const std::string where = path_.empty() ? key : path_ + "." + key;
      throw InputError(
          fmt::format("{}: {}: unknown field (expected one of: {})", *source_, where, list));
    }
  }
}

std::vector<Node> Node::elements() const {
  if (!value_->is_array()) fail("an array");
  std::vector<Node> out;
  out.reserve(value_->size());
  for (std::size_t i = 0; i < value_->size(); ++i) {
    out.emplace_back((*value_)[i], *source_, fmt::format("{}[{}]", path_, i));
  }
  return out;
}

std::vector<Node> Node::elements(std::size_t expected_size, std::string_view what) const {
  if (!value_->is_array() || value_->size() != expected_size) {
    fail(fmt::format("an array of {} {}", expected_size, what));
  }
  return elements();
}

std::string Node::string() const {
  if (!value_->is_string()) fail("a string");
  return value_->get<std::string>();
}

std::string Node::non_empty_string() const {
  if (!value_->is_string() || value_->get_ref<const std::string&>().empty()) {
    fail("a non-empty string");
  }
  return value_->get<std::string>();
}

bool Node::boolean() const {
  if (!value_->is_boolean()) fail("true or false");
  return value_->get<bool>();
}

double Node::number() const {
  if (!value_->is_number()) fail("a number");
  return value_->get<double>();
}

double Node::non_negative_number() const {
  if (!value_->is_number() || value_->get<double>() < 0) fail("a non-negative number");
  return value_->get<double>();
}

double Node::positive_number() const {
  if (!value_->is_number() || !(value_->get<double>() > 0)) fail("a positive number");
  return value_->get<double>();
}

std::int64_t Node::integer_or_fail(std::string_view expected) const {
  if (value_->is_number_integer()) {
    if (value_->is_number_unsigned() &&
        value_->get<std::uint64_t>() >
            static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail(expected);
    }
    return value_->get<std::int64_t>();
  }
  // 4096.0 is an integer too; writers in other languages print whole floats that way.
  if (value_->is_number_float()) {
    const double d = value_->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e18) {
      return static_cast<std::int64_t>(d);
    }
  }
  fail(expected);
}

std::int64_t Node::integer() const {
  return integer_or_fail("an integer");
}

std::int64_t Node::non_negative_integer() const {
  const auto v = integer_or_fail("a non-negative integer");
  if (v < 0) fail("a non-negative integer");
  return v;
}

std::int64_t Node::positive_integer() const {
  const auto v = integer_or_fail("a positive integer");
  if (v < 1) fail("a positive integer");
  return v;
}

double Node::milliseconds() const {
  return number_in(0.0, limits::kMaxMs, "a non-negative number of milliseconds up to 1e9");
}

std::int64_t Node::bytes() const {
  const auto v = integer_or_fail("a non-negative integer (bytes)");
  if (v < 0 || v > limits::kMaxBytes) fail("a byte count from 0 to 70368744177664 (64 TiB)");
  return v;
}

double Node::number_in(double low, double high, std::string_view expected) const {
  // Written so that NaN fails too (nlohmann never yields one, but a caller's value might).
  if (!value_->is_number() || !(value_->get<double>() >= low && value_->get<double>() <= high)) {
    fail(expected);
  }
  return value_->get<double>();
}

void check_format(const Node& object, std::string_view expected) {
  const Node tag = object.field("format");
  if (!tag.value().is_string() || tag.value().get<std::string>() != expected) {
    tag.fail(std::string("\"") + std::string(expected) + "\"");
  }
}

}  // namespace pipetune::json_reader
