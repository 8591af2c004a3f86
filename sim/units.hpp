#pragma once

#include <cstdint>
#include <string>

namespace pipetune {

/// "512 B", "12.0 KiB", "1.50 GiB": binary units, three significant digits.
std::string format_bytes(std::int64_t bytes);

/// Parses "80GiB", "512MiB", "1.5e9", "16GB" into bytes; -1 when it is not a size.
std::int64_t parse_bytes(const std::string& text);

}  // namespace pipetune
