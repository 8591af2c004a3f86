#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pipetune {

/// "512 B", "12.0 KiB", "1.50 GiB": binary units, three significant digits.
std::string format_bytes(std::int64_t bytes);

/// Parses "80GiB", "512MiB", "1.5e9", "16GB" into bytes; -1 when it is not a size.
std::int64_t parse_bytes(const std::string& text);

/// "25 GB/s", "300 MB/s", "5e+05 B/s", "ideal" (infinity): decimal units, three significant
/// digits. The one way the CLI and the GUI write a link's bandwidth.
std::string format_bandwidth(double bytes_per_s);

/// Parses what format_bandwidth writes and what users type: "25 GB/s", "25GB", "1e8", "ideal"
/// or "inf" (infinity); spaces and case do not matter. NaN when it is not a positive bandwidth.
double parse_bandwidth(const std::string& text);

/// "[3,3,2]": layers per stage.
std::string format_balance(const std::vector<int>& balance);

/// Parses "3,3,2", "[3, 3, 2]" or "3 3 2"; empty when it is not a list of positive counts.
std::vector<int> parse_balance(const std::string& text);

}  // namespace pipetune
