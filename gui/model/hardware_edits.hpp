#pragma once

// The hardware the user edits in the app: the loaded hardware (or the profile's device) with a
// device count, a memory per device and a link bandwidth set from the controls.

#include <cstdint>
#include <optional>

#include "sim/hardware.hpp"

namespace pipetune::gui {

struct HardwareEdits {
  int device_count = 0;                         ///< 0: as loaded
  std::optional<std::int64_t> memory_bytes;     ///< every device; 0: unknown (no limit)
  std::optional<double> bandwidth_bytes_per_s;  ///< the default link and every override
  bool operator==(const HardwareEdits&) const = default;
};

/// `base` with the edits applied. More devices than `base` has are copies of its last device,
/// named on from it ("gpu1" → "gpu2", "cpu:1" → "cpu:2"); fewer drops the last ones and the
/// link overrides that name them.
Hardware apply_edits(const Hardware& base, const HardwareEdits& edits);

}  // namespace pipetune::gui
