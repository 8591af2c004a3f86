#pragma once

// Which CUDA graphs a schedule needs when each stage's actions run as captured graphs, and which
// static buffers each graph reads and writes. Torch-free bookkeeping: the GPU half captures and
// replays what this plans (graph_runtime.hpp), and the tests check it with a fake and no GPU.
//
// After warm-up the executor captures each stage's F, R, B, I and W once per micro-batch size
// and replays the graphs in the schedule's order; the copies between stages stay outside the
// graphs. A graph reads and writes fixed addresses: its static input and output buffers, and
// the activations a forward saves for its backward, which live in the stage's memory pool
// until that backward has run. So every micro-batch in flight on a stage (from its F to its
// last backward action: its B, or its W where the backward is split into I and W) needs its own
// set of graphs and buffers: a slot. Its R, B, I and W replay the graphs of the slot its F took
// (an R also reads the input F's copy left in the slot: a checkpointed forward keeps only that).
//
// Slots are assigned as intervals are coloured: walking the stage's actions in order
// (Schedule::per_stage), a micro-batch takes the lowest free slot at its F and frees it after
// its last backward action. Taken in order of their start, intervals coloured this way use as
// many colours as the most that overlap, so a stage has as many slots as it has micro-batches
// in flight at its busiest: the fewest that work.
//
// 1F1B with K = 3 stages and M = 4 micro-batches (stage s runs min(M, K - s) forwards, then
// one backward per forward): the slot each micro-batch takes, and each stage's slots.
//
//   stage   actions in order            micro-batch 0  1  2  3   slots (min(M, K - s))
//   0       F0 F1 F2 B0 F3 B1 B2 B3                 0  1  2  0   3
//   1       F0 F1 B0 F2 B1 F3 B2 B3                 0  1  0  1   2
//   2       F0 B0 F1 B1 F2 B2 F3 B3                 0  0  0  0   1
//
// On stage 0, F3 runs once B0 has freed slot 0; on stage 2 one micro-batch is in flight at a
// time. A checkpointed micro-batch's R (right before its B) changes nothing: it lies inside the
// interval. GPipe runs every forward before any backward, so micro-batch m takes slot m and
// every stage has M slots.
//
// A graph also has fixed shapes (hence one per micro-batch size: tensor.chunk makes the last
// micro-batch smaller) and fixed code: a checkpointed micro-batch's F runs without autograd and
// its backward reads what R saved, a split one's forward keeps every layer's output for W
// (executor/stage_backward.hpp). The key says which.

#include <compare>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sim/schedule.hpp"

namespace pipetune::exec {

/// One captured graph.
struct GraphKey {
  int stage = 0;
  ActionKind kind = ActionKind::Forward;
  std::int64_t size = 0;    ///< the micro-batch's samples
  int slot = 0;             ///< the slot its F took on `stage`
  bool recomputed = false;  ///< the micro-batch is checkpointed on `stage` (it has an R)
  bool split = false;       ///< its backward is split in I and W on `stage`
  auto operator<=>(const GraphKey&) const = default;
};
std::string to_string(const GraphKey& key);  ///< "stage 1 F size 3 slot 0 recomputed"

/// What a static buffer holds: an F reads the stage input x and writes its output y (the loss
/// on the last stage); an R reads x again; a B or I reads the output gradient dy and writes the
/// input gradient dx; a W only reads what its I kept in the pool.
enum class BufferRole : std::uint8_t { Input, Output, OutputGrad, InputGrad };

/// One static buffer: per (stage, slot, micro-batch size), one of each role a graph uses.
struct StaticBuffer {
  int stage = 0;
  int slot = 0;
  std::int64_t size = 0;
  BufferRole role = BufferRole::Input;
  auto operator<=>(const StaticBuffer&) const = default;
};

/// The buffers a graph reads and writes: ids into GraphPlan::buffers, -1 for none.
struct GraphBuffers {
  int input = -1;
  int output = -1;
  bool operator==(const GraphBuffers&) const = default;
};

struct GraphPlan {
  std::vector<std::int64_t> micro_batch_sizes;
  /// [stage][micro-batch]: the slot its F took there.
  std::vector<std::vector<int>> slot;
  /// [stage][micro-batch]: has an R there (checkpointed) / an I there (split backward).
  std::vector<std::vector<char>> recomputed, split;
  std::vector<int> slots_per_stage;  ///< the most micro-batches in flight at once on the stage
  /// Per stage, its graphs in the order the stage first runs them: the order to capture them
  /// in, so the stage's memory pool fills in the order the schedule uses it. Each key once.
  std::vector<std::vector<GraphKey>> captures;
  std::vector<StaticBuffer> buffers;  ///< by id: sorted, one per (stage, slot, size, role) used

  /// The graph that runs `action`. Throws std::out_of_range for an action outside the plan.
  GraphKey key_of(const Action& action) const;
  /// The static buffers `key`'s graph reads and writes.
  GraphBuffers buffers_of(const GraphKey& key) const;
  /// The id of `buffer`, or -1.
  int buffer_id(const StaticBuffer& buffer) const;
  /// Where `key` is in captures[key.stage], or -1.
  int capture_index(const GraphKey& key) const;
};

/// The graphs and buffers of `schedule` with micro-batch m of micro_batch_sizes[m] samples
/// (split_batch's sizes). Throws std::invalid_argument when the sizes are not one per
/// micro-batch, or a stage runs a micro-batch's F twice or another action before its F.
GraphPlan plan_graphs(const Schedule& schedule, std::span<const std::int64_t> micro_batch_sizes);

}  // namespace pipetune::exec
