#pragma once

// The ceilings every loader and flag enforces (docs/formats.md, "Limits every loader enforces").
// They are far above anything real and low enough that the simulator's int64 byte counters and
// int task ids cannot overflow for anything accepted: memory on one device is at most
//   parameters × (1 + optimizer factor) + micro-batches × (a few profile totals)
//   ≤ 2^46 × 1001 + 4096 × 8 × 2^46 < 2^62,
// since every byte count a profile yields at any micro-batch size is within the profile total
// (checked by the loader at every size from 1 to the batch), and task ids are at most
// stages × micro-batches × 5 ≤ 1024 × 4096 × 5 < 2^31.

#include <cstdint>

namespace pipetune::limits {

/// Any byte count (a profile's, a device's memory, a trace's copy, --memory): 64 TiB.
inline constexpr std::int64_t kMaxBytes = std::int64_t{1} << 46;
/// A profile's byte counts summed over its layers (parameters, outputs, saved, workspace,
/// backward peaks) plus the input, at any micro-batch size from 1 to the batch: also 64 TiB.
inline constexpr std::int64_t kMaxProfileBytes = kMaxBytes;
/// Any duration in milliseconds (layer times, latencies, overheads, a trace's timestamps):
/// 10^9 ms, about 11.6 days.
inline constexpr double kMaxMs = 1e9;
/// Link bandwidth in bytes/s, when finite: at least 1 B/s (a slower one makes copies of the
/// largest byte counts last beyond any meaningful time).
inline constexpr double kMinBandwidth = 1.0;
/// A device's speed and a calibration's compute scale: 10^-6 to 10^6.
inline constexpr double kMinSpeed = 1e-6;
inline constexpr double kMaxSpeed = 1e6;
/// Devices in a hardware file or --devices, and stages in a plan.
inline constexpr int kMaxDevices = 1024;
inline constexpr int kMaxStages = 1024;
/// Micro-batches requested (chunks).
inline constexpr int kMaxChunks = 4096;
/// A profile's batch size (and so any micro-batch size).
inline constexpr std::int64_t kMaxBatch = 1'000'000'000;

}  // namespace pipetune::limits
