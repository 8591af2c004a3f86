#include "sim/balance.hpp"

#include <algorithm>

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
      prefix[l + 1] +=
          c.forward_ms[l] + c.backward_ms[l] + (checkpointed ? c.forward_nograd_ms[l] : 0.0);
    }
  }
  for (int l = 0; l < costs.layer_count(); ++l) prefix[l + 1] += prefix[l];

  std::vector<double> speed(stages, 1.0);
  for (int s = 0; s < stages; ++s) {
    const int device = shape.devices.empty()
                           ? stage_rank(shape.schedule, s, stages, shape.stages_per_device)
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
  // Micro-batches alike (tensor.chunk makes at most two sizes) counted once, with their number,
  // in the order they come, so that the sum's order does not depend on addresses.
  struct Alike {
    const SizeCosts* costs;
    bool checkpointed;
    int count;
  };
  std::vector<Alike> alike;
  for (int i = 0; i < micro_batches; ++i) {
    const SizeCosts* c = &costs.at(sizes[i]);
    const bool checkpointed = is_checkpointed(shape.checkpoint, i, micro_batches);
    auto it = std::find_if(alike.begin(), alike.end(), [&](const Alike& a) {
      return a.costs == c && a.checkpointed == checkpointed;
    });
    if (it == alike.end()) {
      alike.push_back({c, checkpointed, 1});
    } else {
      ++it->count;
    }
  }
  const Partition best =
      min_max_partition(costs.layer_count(), stages, [&](int stage, int begin, int end) {
        double ms = 0.0;
        for (const auto& [c, checkpointed, count] : alike) {
          ms +=
              count * (c->forward_task_ms(begin, end, speed[stage]) +
                       c->backward_task_ms(begin, end, speed[stage]) +
                       (checkpointed ? c->forward_nograd_task_ms(begin, end, speed[stage]) : 0.0));
        }
        return ms;
      });
  return best.sizes;
}

}  // namespace pipetune
