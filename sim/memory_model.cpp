#include "sim/memory_model.hpp"

#include <algorithm>

namespace pipetune {

StageMemory stage_memory(const CostModel& model, const SizeCosts& c, int first, int end,
                         bool first_stage) {
  StageMemory m;
  m.input_bytes = c.stage_input_bytes(first);
  m.output_bytes = c.output_bytes[end - 1];

  // Forward with autograd: layer k's saved tensors and output stay until the backward.
  std::int64_t kept = 0, peak = 0;
  for (int k = first; k < end; ++k) {
    peak = std::max(peak, kept + c.saved_bytes[k] + c.output_bytes[k] + c.workspace_bytes[k]);
    kept += c.saved_bytes[k] + c.output_bytes[k];
  }
  // The model's output dies once the loss exists (as in the executor's last stage).
  if (end == static_cast<int>(c.output_bytes.size())) kept -= m.output_bytes;
  m.kept_bytes = kept;
  m.forward_transient = peak - kept;

  // Forward without autograd (checkpointed): each intermediate output dies once the next layer
  // has consumed it; only the stage output survives.
  std::int64_t ckpt_peak = 0;
  for (int k = first; k < end; ++k) {
    const std::int64_t previous = k > first ? c.output_bytes[k - 1] : 0;
    ckpt_peak = std::max(ckpt_peak, previous + c.output_bytes[k] + c.workspace_bytes[k]);
  }
  m.checkpointed_forward_transient = ckpt_peak - m.output_bytes;

  // Backward, last layer first. Layer k allocates the gradient of its input and of its
  // parameters plus its workspace. The first time, the parameter gradients become .grad and
  // stay; later, they are added into .grad and freed, a transient of the same size. Afterwards
  // autograd releases k's saved tensors, its input activation (saved by k) and the gradient of
  // its output, both intermediates.
  for (bool first_backward : {false, true}) {
    std::int64_t current = 0, backward_peak = 0;
    for (int k = end - 1; k >= first; --k) {
      const std::int64_t input_grad =
          k > first ? c.output_bytes[k - 1] : (first_stage ? 0 : m.input_bytes);
      const std::int64_t param_grad = first_backward ? model.param_bytes_of(k) : 0;
      // Measured when the profile has it; else every gradient plus the workspace at once.
      const std::int64_t peak_above =
          c.backward_peak_bytes.empty()
              ? input_grad + model.param_bytes_of(k) + c.workspace_bytes[k]
              : (first_backward ? c.backward_peak_bytes[k] : c.backward_accumulate_peak_bytes[k]);
      backward_peak = std::max(backward_peak, current + peak_above);
      current += input_grad + param_grad - c.saved_bytes[k];
      if (k > first) current -= c.output_bytes[k - 1];
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
