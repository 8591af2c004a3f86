#pragma once

// The cache a CPU core keeps to itself, read from Linux's sysfs: the profiler empties that much
// (times its threads) before each cold timing (LayerProfile::forward_cold_ms). Plain C++ behind a
// path, so tests read a fabricated tree.

#include <cstdint>
#include <filesystem>

namespace pipetune::profiler {

/// The largest cache of `cpu` (a /sys/devices/system/cpu/cpuN folder) that no other core shares
/// (its shared_cpu_list names only cpu's SMT siblings), in bytes; 0 when the folder says nothing
/// readable. A shared last level is left out: other tenants' and devices' work keeps it in flux.
std::int64_t private_cache_bytes(const std::filesystem::path& cpu);

/// private_cache_bytes of cpu0 on this machine.
std::int64_t private_cache_bytes();

}  // namespace pipetune::profiler
