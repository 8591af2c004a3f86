#include "sim/balance.hpp"

#include "sim/partition.hpp"

namespace pipetune {

std::vector<int> time_balanced(const CostModel& costs, const Hardware& hardware, int stages,
                               const Plan& shape) {
  const auto sizes = split_batch(costs.profile().batch_size, shape.chunks);
  const int micro_batches = static_cast<int>(sizes.size());
  // Per-iteration work of a layer: every micro-batch's forward and backward, plus, for each
  // recomputed micro-batch, its forward without autograd.
  std::vector<double> prefix(costs.layer_count() + 1, 0.0);
  for (int i = 0; i < micro_batches; ++i) {
    const SizeCosts& c = costs.at(sizes[i]);
    const bool checkpointed = is_checkpointed(shape.checkpoint, i, micro_batches);
    for (int l = 0; l < costs.layer_count(); ++l) {
      prefix[l + 1] += c.forward_ms[l] + c.backward_ms[l] + (checkpointed ? c.forward_nograd_ms[l] : 0.0);
    }
  }
  for (int l = 0; l < costs.layer_count(); ++l) prefix[l + 1] += prefix[l];

  std::vector<double> speed(stages, 1.0);
  for (int s = 0; s < stages; ++s) {
    const int device =
        shape.devices.empty() ? stage_rank(shape.schedule, s, stages, shape.stages_per_device)
                              : hardware.device_index(shape.devices[static_cast<std::size_t>(s)]);
    if (device >= 0 && device < static_cast<int>(hardware.devices.size())) {
      speed[s] = hardware.devices[device].speed;
    }
  }
  const Partition best = min_max_partition(
      costs.layer_count(), stages,
      [&](int stage, int begin, int end) { return (prefix[end] - prefix[begin]) / speed[stage]; });
  return best.sizes;
}

}  // namespace pipetune
