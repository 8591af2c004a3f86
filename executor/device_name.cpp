#include "executor/device_name.hpp"

#include <fmt/format.h>

#include <charconv>

#include "sim/error.hpp"

namespace pipetune::exec {

std::string_view to_string(DeviceKind kind) {
  return kind == DeviceKind::Cuda ? "cuda" : "cpu";
}

std::optional<DeviceName> try_parse_device_name(std::string_view text) {
  const auto colon = text.find(':');
  const std::string_view type = text.substr(0, colon);
  DeviceName name;
  if (type == "cpu") {
    name.kind = DeviceKind::Cpu;
  } else if (type == "cuda") {
    name.kind = DeviceKind::Cuda;
  } else {
    return std::nullopt;
  }
  if (colon == std::string_view::npos) return name;
  const std::string_view digits = text.substr(colon + 1);
  // from_chars alone would take "-1" and stop quietly before "1x".
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string_view::npos) {
    return std::nullopt;
  }
  const auto [end, error] =
      std::from_chars(digits.data(), digits.data() + digits.size(), name.index);
  if (error != std::errc{} || end != digits.data() + digits.size()) return std::nullopt;
  name.has_index = true;
  return name;
}

DeviceName parse_device_name(std::string_view text) {
  if (auto name = try_parse_device_name(text)) return *name;
  throw InputError(fmt::format("device \"{}\": expected cpu:<n> or cuda:<n>", text));
}

}  // namespace pipetune::exec
