#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "sim/profile.hpp"

namespace pipetune {

/// Piecewise-linear through the measured points (sizes[k], values[k]); outside the measured
/// range, extended along the nearest segment (docs/formats.md, "Between and beyond the measured
/// sizes"); never below zero. With one point, proportional to the size.
double interpolate(std::span<const std::int64_t> sizes, std::span<const double> values,
                   double size);
std::int64_t interpolate_bytes(std::span<const std::int64_t> sizes,
                               std::span<const std::int64_t> values, double size);

/// Every layer's costs at one micro-batch size, with prefix sums so a stage's total is O(1).
struct SizeCosts {
  std::int64_t size = 0;
  std::int64_t input_bytes = 0;  ///< the model's input at this size
  std::vector<double> forward_ms, backward_ms;
  std::vector<double> forward_nograd_ms;  ///< without autograd; forward_ms where not profiled
  /// The backward's I and W halves: measured, or backward_ms split (halves for a layer with
  /// parameters, all of it in I for one without).
  std::vector<double> backward_input_ms, backward_weight_ms;
  std::vector<std::int64_t> output_bytes, saved_bytes, workspace_bytes;
  /// Measured backward peaks (LayerProfile); empty when the profile has none.
  std::vector<std::int64_t> backward_peak_bytes, backward_accumulate_peak_bytes;
  /// The same inside a stage (LayerProfile); the ones above where the profile has none.
  std::vector<std::int64_t> inner_backward_peak_bytes, inner_backward_accumulate_peak_bytes;
  /// When a layer's backward is done with its peak (LayerProfile); empty when the profile has
  /// no such record.
  std::vector<double> backward_peak_end;
  std::vector<std::int64_t> backward_peak_drop_bytes;
  /// The split backward's measured peaks (LayerProfile); empty when the profile has none.
  std::vector<std::int64_t> backward_input_peak_bytes, backward_weight_peak_bytes;
  std::vector<double> forward_prefix, backward_prefix, forward_nograd_prefix;  ///< size L + 1
  /// Per layer, from the profile (LayerProfile): what autograd keeps of input and output.
  std::vector<std::uint8_t> keeps_input, keeps_output, aliases;
  /// Per layer, from the profile (LayerProfile::modifies_input): it changes its input in place.
  std::vector<std::uint8_t> modifies;
  /// Per layer, what torch's zero-bubble I keeps for W (LayerProfile); both empty when the
  /// profile has no such count.
  std::vector<std::int64_t> torch_weight_gradient_bytes, torch_freed_by_input_bytes;
  std::vector<std::uint8_t> torch_keeps_output_gradient;
  /// torch's W of each layer alone (LayerProfile); empty when the profile has none.
  std::vector<std::int64_t> torch_weight_peak_bytes, torch_weight_accumulate_peak_bytes;
  /// What that W frees as it goes (LayerProfile); empty when the profile has none.
  std::vector<std::int64_t> torch_weight_freed_bytes;
  std::vector<std::uint8_t> torch_weight_frees_input;
  /// Per layer k, size L + 1: the first layer j >= k that modifies its input or makes a storage
  /// of its own (L where none does); what decides whether a stage starting at k copies its input.
  std::vector<int> input_decider;
  /// Layer l's output storage when a layer of its own keeps it (the layer itself, the aliasing
  /// layers after it, or the next layer that makes a storage of its own); else 0. Aliasing
  /// layers make no storage: 0.
  std::vector<std::int64_t> stored_bytes;
  std::vector<std::int64_t> kept_prefix;  ///< Σ saved + stored, size L + 1
  std::vector<double> backward_input_prefix, backward_weight_prefix;  ///< size L + 1
  /// Forward and backward beside the profile's co-runners (LayerProfile), never below the solo
  /// times; the solo times where the profile has none.
  std::vector<double> forward_corun_prefix, backward_corun_prefix;  ///< size L + 1
  /// How much longer forward and backward take with the cache emptied first
  /// (LayerProfile::forward_cold_ms, never below 0); all 0 where the profile has no cold times.
  std::vector<double> forward_cold_extra_prefix, backward_cold_extra_prefix;  ///< size L + 1
  /// Prefix sums of what each layer's forward takes longer as a step's first task
  /// (LayerProfile::forward_step_start_ms over its hot time, never below 0); all 0 without.
  std::vector<double> forward_step_start_extra_prefix;  ///< size L + 1
  /// The layers' measured spread as standard deviations, 1.4826 × the median absolute deviation
  /// (LayerProfile::forward_ms_spread); 0 where the profile has none.
  std::vector<double> forward_sigma_prefix, backward_sigma_prefix;  ///< size L + 1
  /// The host's launch times (LayerProfile::forward_launch_ms, …), all 0 where the profile has
  /// none; the backward's split into I and W in the proportion of the device's times.
  std::vector<double> forward_launch_prefix, forward_nograd_launch_prefix, backward_launch_prefix,
      backward_input_launch_prefix, backward_weight_launch_prefix;  ///< size L + 1
  bool launch_times = false;  ///< whether the profile has them (Profile::has_launch_times)
  /// ProfileDevice::backward_call_ms where the profile has launch times, else 0.
  double backward_call_ms = 0.0;
  std::vector<int> with_parameters_prefix;  ///< layers with parameters that train, size L + 1

  double forward_ms_sum(int first, int end) const {
    return forward_prefix[end] - forward_prefix[first];
  }
  double forward_nograd_ms_sum(int first, int end) const {
    return forward_nograd_prefix[end] - forward_nograd_prefix[first];
  }
  double backward_ms_sum(int first, int end) const {
    return backward_prefix[end] - backward_prefix[first];
  }
  /// What a task of layers [first, end) takes the host to launch: its layers' launch times, and
  /// for a backward, a split backward's I, the autograd call's own time once
  /// (ProfileDevice::backward_call_ms); W is one call per layer with parameters (the executor
  /// asks each layer's weight gradients of its own output). A launch does not get faster on a
  /// faster device. All 0 without launch times in the profile.
  double forward_launch_ms(int first, int end) const {
    return forward_launch_prefix[end] - forward_launch_prefix[first];
  }
  double forward_nograd_launch_ms(int first, int end) const {
    return forward_nograd_launch_prefix[end] - forward_nograd_launch_prefix[first];
  }
  double backward_launch_ms(int first, int end) const {
    return backward_launch_prefix[end] - backward_launch_prefix[first] + backward_call_ms;
  }
  double backward_input_launch_ms(int first, int end) const {
    return backward_input_launch_prefix[end] - backward_input_launch_prefix[first] +
           backward_call_ms;
  }
  double backward_weight_launch_ms(int first, int end) const {
    return backward_weight_launch_prefix[end] - backward_weight_launch_prefix[first] +
           weight_calls_ms(first, end);
  }
  /// The longer of the device's time on a device of relative `speed` and the host's time to
  /// launch the task: what one task takes alone, with nothing launched ahead of it. The
  /// simulator runs the host and the device as two clocks (docs/architecture.md), so a task may
  /// take less there when the host ran ahead; these are for estimates (the balancer, the GUI).
  double forward_task_ms(int first, int end, double speed) const {
    return std::max(forward_ms_sum(first, end) / speed, forward_launch_ms(first, end));
  }
  double forward_nograd_task_ms(int first, int end, double speed) const {
    return std::max(forward_nograd_ms_sum(first, end) / speed,
                    forward_nograd_launch_ms(first, end));
  }
  double backward_task_ms(int first, int end, double speed) const {
    return std::max(backward_ms_sum(first, end) / speed, backward_launch_ms(first, end));
  }
  double backward_input_task_ms(int first, int end, double speed) const {
    return std::max(backward_input_ms_sum(first, end) / speed,
                    backward_input_launch_ms(first, end));
  }
  double backward_weight_task_ms(int first, int end, double speed) const {
    return std::max(backward_weight_ms_sum(first, end) / speed,
                    backward_weight_launch_ms(first, end));
  }
  /// The W calls' own host time over layers [first, end): one per layer with parameters that
  /// train.
  double weight_calls_ms(int first, int end) const {
    return backward_call_ms * (with_parameters_prefix[end] - with_parameters_prefix[first]);
  }
  /// What a forward with autograd of layers [first, end) keeps for the backward: saved bytes,
  /// the storages some layer keeps, and the stage output, which the executor holds, except on
  /// the last stage, where the loss consumes it at once and keeps what it needs (saved_bytes).
  /// Equals stage_memory()'s kept_bytes in O(1) but for a walk over aliasing layers.
  std::int64_t kept_bytes(int first, int end) const;
  /// kept_bytes() less the storage the stage output lives in and the copy of a stage input
  /// changed in place (copies_input): at most kept_bytes(), and it only grows as the stage
  /// grows at either end (the planner's tables need that; the copy would break it where a stage
  /// grown at its start no longer copies).
  std::int64_t kept_bytes_within(int first, int end) const;
  /// Whether the storage the activation entering layer `from` lives in is kept by a layer of
  /// [from, end): the views of it (keeping their input or output) and the first layer that makes
  /// a storage of its own (keeping its input).
  bool kept_from(int from, int end) const;
  /// Whether a stage of layers [first, end) runs them on a copy of its input, as the executor
  /// does where they change that input in place: its first layers that are views of the input
  /// are followed by one that modifies it, before any makes a storage of its own. The copy is
  /// a storage of stage_input_bytes(first), made as each forward or recompute starts.
  bool copies_input(int first, int end) const {
    const int decider = input_decider[static_cast<std::size_t>(first)];
    return decider < end && modifies[static_cast<std::size_t>(decider)] != 0;
  }
  double forward_corun_ms_sum(int first, int end) const {
    return forward_corun_prefix[end] - forward_corun_prefix[first];
  }
  double backward_corun_ms_sum(int first, int end) const {
    return backward_corun_prefix[end] - backward_corun_prefix[first];
  }
  double forward_sigma_ms(int first, int end) const {
    return forward_sigma_prefix[end] - forward_sigma_prefix[first];
  }
  double backward_sigma_ms(int first, int end) const {
    return backward_sigma_prefix[end] - backward_sigma_prefix[first];
  }
  double forward_cold_extra_ms(int first, int end) const {
    return forward_cold_extra_prefix[end] - forward_cold_extra_prefix[first];
  }
  double backward_cold_extra_ms(int first, int end) const {
    return backward_cold_extra_prefix[end] - backward_cold_extra_prefix[first];
  }
  double forward_step_start_extra_ms(int first, int end) const {
    return forward_step_start_extra_prefix[end] - forward_step_start_extra_prefix[first];
  }
  double backward_input_ms_sum(int first, int end) const {
    return backward_input_prefix[end] - backward_input_prefix[first];
  }
  double backward_weight_ms_sum(int first, int end) const {
    return backward_weight_prefix[end] - backward_weight_prefix[first];
  }
  /// The least a layer's forward, backward and way back can cost, whichever way it runs: the
  /// planner's balance-free bounds price layers by these. A forward with or without autograd
  /// (checkpointing runs the latter first).
  double least_forward_ms(int layer) const {
    return std::min(forward_ms[layer], forward_nograd_ms[layer]);
  }
  /// A backward whole or as its I and W halves.
  double least_backward_ms(int layer) const {
    return std::min(backward_ms[layer], backward_input_ms[layer] + backward_weight_ms[layer]);
  }
  /// The gradient's way back through the layer where the backward is split: its I, or the whole
  /// backward where that is less.
  double least_input_backward_ms(int layer) const {
    return std::min(backward_input_ms[layer], backward_ms[layer]);
  }
  /// What a stage starting at layer `first` receives: the model input or the previous output.
  std::int64_t stage_input_bytes(int first) const {
    return first == 0 ? input_bytes : output_bytes[first - 1];
  }
  /// What it sends back: the gradient of that input, none where it needs none
  /// (CostModel::input_needs_gradient). At `first` = the layer count (a stage a bound prices as
  /// if another followed it), the model output's: as the activation.
  std::int64_t stage_input_gradient_bytes(int first) const {
    const bool past_the_end = first >= static_cast<int>(input_needs_gradient.size());
    return past_the_end || input_needs_gradient[static_cast<std::size_t>(first)]
               ? stage_input_bytes(first)
               : 0;
  }
  std::vector<char> input_needs_gradient;  ///< per layer, CostModel::input_needs_gradient
};

/// The profile's costs at any micro-batch size (interpolated once per size, then cached).
/// Not thread-safe: give each thread its own.
class CostModel {
 public:
  explicit CostModel(const Profile& profile);
  /// It keeps a reference to the profile: a temporary would dangle (ASan found one in a test).
  explicit CostModel(Profile&&) = delete;

  const Profile& profile() const { return profile_; }
  int layer_count() const { return static_cast<int>(profile_.layers.size()); }
  /// Costs at a micro-batch of `size` samples, 1 ≤ size ≤ the batch (std::out_of_range
  /// otherwise): the profile loader bounds the byte counts over exactly that range.
  const SizeCosts& at(std::int64_t size) const;
  /// What a stage of layers [first, end) holds in parameters: a tied tensor (Profile::tied) once,
  /// however many of its holders the stage has.
  std::int64_t param_bytes(int first, int end) const { return all_.held(profile_, first, end); }
  /// A lower bound of param_bytes(first, end) that adds over ranges (tied tensors counted at
  /// their first holder only), for bounds built on prefix sums.
  std::int64_t param_bytes_at_least(int first, int end) const { return all_.at_least(first, end); }
  // From the prefix sums, not the profile's layers: the memory walks read it for every layer of
  // a stage, and a layer's record is half a kilobyte apart from the next.
  std::int64_t param_bytes_of(int layer) const { return all_.of(layer); }
  /// Layer `layer`'s parameter bytes new to a walk over a stage that has already visited
  /// layers [from, to): less the tied tensors one of those holds (their gradient is one tensor).
  std::int64_t param_bytes_in(int layer, int from, int to) const {
    return all_.in(profile_, layer, from, to);
  }
  /// The same four for the parameters that train (LayerProfile::trainable_param_bytes): those
  /// that get gradients and optimizer state. Equal to the above when nothing is frozen.
  std::int64_t trained_bytes(int first, int end) const {
    return trained_.held(profile_, first, end);
  }
  std::int64_t trained_bytes_at_least(int first, int end) const {
    return trained_.at_least(first, end);
  }
  std::int64_t trained_bytes_of(int layer) const { return trained_.of(layer); }
  std::int64_t trained_bytes_in(int layer, int from, int to) const {
    return trained_.in(profile_, layer, from, to);
  }
  /// What a stage of layers [first, end) holds from step to step besides gradients and
  /// optimizer state: its parameters (param_bytes) and its buffers (LayerProfile::buffer_bytes),
  /// which have neither. The memory model's resident bytes; the _at_least form adds over ranges.
  std::int64_t held_bytes(int first, int end) const {
    return param_bytes(first, end) + buffer_bytes(first, end);
  }
  std::int64_t held_bytes_at_least(int first, int end) const {
    return param_bytes_at_least(first, end) + buffer_bytes(first, end);
  }
  std::int64_t buffer_bytes(int first, int end) const {
    return buffer_prefix_[end] - buffer_prefix_[first];
  }
  /// Whether layer `layer`'s input needs a gradient (never the model's). In a model with frozen
  /// parameters, only where some layer before it trains: the layers up to the first that trains
  /// work on data alone (a frozen stem), so autograd records nothing there, and no stage sends
  /// a gradient back into them. In a model without, every other layer's, as the executor has
  /// always asked of every stage input (a parameterless first layer's backward is a view's).
  bool input_needs_gradient(int layer) const {
    return layer > 0 && (!has_frozen_ || trained_.prefix[layer] > 0);
  }
  /// Whether any parameter is frozen (LayerProfile::trainable_param_bytes, TiedTensor::trained).
  bool has_frozen() const { return has_frozen_; }

 private:
  // Prefix sums of one kind of parameter bytes (every parameter, or those that train).
  struct ParameterSums {
    ParameterSums(const Profile& profile, bool trained_only);
    std::int64_t of(int layer) const { return prefix[layer + 1] - prefix[layer]; }
    std::int64_t at_least(int first, int end) const {
      return once_prefix[end] - once_prefix[first];
    }
    std::int64_t held(const Profile& profile, int first, int end) const;
    // Inline where nothing is tied: the memory walks ask it for every layer of every stage they
    // walk (12 % of a capped 3,000-layer plan's time as an out-of-line call).
    std::int64_t in(const Profile& profile, int layer, int from, int to) const {
      return profile.tied.empty() ? of(layer) : in_tied(profile, layer, from, to);
    }
    std::int64_t in_tied(const Profile& profile, int layer, int from, int to) const;
    bool counts(const TiedTensor& t) const { return t.trained || !trained_only; }

    bool trained_only;
    std::vector<std::int64_t> prefix, once_prefix;
  };

  const Profile& profile_;
  ParameterSums all_, trained_;
  std::vector<std::int64_t> buffer_prefix_;  // over layers
  bool has_frozen_ = false;
  // (size, costs) for the few sizes asked for; not indexed by size, which may be up to the batch.
  mutable std::unordered_map<std::int64_t, std::unique_ptr<SizeCosts>> cache_;
};

}  // namespace pipetune
