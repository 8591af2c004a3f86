#pragma once

// The schedule IR: one programme that both the simulator and the executor run.
//
// An action is (kind, stage, micro-batch), written as torch.distributed.pipelining writes it:
// "2F0" is stage 2's forward of micro-batch 0, "1R3" a recompute, "0B1" a backward. Transfers
// (activation forward, gradient backward) are not actions: both consumers derive them from the
// stage order. Each stage runs its actions in order; stages that share a device are merged into
// one device programme (device_programs).
//
// GPipe fill-drain with K = 3 stages and M = 4 micro-batches, torchgpipe's clock cycles
// (micro-batch i of stage j runs at clock i + j):
//
//   clock    0    1    2    3    4    5
//   stage 0  0F0  0F1  0F2  0F3
//   stage 1       1F0  1F1  1F2  1F3
//   stage 2            2F0  2F1  2F2  2F3
//
// then every backward in reverse micro-batch order (2B3 2B2 … on stage 2, and so on up),
// each checkpointed micro-batch's recompute right before its backward.
//
// 1F1B (PipeDream-flush, as torch.distributed.pipelining's Schedule1F1B): stage s first runs
// min(M, K - s) forwards, then alternates one backward and one forward, then drains the
// backwards, so stage s never holds more than K - s micro-batches of activations.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sim/plan.hpp"

namespace pipetune {

enum class ActionKind : std::uint8_t { Forward, Recompute, Backward };

struct Action {
  ActionKind kind = ActionKind::Forward;
  int stage = 0;
  int micro_batch = 0;
  bool operator==(const Action&) const = default;
};

char action_letter(ActionKind kind);  ///< 'F', 'R', 'B'
std::string to_string(const Action& action);
std::optional<Action> parse_action(std::string_view text);

struct Schedule {
  ScheduleKind kind = ScheduleKind::GPipe;
  CheckpointMode checkpoint = CheckpointMode::Never;
  int stages = 0;
  int micro_batches = 0;
  std::vector<std::vector<Action>> per_stage;  ///< each stage's actions, in order

  bool recomputes(int micro_batch) const {
    return is_checkpointed(checkpoint, micro_batch, micro_batches);
  }
};

Schedule make_schedule(ScheduleKind kind, int stages, int micro_batches, CheckpointMode checkpoint);

/// torchgpipe's clock_cycles(m, n): for clock k, the (micro_batch, stage) pairs that run.
std::vector<std::vector<std::pair<int, int>>> clock_cycles(int micro_batches, int stages);

/// The stages' actions merged into one ordered programme per device (stage s on device
/// stage_device[s]). The merge follows the order in which the actions start when every action
/// takes one unit of time and every stage has its own device; that order respects every
/// dependency, so any mapping of stages to devices runs without deadlock, and for GPipe it is
/// torchgpipe's clock-cycle order.
std::vector<std::vector<Action>> device_programs(const Schedule& schedule,
                                                 std::span<const int> stage_device,
                                                 int devices);

/// The same merge with every stage on one device: a valid single-threaded order of the whole
/// schedule.
std::vector<Action> program_order(const Schedule& schedule);

}  // namespace pipetune
