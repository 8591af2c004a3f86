#include "sim/profile_pool.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "sim/compare.hpp"
#include "sim/error.hpp"

namespace pipetune {

namespace {

using TimeField = std::vector<double> LayerProfile::*;

// Every time a profile measures, besides the spreads (pooled apart, below).
constexpr TimeField kTimeFields[] = {&LayerProfile::forward_ms,
                                     &LayerProfile::backward_ms,
                                     &LayerProfile::forward_nograd_ms,
                                     &LayerProfile::backward_input_ms,
                                     &LayerProfile::backward_weight_ms,
                                     &LayerProfile::forward_corun_ms,
                                     &LayerProfile::backward_corun_ms,
                                     &LayerProfile::forward_cold_ms,
                                     &LayerProfile::backward_cold_ms,
                                     &LayerProfile::forward_step_start_ms,
                                     &LayerProfile::forward_launch_ms,
                                     &LayerProfile::backward_launch_ms,
                                     &LayerProfile::forward_nograd_launch_ms};

struct SpreadOf {
  TimeField time, spread;
};
constexpr SpreadOf kSpreads[] = {{&LayerProfile::forward_ms, &LayerProfile::forward_ms_spread},
                                 {&LayerProfile::backward_ms, &LayerProfile::backward_ms_spread}};

void require_same(bool same, const std::string& source, std::string_view field,
                  const std::string& value, const std::string& expected) {
  if (!same) {
    throw InputError(
        fmt::format("{}: \"{}\" is {}, but the first profile's is {}: profiles of "
                    "one model on one device pool",
                    source, field, value, expected));
  }
}

// Where each of `other`'s sizes sits among the first profile's.
std::vector<std::size_t> size_slots(const Profile& first, const Profile& other,
                                    const std::string& source) {
  std::vector<std::size_t> slots;
  for (std::int64_t size : other.micro_batch_sizes) {
    const auto it = std::find(first.micro_batch_sizes.begin(), first.micro_batch_sizes.end(), size);
    if (it == first.micro_batch_sizes.end()) {
      throw InputError(
          fmt::format("{}: \"micro_batch_sizes\" has {}, which the first profile did not measure",
                      source, size));
    }
    slots.push_back(static_cast<std::size_t>(it - first.micro_batch_sizes.begin()));
  }
  return slots;
}

void check_poolable(const Profile& first, const Profile& other, const std::string& source) {
  require_same(other.model == first.model, source, "model", other.model, first.model);
  require_same(other.dtype == first.dtype, source, "dtype", other.dtype, first.dtype);
  require_same(other.device.type == first.device.type, source, "device.type", other.device.type,
               first.device.type);
  require_same(other.batch_size == first.batch_size, source, "batch_size",
               std::to_string(other.batch_size), std::to_string(first.batch_size));
  require_same(other.layers.size() == first.layers.size(), source, "layers",
               fmt::format("{} long", other.layers.size()),
               fmt::format("{} long", first.layers.size()));
  for (std::size_t l = 0; l < first.layers.size(); ++l) {
    require_same(other.layers[l].name == first.layers[l].name, source,
                 fmt::format("layers[{}].name", l), other.layers[l].name, first.layers[l].name);
  }
}

// The values profiles measured for one layer's field at the first profile's size `slot`.
std::vector<double> values_at(const std::vector<Profile>& profiles,
                              const std::vector<std::vector<std::size_t>>& slots, std::size_t layer,
                              TimeField field, std::size_t slot) {
  std::vector<double> values;
  for (std::size_t p = 0; p < profiles.size(); ++p) {
    const std::vector<double>& v = profiles[p].layers[layer].*field;
    const auto it = std::find(slots[p].begin(), slots[p].end(), slot);
    if (it == slots[p].end()) continue;
    const auto at = static_cast<std::size_t>(it - slots[p].begin());
    if (at < v.size()) values.push_back(v[at]);
  }
  return values;
}

double median_abs_deviation(const std::vector<double>& values, double centre) {
  std::vector<double> deviations;
  for (double v : values) deviations.push_back(std::abs(v - centre));
  return median(std::move(deviations));
}

}  // namespace

Profile pool_profiles(const std::vector<Profile>& profiles,
                      const std::vector<std::string>& sources) {
  if (profiles.empty()) throw InputError("no profiles to pool");
  const Profile& first = profiles.front();
  std::vector<std::vector<std::size_t>> slots;
  for (std::size_t p = 0; p < profiles.size(); ++p) {
    const std::string source = p < sources.size() ? sources[p] : fmt::format("profile {}", p + 1);
    if (p > 0) check_poolable(first, profiles[p], source);
    slots.push_back(size_slots(first, profiles[p], source));
  }
  Profile pooled = first;
  for (std::size_t l = 0; l < pooled.layers.size(); ++l) {
    LayerProfile& layer = pooled.layers[l];
    for (TimeField field : kTimeFields) {
      std::vector<double>& out = layer.*field;
      for (std::size_t s = 0; s < out.size(); ++s)
        out[s] = median(values_at(profiles, slots, l, field, s));
    }
    for (const SpreadOf& f : kSpreads) {
      std::vector<double>& out = layer.*f.spread;
      for (std::size_t s = 0; s < out.size(); ++s) {
        const double within = median(values_at(profiles, slots, l, f.spread, s));
        const double between =
            median_abs_deviation(values_at(profiles, slots, l, f.time, s), (layer.*f.time)[s]);
        out[s] = std::hypot(within, between);
      }
    }
  }
  std::vector<double> calls;
  for (const Profile& p : profiles) calls.push_back(p.device.backward_call_ms);
  pooled.device.backward_call_ms = median(std::move(calls));
  return pooled;
}

}  // namespace pipetune
