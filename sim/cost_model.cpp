#include "sim/cost_model.hpp"

#include <algorithm>
#include <cmath>

namespace pipetune {

namespace {

template <typename Value>
double interpolate_any(std::span<const std::int64_t> sizes, std::span<const Value> values,
                       double size) {
  if (sizes.empty()) return 0.0;
  if (sizes.size() == 1) {
    return std::max(0.0, static_cast<double>(values[0]) * size / static_cast<double>(sizes[0]));
  }
  // The segment [k, k+1] that holds `size`, or the first/last segment outside the range.
  const auto upper = std::upper_bound(sizes.begin(), sizes.end(), size,
                                      [](double s, std::int64_t x) { return s < x; });
  std::size_t k = static_cast<std::size_t>(upper - sizes.begin());
  k = std::clamp<std::size_t>(k, 1, sizes.size() - 1) - 1;
  const double x0 = static_cast<double>(sizes[k]), x1 = static_cast<double>(sizes[k + 1]);
  const double y0 = static_cast<double>(values[k]), y1 = static_cast<double>(values[k + 1]);
  const double y = y0 + (y1 - y0) * (size - x0) / (x1 - x0);
  return std::max(0.0, y);
}

}  // namespace

double interpolate(std::span<const std::int64_t> sizes, std::span<const double> values,
                   double size) {
  return interpolate_any(sizes, values, size);
}

std::int64_t interpolate_bytes(std::span<const std::int64_t> sizes,
                               std::span<const std::int64_t> values, double size) {
  return std::llround(interpolate_any(sizes, values, size));
}

CostModel::CostModel(const Profile& profile) : profile_(profile) {
  param_prefix_.assign(profile.layers.size() + 1, 0);
  for (std::size_t l = 0; l < profile.layers.size(); ++l) {
    param_prefix_[l + 1] = param_prefix_[l] + profile.layers[l].param_bytes;
  }
}

const SizeCosts& CostModel::at(std::int64_t size) const {
  const auto index = static_cast<std::size_t>(size);
  if (index >= cache_.size()) cache_.resize(index + 1);
  if (cache_[index]) return *cache_[index];

  auto costs = std::make_unique<SizeCosts>();
  const auto& sizes = profile_.micro_batch_sizes;
  const double x = static_cast<double>(size);
  const std::size_t layers = profile_.layers.size();
  costs->size = size;
  costs->input_bytes = interpolate_bytes(sizes, profile_.input_bytes, x);
  costs->forward_ms.resize(layers);
  costs->backward_ms.resize(layers);
  costs->forward_nograd_ms.resize(layers);
  costs->forward_nograd_prefix.assign(layers + 1, 0.0);
  costs->output_bytes.resize(layers);
  costs->saved_bytes.resize(layers);
  costs->workspace_bytes.resize(layers);
  costs->forward_prefix.assign(layers + 1, 0.0);
  costs->backward_prefix.assign(layers + 1, 0.0);
  costs->backward_input_ms.resize(layers);
  costs->backward_weight_ms.resize(layers);
  costs->backward_input_prefix.assign(layers + 1, 0.0);
  costs->backward_weight_prefix.assign(layers + 1, 0.0);
  costs->kept_prefix.assign(layers + 1, 0);
  for (std::size_t l = 0; l < layers; ++l) {
    const auto& layer = profile_.layers[l];
    costs->forward_ms[l] = interpolate(sizes, layer.forward_ms, x);
    costs->backward_ms[l] = interpolate(sizes, layer.backward_ms, x);
    costs->forward_nograd_ms[l] =
        layer.forward_nograd_ms.empty() ? costs->forward_ms[l] : interpolate(sizes, layer.forward_nograd_ms, x);
    if (!layer.backward_input_ms.empty()) {
      costs->backward_input_ms[l] = interpolate(sizes, layer.backward_input_ms, x);
      costs->backward_weight_ms[l] = interpolate(sizes, layer.backward_weight_ms, x);
    } else {
      // Unmeasured: a layer's weight gradient costs about what its input gradient does (two
      // matrix products of one size); a layer without parameters has no W at all.
      const double weight_share = layer.param_bytes > 0 ? 0.5 : 0.0;
      costs->backward_weight_ms[l] = weight_share * costs->backward_ms[l];
      costs->backward_input_ms[l] = costs->backward_ms[l] - costs->backward_weight_ms[l];
    }
    costs->output_bytes[l] = interpolate_bytes(sizes, layer.output_bytes, x);
    costs->saved_bytes[l] = interpolate_bytes(sizes, layer.saved_bytes, x);
    costs->workspace_bytes[l] = interpolate_bytes(sizes, layer.workspace_bytes, x);
    if (!layer.backward_peak_bytes.empty()) {
      costs->backward_peak_bytes.resize(layers);
      costs->backward_accumulate_peak_bytes.resize(layers);
      costs->backward_peak_bytes[l] = interpolate_bytes(sizes, layer.backward_peak_bytes, x);
      costs->backward_accumulate_peak_bytes[l] = interpolate_bytes(sizes, layer.backward_accumulate_peak_bytes, x);
    }
    costs->forward_prefix[l + 1] = costs->forward_prefix[l] + costs->forward_ms[l];
    costs->backward_prefix[l + 1] = costs->backward_prefix[l] + costs->backward_ms[l];
    costs->forward_nograd_prefix[l + 1] = costs->forward_nograd_prefix[l] + costs->forward_nograd_ms[l];
    costs->backward_input_prefix[l + 1] = costs->backward_input_prefix[l] + costs->backward_input_ms[l];
    costs->backward_weight_prefix[l + 1] =
        costs->backward_weight_prefix[l] + costs->backward_weight_ms[l];
    costs->kept_prefix[l + 1] =
        costs->kept_prefix[l] + costs->saved_bytes[l] + costs->output_bytes[l];
  }
  cache_[index] = std::move(costs);
  return *cache_[index];
}

}  // namespace pipetune
