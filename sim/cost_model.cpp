#include "sim/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

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

// When a layer's backward is done with its peak, at a size the profile may not have measured.
// A share and a drop are one record, not two curves: where they jump between sizes (a GPT
// block's release moves from 96 % to 57 % of its backward between 2 and 4 samples), a share and
// a drop interpolated apart could describe a release that happens at neither size. So between
// two measured sizes the later share and the smaller drop (true of both), beyond them the
// nearest size's, a drop never above what linear scaling gives.
std::pair<double, std::int64_t> release_at(std::span<const std::int64_t> sizes,
                                           std::span<const double> shares,
                                           std::span<const std::int64_t> drops, double size) {
  const auto upper = std::upper_bound(sizes.begin(), sizes.end(), size,
                                      [](double s, std::int64_t x) { return s < x; });
  const std::size_t above = static_cast<std::size_t>(upper - sizes.begin());
  const std::size_t below = above == 0 ? 0 : above - 1;
  const std::size_t next = std::min(above, sizes.size() - 1);
  if (static_cast<double>(sizes[below]) == size) return {shares[below], drops[below]};
  const std::int64_t drop =
      std::min({drops[below], drops[next], interpolate_bytes(sizes, drops, size)});
  return {std::clamp(std::max(shares[below], shares[next]), 0.0, 1.0),
          std::max<std::int64_t>(0, drop)};
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

CostModel::ParameterSums::ParameterSums(const Profile& profile, bool trained_only)
    : trained_only(trained_only) {
  const std::size_t layers = profile.layers.size();
  prefix.assign(layers + 1, 0);
  for (std::size_t l = 0; l < layers; ++l) {
    const LayerProfile& layer = profile.layers[l];
    prefix[l + 1] = prefix[l] + (trained_only ? layer.trained_bytes() : layer.param_bytes);
  }
  // A tied tensor counted at its first holder only: what any stage holding a range surely holds.
  once_prefix = prefix;
  std::vector<std::int64_t> repeated(layers, 0);
  for (const TiedTensor& t : profile.tied) {
    if (!counts(t)) continue;
    for (std::size_t h = 1; h < t.layers.size(); ++h) repeated[t.layers[h]] += t.bytes;
  }
  for (std::size_t l = 0; l < layers; ++l) {
    once_prefix[l + 1] = once_prefix[l] + (prefix[l + 1] - prefix[l]) - repeated[l];
  }
}

std::int64_t CostModel::ParameterSums::held(const Profile& profile, int first, int end) const {
  std::int64_t bytes = prefix[end] - prefix[first];
  for (const TiedTensor& t : profile.tied) {
    if (!counts(t)) continue;
    int holders = 0;
    for (int k : t.layers) holders += k >= first && k < end;
    if (holders > 1) bytes -= (holders - 1) * t.bytes;
  }
  return bytes;
}

std::int64_t CostModel::ParameterSums::in_tied(const Profile& profile, int layer, int from,
                                               int to) const {
  std::int64_t bytes = of(layer);
  for (const TiedTensor& t : profile.tied) {
    if (!counts(t)) continue;
    const bool mine = std::find(t.layers.begin(), t.layers.end(), layer) != t.layers.end();
    const bool seen = mine && std::any_of(t.layers.begin(), t.layers.end(),
                                          [&](int k) { return k >= from && k < to; });
    if (seen) bytes -= t.bytes;
  }
  return bytes;
}

CostModel::CostModel(const Profile& profile)
    : profile_(profile), all_(profile, false), trained_(profile, true) {
  buffer_prefix_.push_back(0);
  for (const LayerProfile& layer : profile.layers) {
    has_frozen_ = has_frozen_ || layer.trained_bytes() < layer.param_bytes;
    buffer_prefix_.push_back(buffer_prefix_.back() + layer.buffer_bytes);
  }
  for (const TiedTensor& t : profile.tied) has_frozen_ = has_frozen_ || !t.trained;
}

namespace {

// What one micro-batch size's costs are measured at: the profile's sizes and the size itself.
struct AtSize {
  std::span<const std::int64_t> sizes;
  double x = 0.0;
  double operator()(const std::vector<double>& values) const {
    return interpolate(sizes, values, x);
  }
  std::int64_t bytes(const std::vector<std::int64_t>& values) const {
    return interpolate_bytes(sizes, values, x);
  }
};

// Every per-layer array sized, every prefix sum at zero.
void size_arrays(SizeCosts& c, std::size_t layers) {
  for (auto* per_layer : {&c.forward_ms, &c.backward_ms, &c.forward_nograd_ms, &c.backward_input_ms,
                          &c.backward_weight_ms}) {
    per_layer->resize(layers);
  }
  for (auto* per_layer : {&c.output_bytes, &c.saved_bytes, &c.workspace_bytes})
    per_layer->resize(layers);
  c.stored_bytes.assign(layers, 0);
  for (auto* prefix :
       {&c.forward_prefix, &c.backward_prefix, &c.forward_nograd_prefix, &c.backward_input_prefix,
        &c.backward_weight_prefix, &c.forward_corun_prefix, &c.backward_corun_prefix,
        &c.forward_cold_extra_prefix, &c.backward_cold_extra_prefix, &c.forward_sigma_prefix,
        &c.backward_sigma_prefix, &c.forward_step_start_extra_prefix, &c.forward_launch_prefix,
        &c.forward_nograd_launch_prefix, &c.backward_launch_prefix, &c.backward_input_launch_prefix,
        &c.backward_weight_launch_prefix}) {
    prefix->assign(layers + 1, 0.0);
  }
  c.kept_prefix.assign(layers + 1, 0);
  c.with_parameters_prefix.assign(layers + 1, 0);
}

// Layer l's forward, backward and its I and W halves, and their prefix sums.
void add_layer_times(SizeCosts& c, const LayerProfile& layer, std::size_t l, const AtSize& at) {
  c.forward_ms[l] = at(layer.forward_ms);
  c.backward_ms[l] = at(layer.backward_ms);
  c.forward_nograd_ms[l] =
      layer.forward_nograd_ms.empty() ? c.forward_ms[l] : at(layer.forward_nograd_ms);
  if (!layer.backward_input_ms.empty()) {
    c.backward_input_ms[l] = at(layer.backward_input_ms);
    c.backward_weight_ms[l] = at(layer.backward_weight_ms);
  } else {
    // Unmeasured: a layer's weight gradient costs about what its input gradient does (two
    // matrix products of one size); a layer without parameters has no W at all.
    const double weight_share = layer.trained_bytes() > 0 ? 0.5 : 0.0;
    c.backward_weight_ms[l] = weight_share * c.backward_ms[l];
    c.backward_input_ms[l] = c.backward_ms[l] - c.backward_weight_ms[l];
  }
  c.forward_prefix[l + 1] = c.forward_prefix[l] + c.forward_ms[l];
  c.backward_prefix[l + 1] = c.backward_prefix[l] + c.backward_ms[l];
  c.forward_nograd_prefix[l + 1] = c.forward_nograd_prefix[l] + c.forward_nograd_ms[l];
  c.backward_input_prefix[l + 1] = c.backward_input_prefix[l] + c.backward_input_ms[l];
  c.backward_weight_prefix[l + 1] = c.backward_weight_prefix[l] + c.backward_weight_ms[l];
  c.with_parameters_prefix[l + 1] =
      c.with_parameters_prefix[l] + (layer.trained_bytes() > 0 ? 1 : 0);
}

// Layer l's tensors: its output, what it saves, its workspace and its backward's peaks.
void add_layer_memory(SizeCosts& c, const LayerProfile& layer, std::size_t l, std::size_t layers,
                      const AtSize& at) {
  c.output_bytes[l] = at.bytes(layer.output_bytes);
  c.saved_bytes[l] = at.bytes(layer.saved_bytes);
  c.workspace_bytes[l] = at.bytes(layer.workspace_bytes);
  if (!layer.backward_peak_bytes.empty()) {
    c.backward_peak_bytes.resize(layers);
    c.backward_accumulate_peak_bytes.resize(layers);
    c.backward_peak_bytes[l] = at.bytes(layer.backward_peak_bytes);
    c.backward_accumulate_peak_bytes[l] = at.bytes(layer.backward_accumulate_peak_bytes);
    const bool inner = !layer.inner_backward_peak_bytes.empty();
    c.inner_backward_peak_bytes.push_back(inner ? at.bytes(layer.inner_backward_peak_bytes)
                                                : c.backward_peak_bytes[l]);
    c.inner_backward_accumulate_peak_bytes.push_back(
        inner ? at.bytes(layer.inner_backward_accumulate_peak_bytes)
              : c.backward_accumulate_peak_bytes[l]);
  }
  if (!layer.backward_input_peak_bytes.empty()) {
    c.backward_input_peak_bytes.resize(layers);
    c.backward_weight_peak_bytes.resize(layers);
    c.backward_input_peak_bytes[l] = at.bytes(layer.backward_input_peak_bytes);
    c.backward_weight_peak_bytes[l] = at.bytes(layer.backward_weight_peak_bytes);
  }
  if (!layer.backward_peak_end.empty()) {
    const auto [share, drop] =
        release_at(at.sizes, layer.backward_peak_end, layer.backward_peak_drop_bytes, at.x);
    c.backward_peak_end.push_back(share);
    c.backward_peak_drop_bytes.push_back(drop);
  }
  c.keeps_input.push_back(layer.keeps_input ? 1 : 0);
  c.keeps_output.push_back(layer.keeps_output ? 1 : 0);
  c.aliases.push_back(layer.output_aliases_input ? 1 : 0);
  c.modifies.push_back(layer.modifies_input ? 1 : 0);
}

// What torch's split backward allocates and frees in layer l, where the profile measured it.
void add_layer_torch_memory(SizeCosts& c, const LayerProfile& layer, const AtSize& at) {
  if (layer.torch_weight_gradient_bytes.empty()) return;
  c.torch_weight_gradient_bytes.push_back(at.bytes(layer.torch_weight_gradient_bytes));
  c.torch_freed_by_input_bytes.push_back(at.bytes(layer.torch_freed_by_input_bytes));
  c.torch_keeps_output_gradient.push_back(layer.torch_keeps_output_gradient ? 1 : 0);
  if (!layer.torch_weight_peak_bytes.empty()) {
    c.torch_weight_peak_bytes.push_back(at.bytes(layer.torch_weight_peak_bytes));
    c.torch_weight_accumulate_peak_bytes.push_back(
        at.bytes(layer.torch_weight_accumulate_peak_bytes));
  }
  if (!layer.torch_weight_freed_bytes.empty()) {
    c.torch_weight_freed_bytes.push_back(at.bytes(layer.torch_weight_freed_bytes));
    c.torch_weight_frees_input.push_back(layer.torch_weight_frees_input ? 1 : 0);
  }
}

// The host's time to launch layer l's tasks (0 without launch times).
void add_layer_launches(SizeCosts& c, const LayerProfile& layer, std::size_t l, const AtSize& at) {
  double forward_launch = 0.0, nograd_launch = 0.0, backward_launch = 0.0;
  if (!layer.forward_launch_ms.empty()) {
    forward_launch = at(layer.forward_launch_ms);
    backward_launch = at(layer.backward_launch_ms);
    nograd_launch = layer.forward_nograd_launch_ms.empty() ? forward_launch
                                                           : at(layer.forward_nograd_launch_ms);
  }
  // I and W launch what the whole backward does, in the share of the device's work each
  // takes (the profile times the halves on the device only).
  const double halves = c.backward_input_ms[l] + c.backward_weight_ms[l];
  const double input_share =
      halves > 0.0 ? c.backward_input_ms[l] / halves : (layer.trained_bytes() > 0 ? 0.5 : 1.0);
  const double input_launch = input_share * backward_launch;
  c.forward_launch_prefix[l + 1] = c.forward_launch_prefix[l] + forward_launch;
  c.forward_nograd_launch_prefix[l + 1] = c.forward_nograd_launch_prefix[l] + nograd_launch;
  c.backward_launch_prefix[l + 1] = c.backward_launch_prefix[l] + backward_launch;
  c.backward_input_launch_prefix[l + 1] = c.backward_input_launch_prefix[l] + input_launch;
  c.backward_weight_launch_prefix[l + 1] =
      c.backward_weight_launch_prefix[l] + (backward_launch - input_launch);
}

// Layer l beside co-runners, its spread, with a cold cache and as a step's first task.
void add_layer_variations(SizeCosts& c, const LayerProfile& layer, std::size_t l,
                          const AtSize& at) {
  // A co-run time below the solo one is noise: taken as solo, so that solo times stay lower
  // bounds of every prediction (the planner prunes with them).
  const bool corun = !layer.forward_corun_ms.empty();
  c.forward_corun_prefix[l + 1] =
      c.forward_corun_prefix[l] +
      (corun ? std::max(c.forward_ms[l], at(layer.forward_corun_ms)) : c.forward_ms[l]);
  c.backward_corun_prefix[l + 1] =
      c.backward_corun_prefix[l] +
      (corun ? std::max(c.backward_ms[l], at(layer.backward_corun_ms)) : c.backward_ms[l]);
  // A normal's standard deviation from a median absolute deviation.
  const auto sigma = [&](const std::vector<double>& spread) {
    return spread.empty() ? 0.0 : 1.4826 * at(spread);
  };
  c.forward_sigma_prefix[l + 1] = c.forward_sigma_prefix[l] + sigma(layer.forward_ms_spread);
  c.backward_sigma_prefix[l + 1] = c.backward_sigma_prefix[l] + sigma(layer.backward_ms_spread);
  // Likewise a cold time below the hot one: no extra (cold times come in pairs).
  const bool cold = !layer.forward_cold_ms.empty();
  const auto extra = [&](bool measured, const std::vector<double>& slower, double ms) {
    return measured ? std::max(0.0, at(slower) - ms) : 0.0;
  };
  c.forward_cold_extra_prefix[l + 1] =
      c.forward_cold_extra_prefix[l] + extra(cold, layer.forward_cold_ms, c.forward_ms[l]);
  c.backward_cold_extra_prefix[l + 1] =
      c.backward_cold_extra_prefix[l] + extra(cold, layer.backward_cold_ms, c.backward_ms[l]);
  c.forward_step_start_extra_prefix[l + 1] =
      c.forward_step_start_extra_prefix[l] +
      extra(!layer.forward_step_start_ms.empty(), layer.forward_step_start_ms, c.forward_ms[l]);
}

// Which storages are kept, and which layer decides each stage input's fate.
void settle_storages(SizeCosts& c, std::size_t layers) {
  // A storage made by layer l is referenced by l, the aliasing layers after it, and the next
  // layer that makes its own; it is kept if one of them keeps it.
  const int count = static_cast<int>(layers);
  for (int l = 0; l < count; ++l) {
    if (c.aliases[l]) continue;
    const bool kept = c.keeps_output[l] || c.kept_from(l + 1, count);
    c.stored_bytes[l] = kept ? c.output_bytes[l] : 0;
  }
  c.input_decider.assign(layers + 1, count);
  for (std::size_t l = layers; l-- > 0;) {
    const bool decides = c.modifies[l] || !c.aliases[l];
    c.input_decider[l] = decides ? static_cast<int>(l) : c.input_decider[l + 1];
  }
  for (std::size_t l = 0; l < layers; ++l)
    c.kept_prefix[l + 1] = c.kept_prefix[l] + c.saved_bytes[l] + c.stored_bytes[l];
}

}  // namespace

const SizeCosts& CostModel::at(std::int64_t size) const {
  if (auto it = cache_.find(size); it != cache_.end()) return *it->second;
  if (size < 1 || size > profile_.batch_size) {
    throw std::out_of_range("cost model: micro-batch size " + std::to_string(size) +
                            " outside 1 to the batch size " + std::to_string(profile_.batch_size));
  }
  auto costs = std::make_unique<SizeCosts>();
  SizeCosts& c = *costs;
  const AtSize at_size{profile_.micro_batch_sizes, static_cast<double>(size)};
  const std::size_t layers = profile_.layers.size();
  c.size = size;
  c.input_bytes = at_size.bytes(profile_.input_bytes);
  c.input_needs_gradient.resize(layers);
  for (std::size_t l = 0; l < layers; ++l)
    c.input_needs_gradient[l] = input_needs_gradient(static_cast<int>(l)) ? 1 : 0;
  c.launch_times = profile_.has_launch_times();
  c.backward_call_ms = c.launch_times ? profile_.device.backward_call_ms : 0.0;
  size_arrays(c, layers);
  for (std::size_t l = 0; l < layers; ++l) {
    const LayerProfile& layer = profile_.layers[l];
    add_layer_times(c, layer, l, at_size);
    add_layer_memory(c, layer, l, layers, at_size);
    add_layer_torch_memory(c, layer, at_size);
    add_layer_launches(c, layer, l, at_size);
    add_layer_variations(c, layer, l, at_size);
  }
  settle_storages(c, layers);
  return *cache_.emplace(size, std::move(costs)).first->second;
}

std::int64_t SizeCosts::kept_bytes(int first, int end) const {
  std::int64_t kept = kept_prefix[end] - kept_prefix[first];
  // Only the storage the stage output lives in depends on where the stage ends: made by the
  // last layer that is not a view (none: the stage input's, counted elsewhere, or its copy).
  int maker = end - 1;
  while (maker >= first && aliases[maker]) --maker;
  const int layers = static_cast<int>(output_bytes.size());
  // The copy is kept as a layer's output is; or it is the stage output's storage, which the
  // executor holds.
  if (copies_input(first, end) && ((maker < first && end < layers) || kept_from(first, end)))
    kept += stage_input_bytes(first);
  if (maker < first) return kept;
  const bool held = end < layers || keeps_output[maker] || kept_from(maker + 1, end);
  return kept - stored_bytes[maker] + (held ? output_bytes[maker] : 0);
}

bool SizeCosts::kept_from(int from, int end) const {
  for (int j = from; j < end; ++j) {
    if (keeps_input[j] || (aliases[j] && keeps_output[j])) return true;
    if (!aliases[j]) return false;
  }
  return false;
}

std::int64_t SizeCosts::kept_bytes_within(int first, int end) const {
  int maker = end - 1;
  while (maker >= first && aliases[maker]) --maker;
  const std::int64_t kept = kept_prefix[end] - kept_prefix[first];
  return maker < first ? kept : kept - stored_bytes[maker];
}

}  // namespace pipetune
