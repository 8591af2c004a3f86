#pragma once

// How the app writes times, errors and sizes: short, with units, the way a reader scans them.

#include <QString>
#include <cstdint>
#include <vector>

namespace pipetune {
struct Plan;
}

namespace pipetune::gui {

/// "850 µs", "12.3 ms", "1.25 s": three significant digits in the unit that fits.
QString format_duration(double ms);
/// A ruler label for a tick at `ms` when ticks are `step_ms` apart: enough decimals to tell
/// neighbouring ticks apart, no more ("0", "2.5 ms", "1.2 s").
QString format_tick(double ms, double step_ms);
/// Signed percentage of a fraction: "+12.5 %", "−3.0 %"; "—" when not finite.
QString format_error(double fraction);
/// Binary units (sim's format_bytes); "—" for 0 when `zero_is_unknown`.
QString format_size(std::int64_t bytes, bool zero_is_unknown = false);
/// As the CLI writes it (sim/units.hpp): "25 GB/s", "ideal".
QString format_bandwidth(double bytes_per_s);
/// "[3,3,2]" (sim/units.hpp)
QString format_balance(const std::vector<int>& balance);
/// A plan's schedule: "gpipe", or with its stages per device when not 1: "interleaved-1f1b,
/// 2/device".
QString format_schedule(const Plan& plan);
/// Parses "3,3,2" (spaces and brackets allowed); empty when it is not a list of positive counts.
std::vector<int> parse_balance(const QString& text);
/// "16 GiB", "512MiB", "8e9", "unlimited" (0); -1 when it is not a size, or above 64 TiB.
std::int64_t parse_size(const QString& text);
/// "25 GB/s", "1e8", "ideal" (infinity); NaN when it is not a bandwidth of at least 1 B/s.
double parse_bandwidth(const QString& text);

}  // namespace pipetune::gui
