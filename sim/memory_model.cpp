#include "sim/memory_model.hpp"

#include <algorithm>
#include <vector>

namespace pipetune {

StageMemory stage_memory(const CostModel& model, const SizeCosts& c, int first, int end,
                         bool first_stage) {
  StageMemory m;
  m.input_bytes = c.stage_input_bytes(first);
  m.output_bytes = c.output_bytes[end - 1];

  // Forward with autograd, storage by storage. The current activation lives in `storage`
  // (bytes; 0 for the stage input's, counted elsewhere). Until a layer keeps that storage it is
  // loose: alive while the next layers use it, gone once one makes a storage of its own. A kept
  // storage is released by the backward of the first layer that kept it, except the stage
  // output's, which the executor holds and the simulator frees when the backward ends.
  const bool last_stage = end == static_cast<int>(c.output_bytes.size());
  std::vector<std::int64_t> released(static_cast<std::size_t>(end - first), 0);
  std::int64_t kept = 0, storage = 0, peak = 0;
  int kept_by = -1;
  for (int k = first; k < end; ++k) {
    const std::int64_t made = c.aliases[k] ? 0 : c.output_bytes[k];
    const std::int64_t loose = kept_by < 0 ? storage : 0;
    peak = std::max(peak, kept + loose + c.saved_bytes[k] + made + c.workspace_bytes[k]);
    kept += c.saved_bytes[k];
    auto keep = [&] {
      if (kept_by >= 0 || storage == 0) return;
      kept += storage;
      released[k - first] += storage;
      kept_by = k;
    };
    if (c.keeps_input[k]) keep();
    if (!c.aliases[k]) {
      storage = made;
      kept_by = -1;
    }
    if (c.keeps_output[k]) keep();
  }
  if (!last_stage) {
    if (kept_by < 0) {
      kept += storage;
    } else {
      released[kept_by - first] -= storage;
    }
  }
  m.kept_bytes = kept;
  m.forward_transient = peak - kept;

  // Forward without autograd (checkpointed): each intermediate storage dies once the next layer
  // that makes its own has run; only the stage output survives.
  std::int64_t ckpt_peak = 0;
  storage = 0;
  for (int k = first; k < end; ++k) {
    const std::int64_t made = c.aliases[k] ? 0 : c.output_bytes[k];
    ckpt_peak = std::max(ckpt_peak, storage + made + c.workspace_bytes[k]);
    if (!c.aliases[k]) storage = made;
  }
  m.checkpointed_forward_transient = std::max<std::int64_t>(0, ckpt_peak - m.output_bytes);

  // Backward, last layer first. Layer k allocates the gradient of its input and of its
  // parameters plus its workspace. The first time, the parameter gradients become .grad and
  // stay; later, they are added into .grad and freed, a transient of the same size. Afterwards
  // autograd releases k's saved tensors, the storages k was the first to keep (its input, when
  // it keeps it) and the gradient of its output (an intermediate).
  for (bool first_backward : {false, true}) {
    std::int64_t current = 0, backward_peak = 0;
    for (int k = end - 1; k >= first; --k) {
      const std::int64_t input_grad =
          k > first ? c.output_bytes[k - 1] : (first_stage ? 0 : m.input_bytes);
      const std::int64_t param_grad = first_backward ? model.param_bytes_of(k) : 0;
      // Measured when the profile has it (inside the stage, the output and its gradient die
      // early); else every gradient plus the workspace at once.
      std::int64_t peak_above = input_grad + model.param_bytes_of(k) + c.workspace_bytes[k];
      if (!c.backward_peak_bytes.empty()) {
        const bool inside = k < end - 1;
        const auto& measured = first_backward
                                   ? (inside ? c.inner_backward_peak_bytes : c.backward_peak_bytes)
                                   : (inside ? c.inner_backward_accumulate_peak_bytes
                                             : c.backward_accumulate_peak_bytes);
        peak_above = measured[k];
      }
      backward_peak = std::max(backward_peak, current + peak_above);
      current += input_grad + param_grad - c.saved_bytes[k] - released[k - first];
      if (k < end - 1) current -= c.output_bytes[k];
    }
    (first_backward ? m.backward_peak_first : m.backward_peak) = backward_peak;
    (first_backward ? m.backward_net_first : m.backward_net) = current;
  }

  // I: the same walk without parameter gradients and without freeing activations (W frees
  // them); a layer's output gradient stays when the layer has parameters.
  std::int64_t current = 0;
  for (int k = end - 1; k >= first; --k) {
    const std::int64_t input_grad =
        k > first ? c.output_bytes[k - 1] : (first_stage ? 0 : m.input_bytes);
    m.input_backward_peak = std::max(m.input_backward_peak, current + input_grad + c.workspace_bytes[k]);
    current += input_grad;
    if (k < end - 1) {
      if (model.param_bytes_of(k) > 0) {
        m.weight_kept_gradients += c.output_bytes[k];
      } else {
        current -= c.output_bytes[k];
      }
    }
  }
  m.input_backward_net = current;
  return m;
}

}  // namespace pipetune
