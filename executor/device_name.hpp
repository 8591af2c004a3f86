#pragma once

// The one reading of a device string ("cpu", "cpu:<n>", "cuda", "cuda:<n>"), shared by the
// executor's placement and the profiler so they accept and refuse the same names. No LibTorch.

#include <optional>
#include <string>
#include <string_view>

namespace pipetune::exec {

enum class DeviceKind { Cpu, Cuda };

/// "cpu" or "cuda".
std::string_view to_string(DeviceKind kind);

struct DeviceName {
  DeviceKind kind = DeviceKind::Cpu;
  int index = 0;           ///< 0 when the string names no index
  bool has_index = false;  ///< "cuda:0" rather than "cuda"
};

/// Accepts "cpu", "cuda", "cpu:<n>" and "cuda:<n>" (n a decimal integer that fits in an int);
/// nullopt for anything else.
std::optional<DeviceName> try_parse_device_name(std::string_view text);
/// try_parse_device_name, or InputError "device \"<text>\": expected cpu:<n> or cuda:<n>".
DeviceName parse_device_name(std::string_view text);

}  // namespace pipetune::exec
