#include "sim/balance.hpp"

#include <utility>

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
  if (!costs.profile().has_launch_times()) {
    const Partition best =
        min_max_partition(costs.layer_count(), stages, [&](int stage, int begin, int end) {
          return (prefix[end] - prefix[begin]) / speed[stage];
        });
    return best.sizes;
  }
  // Launch times: a stage's tasks take the larger of its device and launch sums, which is not a
  // sum over layers, but still grows with the stage at either end, as the partition needs.
  std::vector<std::pair<const SizeCosts*, bool>> tasks;  // per micro-batch: costs, checkpointed
  for (int i = 0; i < micro_batches; ++i) {
    tasks.emplace_back(&costs.at(sizes[i]), is_checkpointed(shape.checkpoint, i, micro_batches));
  }
  const Partition best =
      min_max_partition(costs.layer_count(), stages, [&](int stage, int begin, int end) {
        double ms = 0.0;
        for (const auto& [c, checkpointed] : tasks) {
          ms += c->forward_task_ms(begin, end, speed[stage]) +
                c->backward_task_ms(begin, end, speed[stage]) +
                (checkpointed ? c->forward_nograd_task_ms(begin, end, speed[stage]) : 0.0);
        }
        return ms;
      });
  return best.sizes;
}

}  // namespace pipetune
