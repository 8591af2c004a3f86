#pragma once

// The schedule IR: one programme that both the simulator and the executor run.
//
// An action is (kind, stage, micro-batch), written as torch.distributed.pipelining 2.11 writes it:
// "2F0" is stage 2's forward of micro-batch 0, "0B1" a whole backward, "0I1" its half w.r.t. the
// stage input and "0W1" its half w.r.t. the stage's weights (zero-bubble schedules), "1R3" a
// recompute (ours: torch checkpoints inside the stage module). Transfers (activation forward,
// gradient backward) are not actions: both consumers derive them from the stage order.
//
// A schedule is a set of programmes (torch's ranks): each runs its actions in order and holds
// one stage (GPipe, 1F1B) or several (the interleaved and V schedules). Programmes that share a
// device are merged into one device programme (device_programs).
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
//
// The multi-stage schedules follow torch.distributed.pipelining 2.11 action for action
// (tests/sim/torch_schedule_test.cpp compares them with torch's own pipeline_order). With D
// programmes of v stages each and M micro-batches:
//  - interleaved 1F1B: stage s on programme s mod D. M is cut into rounds of M / max(1, M / D)
//    micro-batches; a programme runs forwards round by round through its stages in turn (depth
//    first), (v - 1) rounds plus 2 (D - 1 - r) forwards of warm-up, then one forward and one
//    backward, then the remaining backwards, last stage first.
//  - interleaved zero bubble (ZB1P): the same with (v - 1) rounds plus D - 1 - r of warm-up and
//    the backward split in I then W; the W of the k-th I runs once r further Is have run.
//  - ZBV: v = 2, programme r holds stages r and 2D - 1 - r; forwards down the first stage, up
//    the second, each micro-batch's I and W together in the steady state.
//  - looped BFS: every forward of each local stage in turn, then every backward, last stage and
//    last micro-batch first.
//  - DualPipeV: ZBV's V; in the steady state each forward of one stage is followed by a whole
//    backward of the other (torch's OVERLAP_F_B pair, which its runtime runs in that order);
//    the warm-up's and the tail's backwards split in I and W, the Ws queued in I order.
// A checkpointed micro-batch's recompute runs right before its B or I on the same stage.
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sim/plan.hpp"

namespace pipetune {

enum class ActionKind : std::uint8_t {
  Forward,
  Recompute,
  Backward,   ///< the whole backward (B)
  InputGrad,  ///< the backward w.r.t. the stage input (I); keeps what W needs
  WeightGrad  ///< the backward w.r.t. the stage's weights (W), after I
};
inline constexpr ActionKind kAllActionKinds[] = {ActionKind::Forward, ActionKind::Recompute,
                                                 ActionKind::Backward, ActionKind::InputGrad,
                                                 ActionKind::WeightGrad};

struct Action {
  ActionKind kind = ActionKind::Forward;
  int stage = 0;
  int micro_batch = 0;
  bool operator==(const Action&) const = default;
};

char action_letter(ActionKind kind);  ///< 'F', 'R', 'B', 'I', 'W'
std::string to_string(const Action& action);
std::optional<Action> parse_action(std::string_view text);
/// True for B and I: the action that sends the input gradient to the previous stage.
inline bool sends_gradient(ActionKind kind) {
  return kind == ActionKind::Backward || kind == ActionKind::InputGrad;
}

struct Schedule {
  ScheduleKind kind = ScheduleKind::GPipe;
  CheckpointMode checkpoint = CheckpointMode::Never;
  int stages = 0;
  int micro_batches = 0;
  std::vector<int> stage_rank;                 ///< the programme that runs each stage
  std::vector<std::vector<Action>> per_rank;   ///< each programme's actions, in order
  std::vector<std::vector<Action>> per_stage;  ///< each stage's actions, in order (derived)

  int ranks() const { return static_cast<int>(per_rank.size()); }
  bool recomputes(int micro_batch) const {
    return is_checkpointed(checkpoint, micro_batch, micro_batches);
  }
  bool operator==(const Schedule&) const = default;
};

/// The schedule `kind` with `stages` stages, `stages_per_device` per programme. Throws
/// std::invalid_argument for what schedule_refusal refuses.
Schedule make_schedule(ScheduleKind kind, int stages, int micro_batches, CheckpointMode checkpoint,
                       int stages_per_device = 1);

/// The plan's own schedule (its kind, stages, checkpoint mode and stages per device) over a
/// batch of `batch_size` samples, split as the plan's chunks split it.
Schedule schedule_of(const Plan& plan, std::int64_t batch_size);

/// Why torch.distributed.pipelining 2.11 refuses `kind` on `ranks` programmes of
/// `stages_per_device` stages with `micro_batches` micro-batches, or nothing.
std::optional<std::string> schedule_refusal(ScheduleKind kind, int ranks, int stages_per_device,
                                            int micro_batches);

/// A schedule from its programmes (e.g. read from torch's CSV): stages, micro-batches and each
/// stage's programme are inferred; recomputes are whatever the programmes hold. Throws
/// std::invalid_argument naming programme and position for what torch's _validate_schedule
/// refuses: a stage on two programmes, a stage without M forwards, B or I before F, W before I,
/// B and I+W counts that do not make M backwards; and actions repeated.
/// `where(programme, position)` names an action in messages (default "programme r, action k").
Schedule schedule_from_programs(
    std::vector<std::vector<Action>> per_rank,
    const std::function<std::string(std::size_t, std::size_t)>& where = {});

/// torchgpipe's clock_cycles(m, n): for clock k, the (micro_batch, stage) pairs that run.
std::vector<std::vector<std::pair<int, int>>> clock_cycles(int micro_batches, int stages);

/// The programmes merged into one ordered programme per device (stage s on device
/// stage_device[s]; a programme's stages on one device). The merge follows the order in which
/// the actions start when every action takes one unit of time and every programme has its own
/// device; that order respects every dependency, so any mapping of programmes to devices runs
/// without deadlock, and for GPipe it is torchgpipe's clock-cycle order.
std::vector<std::vector<Action>> device_programs(const Schedule& schedule,
                                                 std::span<const int> stage_device, int devices);

/// The same merge with every programme on one device: a valid single-threaded order of the
/// whole schedule. Throws std::logic_error if the programmes deadlock.
std::vector<Action> program_order(const Schedule& schedule);

/// Which (stage, micro-batch) the schedule gives an action of `kind`, at stage * micro_batches +
/// micro-batch (Recompute: its forward keeps only the input; InputGrad: its backward is split).
/// Read from the programmes, so a schedule given from outside (torch's CSV) is taken as written.
std::vector<char> micro_batches_with(const Schedule& schedule, ActionKind kind);

}  // namespace pipetune
