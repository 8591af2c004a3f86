#pragma once

// Profiles of one model taken at different times, pooled into one.
//
// A machine's pace drifts (a shared VM's by a fifth within seconds), and a profile taken in a
// fast minute predicts every plan short however right the model is. Profiles taken between the
// rounds of the runs they predict see the same drift the runs do; pooled, each layer's time is
// its median over them, and its spread adds how far the profiles' medians stray from one another
// to how far one profile's repeats strayed, since a step runs at whatever pace the machine has
// at the time:
//
//   time    median over the profiles of the layer's median at that size
//   spread  sqrt(within² + between²): within, the median of the profiles' own spreads; between,
//           the median absolute deviation of their medians from the pooled time
//
// The first profile gives what the others do not measure (sizes they skip, bytes, names):
// byte counts come from the allocator and do not drift.

#include <string>
#include <vector>

#include "sim/profile.hpp"

namespace pipetune {

/// Pools `profiles` (at least one; `sources` names each for errors). Every profile must be of the
/// first's model, dtype, batch, device type and layers, and measure a subset of its sizes; a time
/// field is pooled over the profiles that measured it at that size. Throws InputError naming the
/// profile and the field that differ.
Profile pool_profiles(const std::vector<Profile>& profiles,
                      const std::vector<std::string>& sources);

}  // namespace pipetune
