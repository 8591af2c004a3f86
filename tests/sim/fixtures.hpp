#pragma once

// Profiles built in code, with costs simple enough that tests can predict results by hand.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "sim/error.hpp"
#include "sim/hardware.hpp"
#include "sim/plan.hpp"
#include "sim/profile.hpp"

namespace pipetune::testing {

/// The message a loader (`parse(text, source)`) throws for `text` as "in.json", or "" if it
/// accepted it. Anything other than an InputError escapes and fails the test.
template <typename Parse, typename Text>
std::string error_of(Parse parse, const Text& text) {
  try {
    parse(text, "in.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

/// One layer whose costs do not depend on the micro-batch size; bytes per sample are scaled by
/// the size (so a micro-batch of n samples has n times the bytes).
struct LayerSpec {
  double forward_ms = 1.0;
  double backward_ms = 2.0;
  std::int64_t param_bytes = 0;
  std::int64_t output_per_sample = 0;
  std::int64_t saved_per_sample = 0;
  std::int64_t workspace_per_sample = 0;
};

inline Profile make_profile(const std::vector<LayerSpec>& layers, std::int64_t batch_size,
                            std::int64_t input_per_sample = 0) {
  Profile p;
  p.model = "test-model";
  p.device = {"cpu", "test cpu", 0};
  p.dtype = "float32";
  p.batch_size = batch_size;
  for (std::int64_t s = 1; s <= batch_size; s *= 2) p.micro_batch_sizes.push_back(s);
  if (p.micro_batch_sizes.back() != batch_size) p.micro_batch_sizes.push_back(batch_size);
  for (auto s : p.micro_batch_sizes) p.input_bytes.push_back(input_per_sample * s);
  int index = 0;
  for (const auto& spec : layers) {
    LayerProfile l;
    l.name = std::to_string(index++);
    l.param_bytes = spec.param_bytes;
    for (auto s : p.micro_batch_sizes) {
      l.forward_ms.push_back(spec.forward_ms);
      l.backward_ms.push_back(spec.backward_ms);
      l.output_bytes.push_back(spec.output_per_sample * s);
      l.saved_bytes.push_back(spec.saved_per_sample * s);
      l.workspace_bytes.push_back(spec.workspace_per_sample * s);
    }
    p.layers.push_back(std::move(l));
  }
  return p;
}

/// `layers` identical layers.
inline Profile uniform_profile(int layers, double forward_ms, double backward_ms,
                               std::int64_t batch_size) {
  LayerSpec spec;
  spec.forward_ms = forward_ms;
  spec.backward_ms = backward_ms;
  return make_profile(std::vector<LayerSpec>(layers, spec), batch_size);
}

inline Plan make_plan(std::vector<int> balance, int chunks, CheckpointMode checkpoint,
                      ScheduleKind schedule = ScheduleKind::GPipe) {
  Plan plan;
  plan.balance = std::move(balance);
  plan.chunks = chunks;
  plan.checkpoint = checkpoint;
  plan.schedule = schedule;
  return plan;
}

/// A random split of `layers` layers into `stages` non-empty stages: stage j is
/// [ends[j], ends[j + 1]).
inline std::vector<int> random_stage_ends(std::mt19937& rng, int layers, int stages) {
  std::vector<int> ends{0};
  for (int j = 1; j < stages; ++j) {
    const int lo = ends.back() + 1, hi = layers - (stages - j);
    ends.push_back(lo + static_cast<int>(rng() % (hi - lo + 1)));
  }
  ends.push_back(layers);
  return ends;
}

/// The stages' layer counts of random_stage_ends()'s split.
inline std::vector<int> balance_of_ends(const std::vector<int>& ends) {
  std::vector<int> balance;
  for (std::size_t j = 0; j + 1 < ends.size(); ++j) balance.push_back(ends[j + 1] - ends[j]);
  return balance;
}

/// Random layer costs and sizes (the planner and timing tests' instances): costs that grow
/// sub-linearly with the micro-batch size, and in half the profiles a no-grad forward that is
/// usually cheaper than the forward, now and then dearer.
inline Profile random_profile(std::mt19937& rng, int layers, std::int64_t batch) {
  std::vector<testing::LayerSpec> specs(layers);
  for (auto& s : specs) {
    s.forward_ms = 0.1 + (rng() % 50) / 10.0;
    s.backward_ms = 0.1 + (rng() % 100) / 10.0;
    s.param_bytes = 1000 * (rng() % 50);
    s.output_per_sample = 100 * (rng() % 40);
    s.saved_per_sample = 100 * (rng() % 40);
    s.workspace_per_sample = 10 * (rng() % 20);
  }
  Profile p = make_profile(specs, batch, 50);
  // Costs that grow sub-linearly with the micro-batch size, as on a real device.
  for (auto& l : p.layers) {
    for (std::size_t k = 0; k < p.micro_batch_sizes.size(); ++k) {
      const double scale = std::pow(static_cast<double>(p.micro_batch_sizes[k]), 0.7);
      l.forward_ms[k] *= scale;
      l.backward_ms[k] *= scale;
    }
  }
  // Half the profiles time the forward without autograd too: usually cheaper, now and then
  // (noise) dearer, so the planner's bounds must hold either way.
  if (rng() % 2) {
    for (auto& l : p.layers) {
      const double factor = 0.3 + (rng() % 11) / 10.0;  // 0.3..1.3
      for (double ms : l.forward_ms) l.forward_nograd_ms.push_back(ms * factor);
    }
  }
  return p;
}

/// Some layers change their input in place, chosen by position so that no random draw moves:
/// every other view (an in-place activation), and now and then a layer that makes its own
/// output after changing its input. A stage starting there copies its input
/// (SizeCosts::copies_input).
inline void modify_some_inputs_in_place(Profile& profile) {
  for (std::size_t l = 0; l < profile.layers.size(); ++l) {
    LayerProfile& layer = profile.layers[l];
    layer.modifies_input = layer.output_aliases_input ? l % 2 == 0 : l % 5 == 3;
  }
}

/// Every flag mix of what layers keep (a third keep nothing of their input, a third keep their
/// output, a quarter are views or in place) and, in a third of the profiles, measured backward
/// peaks (half of them with the peaks inside a stage too, half with when each layer is done with
/// its peak), even ones below what the estimate would give: the memory bounds' tests.
inline void vary_memory_flags(std::mt19937& rng, Profile& profile) {
  for (auto& l : profile.layers) {
    if (rng() % 3 == 0) l.keeps_input = false;
    if (rng() % 3 == 0) l.keeps_output = true;
    if (rng() % 4 == 0) l.output_aliases_input = true;
  }
  modify_some_inputs_in_place(profile);
  if (rng() % 3 == 0) {
    const bool inner = rng() % 2 == 0;  // and, in half of those, the peaks inside a stage
    for (auto& l : profile.layers) {
      for (std::size_t k = 0; k < profile.micro_batch_sizes.size(); ++k) {
        l.backward_peak_bytes.push_back(static_cast<std::int64_t>(rng() % 20000));
        l.backward_accumulate_peak_bytes.push_back(static_cast<std::int64_t>(rng() % 20000));
        if (!inner) continue;
        l.inner_backward_peak_bytes.push_back(static_cast<std::int64_t>(rng() % 20000));
        l.inner_backward_accumulate_peak_bytes.push_back(static_cast<std::int64_t>(rng() % 20000));
      }
    }
    // And, in half of those, when each layer's backward is done with its peak.
    if (rng() % 2 == 0) {
      for (auto& l : profile.layers) {
        for (std::size_t k = 0; k < profile.micro_batch_sizes.size(); ++k) {
          l.backward_peak_end.push_back(static_cast<double>(rng() % 101) / 100.0);
          l.backward_peak_drop_bytes.push_back(static_cast<std::int64_t>(rng() % 30000));
        }
      }
    }
  }
}

/// In a third of the profiles, two or three layers with parameters hold one tied tensor of up to
/// the smallest of their parameter bytes (Profile::tied): the bounds must count it once per stage.
inline void maybe_tie_layers(std::mt19937& rng, Profile& profile) {
  if (rng() % 3 != 0) return;
  std::vector<int> with;
  for (std::size_t k = 0; k < profile.layers.size(); ++k) {
    if (profile.layers[k].param_bytes > 0) with.push_back(static_cast<int>(k));
  }
  if (with.size() < 2) return;
  std::shuffle(with.begin(), with.end(), rng);
  with.resize(std::min<std::size_t>(with.size(), 2 + rng() % 2));
  std::sort(with.begin(), with.end());
  std::int64_t bytes = profile.layers[with[0]].param_bytes;
  for (int k : with) bytes = std::min(bytes, profile.layers[k].param_bytes);
  if (rng() % 2) bytes /= 2;
  profile.tied.push_back({"tied.weight", with, bytes});
}

/// The backward's halves measured apart and dearer than the whole, as a split backward is:
/// I at 0.8 and W at 0.5 of each layer's backward. With I + W equal to the backward, a runtime
/// that moves work between I and W on a device (torch's first stage) keeps every path's sum.
inline void split_backward_dearer(Profile& profile) {
  for (LayerProfile& l : profile.layers) {
    l.backward_input_ms.clear();
    l.backward_weight_ms.clear();
    for (double ms : l.backward_ms) {
      l.backward_input_ms.push_back(0.8 * ms);
      l.backward_weight_ms.push_back(0.5 * ms);
    }
  }
}

/// In a third of the profiles, parameters frozen as transfer learning freezes them
/// (LayerProfile::trainable_param_bytes): a stem of the first one to half the layers whose
/// parameters do not train (a tied tensor one of them holds frozen with it), and in half of
/// those one later layer half frozen. The bounds must count no gradient, state or gradient copy
/// for what does not train. Call it after maybe_tie_layers().
inline void maybe_freeze_layers(std::mt19937& rng, Profile& profile) {
  if (rng() % 3 != 0) return;
  const int layers = static_cast<int>(profile.layers.size());
  const int stem = 1 + static_cast<int>(rng() % std::max(1, layers / 2));
  std::vector<char> in_frozen_tie(profile.layers.size(), 0);
  for (TiedTensor& t : profile.tied) {
    if (t.layers.front() >= stem) continue;
    t.trained = false;
    for (int k : t.layers) in_frozen_tie[static_cast<std::size_t>(k)] = 1;
  }
  for (int k = 0; k < layers; ++k) {
    LayerProfile& l = profile.layers[static_cast<std::size_t>(k)];
    if (k < stem) {
      l.trainable_param_bytes = 0;
    } else if (in_frozen_tie[static_cast<std::size_t>(k)]) {
      std::int64_t tied = 0;
      for (const TiedTensor& t : profile.tied) {
        if (!t.trained && std::find(t.layers.begin(), t.layers.end(), k) != t.layers.end())
          tied += t.bytes;
      }
      l.trainable_param_bytes = l.param_bytes - tied;
    }
  }
  if (rng() % 2 == 0 && stem < layers) {
    const int k = stem + static_cast<int>(rng() % static_cast<unsigned>(layers - stem));
    LayerProfile& l = profile.layers[static_cast<std::size_t>(k)];
    bool holds_trained_tie = false;
    for (const TiedTensor& t : profile.tied) {
      holds_trained_tie =
          holds_trained_tie ||
          (t.trained && std::find(t.layers.begin(), t.layers.end(), k) != t.layers.end());
    }
    if (!holds_trained_tie) l.trainable_param_bytes = l.trained_bytes() / 2;
  }
}

}  // namespace pipetune::testing
