#pragma once

// Profiles for benchmarks: deterministic, with costs that vary by layer and grow sub-linearly
// with the micro-batch size the way a real device's do; and the unequal devices they run on.

#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include "sim/hardware.hpp"
#include "sim/profile.hpp"

namespace pipetune::bench {

inline Profile synthetic_profile(int layers, std::int64_t batch_size) {
  Profile p;
  p.model = "synthetic-" + std::to_string(layers);
  p.device = {"cpu", "synthetic", 0};
  p.dtype = "float32";
  p.batch_size = batch_size;
  for (std::int64_t s = 1; s < batch_size; s *= 2) p.micro_batch_sizes.push_back(s);
  p.micro_batch_sizes.push_back(batch_size);
  for (auto s : p.micro_batch_sizes) p.input_bytes.push_back(4096 * s);
  for (int l = 0; l < layers; ++l) {
    LayerProfile layer;
    layer.name = std::to_string(l);
    const double weight = 1.0 + 0.5 * std::sin(l * 0.7) + (l % 7 == 0 ? 1.5 : 0.0);
    layer.param_bytes = static_cast<std::int64_t>(4e6 * weight);
    for (auto s : p.micro_batch_sizes) {
      const double x = static_cast<double>(s);
      layer.forward_ms.push_back(weight * (0.05 + 0.02 * std::pow(x, 0.9)));
      layer.backward_ms.push_back(2.0 * weight * (0.05 + 0.02 * std::pow(x, 0.9)));
      layer.output_bytes.push_back(static_cast<std::int64_t>(16384 * x));
      layer.saved_bytes.push_back(static_cast<std::int64_t>(32768 * weight * x));
      layer.workspace_bytes.push_back(static_cast<std::int64_t>(8192 * x));
    }
    p.layers.push_back(std::move(layer));
  }
  return p;
}

/// Layers unlike each other: lognormal compute costs (a few layers several times the median),
/// random activation, saved and parameter sizes; deterministic for a seed.
inline Profile lognormal_profile(int layers, std::int64_t batch_size, unsigned seed = 15) {
  std::mt19937 rng(seed);
  std::lognormal_distribution<double> cost(0.0, 0.6);
  std::uniform_real_distribution<double> unit(0.2, 2.0);
  Profile p;
  p.model = "lognormal-" + std::to_string(layers);
  p.device = {"cpu", "synthetic", 0};
  p.dtype = "float32";
  p.batch_size = batch_size;
  for (std::int64_t s = 1; s < batch_size; s *= 2) p.micro_batch_sizes.push_back(s);
  p.micro_batch_sizes.push_back(batch_size);
  for (auto s : p.micro_batch_sizes) p.input_bytes.push_back(4096 * s);
  for (int l = 0; l < layers; ++l) {
    LayerProfile layer;
    layer.name = std::to_string(l);
    const double weight = cost(rng);
    const double output = unit(rng), saved = unit(rng);
    layer.param_bytes = static_cast<std::int64_t>(4e6 * unit(rng));
    for (auto s : p.micro_batch_sizes) {
      const double x = static_cast<double>(s);
      layer.forward_ms.push_back(weight * (0.05 + 0.02 * std::pow(x, 0.9)));
      layer.backward_ms.push_back(2.0 * weight * (0.05 + 0.02 * std::pow(x, 0.9)));
      layer.output_bytes.push_back(static_cast<std::int64_t>(16384 * output * x));
      layer.saved_bytes.push_back(static_cast<std::int64_t>(32768 * saved * x));
      layer.workspace_bytes.push_back(static_cast<std::int64_t>(8192 * x));
    }
    p.layers.push_back(std::move(layer));
  }
  return p;
}

/// Devices of unequal speeds, 1.5, 1, 0.75, 1 repeated, so that the best balance is far from
/// equal layer counts (the planner's heterogeneous benchmarks and tests).
inline void set_unequal_speeds(Hardware& hardware) {
  for (std::size_t i = 0; i < hardware.devices.size(); ++i)
    hardware.devices[i].speed = i % 4 == 0 ? 1.5 : i % 4 == 2 ? 0.75 : 1.0;
}

/// The links the planner's benchmarks and tests give the synthetic profile: 10 GB/s, 0.01 ms.
inline void set_synthetic_links(Hardware& hardware) {
  hardware.link.bandwidth_bytes_per_s = 1e10;
  hardware.link.latency_ms = 0.01;
}

/// Caps every device at `share` times its even share of the profile's parameters (2.5: room
/// for parameters, gradients and some activations, so that checkpointing and chunks matter).
inline void cap_at_parameter_share(Hardware& hardware, const Profile& profile, double share) {
  std::int64_t params = 0;
  for (const auto& l : profile.layers) params += l.param_bytes;
  const double each = static_cast<double>(params) / static_cast<double>(hardware.devices.size());
  for (auto& d : hardware.devices) d.memory_bytes = static_cast<std::int64_t>(share * each);
}

}  // namespace pipetune::bench
