#pragma once

// A plan's iteration time without the event engine, for the planner's leaves.
//
// With one stage per device, every resource (a device's stream, one direction of a link) runs
// its tasks in an order fixed by the schedule alone, so the simulated times are a longest path
// that one sweep in a static topological order (program_order) computes: each task starts when
// the task before it on its resource and its inputs have finished. That is what the event
// engine computes too, with the same additions in the same order, so the two agree exactly;
// the sweep only skips the event queue and the memory counters (a few µs instead of ~100 µs
// for 16 stages × 64 micro-batches).

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "sim/cost_model.hpp"
#include "sim/hardware.hpp"
#include "sim/plan.hpp"

namespace pipetune {

/// One stage's task durations, per micro-batch size: [0] the common size, [1] the last
/// micro-batch's (tensor.chunk's remainder; equal to [0] when there is none).
struct StageDurations {
  std::array<double, 2> forward{};         ///< with autograd (also a recompute)
  std::array<double, 2> forward_nograd{};  ///< a checkpointed micro-batch's forward
  std::array<double, 2> backward{};
  std::array<double, 2> activation_copy{};  ///< to the next stage (unused on the last)
  std::array<double, 2> gradient_copy{};    ///< to the previous stage (unused on the first)
  /// The gradient back over the next stage's link (unused on the last): as activation_copy,
  /// or a copy of no bytes where that boundary lies in a frozen stem.
  std::array<double, 2> output_gradient_copy{};
  /// Whether the host paces the device (the simulator's two clocks), with the host's time to
  /// launch each task (forward, forward without autograd, backward); all 0 otherwise.
  bool launch_paced = false;
  std::array<double, 2> forward_launch{}, forward_nograd_launch{}, backward_launch{};
};

/// Durations of stage j = layers [first, end) on a device of `speed`, as the simulator computes
/// them: sums of the profile's costs divided by the speed plus the per-task overhead; copies
/// over the links to the neighbouring stages; where the profile has launch times, the host's
/// launch times plus the overhead. `with_launches` false: no launch times, which the planner's
/// bounds take (launches only delay tasks).
StageDurations stage_durations(const SizeCosts& common, const SizeCosts& last, int first, int end,
                               double speed, double overhead_ms, const Link* next_link,
                               const Link* previous_link, bool with_launches = true);

/// How the stages after a prefix pace a 1F1B pipeline's round trips through them. A stage's
/// backward of micro-batch i comes after its backward of i - 1, so a gradient comes back no
/// earlier than the previous one of its size plus what any one of those stages runs between the
/// two backwards (the backwards and copies from there back to the prefix take as long for both):
/// - the last stage runs each micro-batch's forward, recompute (if any) and backward in turn;
/// - in its steady phase a stage runs a forward between two backwards: `steady` holds, per group
///   of later stages, the least work of its busiest stage (forward, recompute, backward of a
///   full-size micro-batch) and the last micro-batch i whose gap it paces in every stage of it.
struct SteadyPace {
  double work = 0.0;
  int until = 0;
};
struct DownstreamPacing {
  std::array<double, 2> last_work{};             ///< forward and backward, per size slot
  std::array<double, 2> last_work_recomputed{};  ///< forward without autograd, recompute, backward
  std::span<const SteadyPace> steady;
};

/// The sweep for one (schedule, checkpoint mode, stages, micro-batches) shape; reuse it for
/// every balance of that shape. Not thread-safe (keeps its scratch arrays).
class IterationSweep {
 public:
  IterationSweep(ScheduleKind schedule, CheckpointMode checkpoint, int stages, int micro_batches,
                 bool last_differs);
  ~IterationSweep();
  IterationSweep(IterationSweep&&) noexcept;
  IterationSweep& operator=(IterationSweep&&) noexcept;

  /// The simulated iteration time (makespan) of a plan whose stage j takes stages[j]. Where the
  /// stages have launch times, each stage's host runs as a second clock, as in the simulator: a
  /// task's launch starts once the host launched the stage's task before it and the task's
  /// input was launched; the task runs on the device no earlier than its launch starts and ends
  /// no earlier than its launch ends.
  double run(std::span<const StageDurations> stages) const;
  /// A lower bound on run() for every plan whose stages 0..last are stages[0..last]: the same
  /// sweep over those stages alone, with stage `last`'s backward of a micro-batch waiting only
  /// for that micro-batch's round trip through the later stages, at least `trip_last` (the last
  /// micro-batch) or `trip_full` (any other) after its forward there. Leaving out
  /// the later stages' tasks only removes constraints, so the times can only be earlier. With
  /// last = K - 1 (trips 0) it equals run().
  /// `pacing` (1F1B only): besides its own trip, a micro-batch's gradient waits for the later
  /// stages' work on the ones before it (see DownstreamPacing).
  double run_prefix(std::span<const StageDurations> stages, int last, double trip_full,
                    double trip_last, const DownstreamPacing* pacing = nullptr) const;
  /// What a longest path of run() is made of: how many of each kind of task per stage and of
  /// copies per link it holds. Its length, with each task at its duration, is run()'s value;
  /// the planner's relaxed root (docs/planner.md) bounds every plan by such paths.
  struct PathCounts {
    /// [stage][kind * 2 + slot], kind 0 forward (with autograd), 1 forward without, 2 recompute,
    /// 3 backward; slot as in StageDurations.
    std::vector<std::array<int, 8>> tasks;
    /// [link after stage j][direction * 2 + slot], direction 0 activation, 1 gradient.
    std::vector<std::array<int, 4>> copies;
  };
  /// Launch times are left out here: the path is the device's.
  double run_critical_path(std::span<const StageDurations> stages, PathCounts& path) const;
  /// Tasks (compute and copies) one run() covers.
  std::size_t task_count() const { return task_count_; }
  /// Compute tasks one run_prefix(…, last, …) covers.
  std::size_t prefix_task_count(int last) const {
    return last + 1 == stages_ ? order_.size() : prefix_order_[last].size();
  }

 private:
  struct Step {
    std::uint8_t kind;  // 0 forward, 1 recompute, 2 backward
    std::uint8_t slot;  // size slot
    std::uint8_t nograd;
    int stage;
    int micro_batch;
  };
  std::vector<Step> order_;
  template <typename Tracker, bool kLaunchPaced>
  double sweep(const std::vector<Step>& order, std::span<const StageDurations> stages,
               int last_stage, double trip_full, double trip_last, const DownstreamPacing* pacing,
               Tracker& tracker) const;
  template <bool kLaunchPaced>
  void reset_clocks(const DownstreamPacing* pacing) const;
  template <bool kLaunchPaced>
  double run_on_stage(int s, double ready, double launched, double duration, double launch) const;
  // The last stage's pacing chain: its time and the size slot it carries.
  struct LastChain {
    double time = 0.0;
    int slot = -1;
  };
  double paced_way_back(const Step& step, double own, const DownstreamPacing& pacing,
                        LastChain& last) const;
  struct NoTracker;
  struct PathTracker;
  mutable std::unique_ptr<PathTracker> path_tracker_;  // run_critical_path()'s, reused
  std::vector<std::vector<Step>> prefix_order_;  // [last]: order_ restricted to stages 0..last
  int stages_, micro_batches_;
  std::size_t task_count_ = 0;
  mutable std::vector<double> steady_chain_;                 // per SteadyPace of a prefix's pacing
  mutable std::vector<double> activation_at_, gradient_at_;  // [stage * M + i]: input arrived
  mutable std::vector<double> stage_free_, activation_channel_free_, gradient_channel_free_;
  // The host's clock, where launches pace the device: per cell, the input's launch ended; per
  // stage, the host's last launch ended.
  mutable std::vector<double> activation_launched_, gradient_launched_, host_free_;
};

}  // namespace pipetune
