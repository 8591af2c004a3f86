#pragma once
// A lower bound on each device's simulated peak memory under a multi-stage schedule
// (interleaved, looped, V), for a whole balance or for every balance whose first stages are
// given: what lets the planner drop a balance, or a whole prefix of one, that cannot fit a
// memory cap without simulating it.
//
// A device runs its programme in order, so the state of its memory between two of its actions
// does not depend on the balance, only on which of its (stage, micro-batch) pairs have run
// which action. Right after an action ends it holds at least
//   its stages' parameters and optimizer state (plus the batch on stage 0's device, plus the
//   library workspaces),
//   + for every pair forwarded with autograd (or recomputed) whose B or W has not started: the
//     stage's kept activations less the output's storage (SizeCosts::kept_bytes_within),
//   + for every stage whose first B or W has ended: its parameter gradients,
//   − for every B and W that has ended: the largest output of a view layer (a backward frees
//     the stage output's size even when the last layer made no storage of its own; 0 for
//     models without views, see stage_peak_bound()).
// Checkpointed forwards, received tensors, copies and transients are left out: only what is
// certain counts. Each term is a sum over layers that only grows as a stage grows, so with
// some stages placed and the others counted as empty the bound holds for every completion.
#include <cstdint>
#include <vector>

#include "sim/cost_model.hpp"
#include "sim/plan.hpp"

namespace pipetune {

class MultiStagePeakBound {
 public:
  /// The plan shape without its balance: `devices` programmes of `stages_per_device` stages,
  /// micro-batches of `sizes` (tensor.chunk's split), torch's stage-to-programme mapping.
  MultiStagePeakBound(const CostModel& costs, const std::vector<std::int64_t>& sizes,
                      ScheduleKind kind, CheckpointMode checkpoint, int devices,
                      int stages_per_device, double optimizer_state_factor);

  /// Stage t holds layers [a, b); returns the bound of its device with what is placed so far.
  std::int64_t place(int t, int a, int b);
  /// Stage t holds nothing again.
  void unplace(int t);
  /// The device that runs stage t.
  int device_of(int t) const { return rank_[t]; }
  /// Every device's bound for a whole balance (the placed stages are cleared afterwards).
  std::vector<std::int64_t> of(const std::vector<int>& balance);
  /// A lower bound, over every balance, on the sum of the bounds of the devices `counted`
  /// names: what a configuration needs of their memory together. A device's bound is at least
  /// its value at any one moment, so the sum at one moment per device is linear in each
  /// stage's layers and its least over balances is a min-sum partition (O(stages x layers)).
  /// Two choices of moments are tried: each device's fullest with stages of average size, and
  /// its last (every gradient made).
  double least_total(const std::vector<bool>& counted) const;

 private:
  // A moment of one device's programme: per local stage, the kept forwards of each size slot
  // in flight and whether its parameter gradients exist, and a constant (the views' slack).
  struct Moment {
    std::vector<int> kept[2];
    std::vector<char> gradients;
    std::int64_t constant = 0;
  };
  void collect_moments(const std::vector<std::int64_t>& sizes, ScheduleKind kind,
                       CheckpointMode checkpoint);
  std::int64_t device_bound(int r) const;
  double least_total_at(const std::vector<const Moment*>& at,
                        const std::vector<bool>& counted) const;

  const CostModel& costs_;
  const SizeCosts* size_[2];
  int stages_per_device_;
  double optimizer_state_factor_;
  std::int64_t view_slack_ = 0;               // per backward
  std::vector<int> rank_;                     // per stage: its device
  std::vector<int> local_;                    // per stage: its index among its device's stages
  std::vector<std::vector<int>> stages_of_;   // per device: its stages, by local index
  std::vector<std::vector<Moment>> moments_;  // per device, none dominated by another
  // Per stage as placed: kept bytes per slot and parameter bytes; 0 while unplaced.
  std::vector<std::int64_t> kept_[2], params_;
};

/// Every device's bound for `plan` (a multi-stage plan that check_plan accepts).
std::vector<std::int64_t> multi_stage_peak_bounds(const Profile& profile, const Plan& plan);

}  // namespace pipetune
