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
//     stage's kept activations less the output's storage (SizeCosts::kept_bytes_within), and,
//     on a stage whose input comes from another memory (the stage before it on another device,
//     not a share of the same GPU), that input: a buffer of its own, the output of the layer
//     before the stage at the pair's size, there from before its forward until its B or W ends,
//   + for every pair whose I has ended and whose W has not (zero bubble): the output gradients
//     I keeps for W (input_backward.kept_for_weights: of the stage's layers with parameters but
//     its last),
//   + for every stage whose first B or W has ended: its parameter gradients,
//   − for every B and W that has ended: the largest output of a view layer (a backward frees
//     the stage output's size even when the last layer made no storage of its own; 0 for
//     models without views, see stage_peak_bound()).
// Checkpointed forwards (their inputs too), received gradients, copies and transients are left
// out: only what is certain counts. Each term but the input is a sum over layers that only grows
// as a stage grows, and the input depends on where the stage starts alone; so with some stages
// placed and the others counted as empty the bound holds for every completion, and a stage
// placed without its input (place()'s `with_input`) bounds every stage that starts earlier.
#include <cstdint>
#include <map>
#include <vector>

#include "sim/cost_model.hpp"
#include "sim/hardware.hpp"
#include "sim/plan.hpp"

namespace pipetune {

struct Schedule;

/// Functions of a balance that are linear in each stage's work per class of layers: function i
/// is  constant[i] + sum over classes k and stages s of slope[i][k * stages + s] x w_k(s),
/// w_k(s) the work of stage s's layers of class k. The planner's multi-stage relaxed root bounds
/// the iteration time of every balance by such rows (docs/planner.md), so that may_fit() can ask
/// whether a balance fits the caps and could also be fast enough.
struct StageWorkRows {
  std::vector<int> layer_class;    // per layer, in [0, classes)
  std::vector<double> layer_work;  // per layer
  int classes = 1;
  std::vector<double> constant;
  std::vector<std::vector<double>> slope;
  /// Every row's value for a whole balance.
  std::vector<double> values(const std::vector<int>& balance) const;
  /// [class][b]: the work of that class's layers before layer end b, so that a stage [a, b)
  /// holds prefix[k][b] - prefix[k][a] of class k.
  std::vector<std::vector<double>> class_prefix() const;
};

class MultiStagePeakBound {
 public:
  /// The plan shape without its balance: `devices` programmes of `stages_per_device` stages,
  /// micro-batches of `sizes` (tensor.chunk's split), torch's stage-to-programme mapping.
  /// `own_input`, per stage (stage_inputs_own()): its input is a buffer of its own; empty, the
  /// inputs are left out.
  MultiStagePeakBound(const CostModel& costs, const std::vector<std::int64_t>& sizes,
                      ScheduleKind kind, CheckpointMode checkpoint, int devices,
                      int stages_per_device, double optimizer_state_factor,
                      std::vector<char> own_input = {});

  /// Stage t holds layers [a, b); returns the bound of its device with what is placed so far.
  /// Without its input (`with_input` false) a stage's terms only grow as it starts earlier or
  /// ends later, which a walk over the stages after a prefix needs.
  std::int64_t place(int t, int a, int b, bool with_input = true);
  /// Stage t holds nothing again.
  void unplace(int t);
  /// Every stage holds nothing again.
  void unplace_all();
  /// The device that runs stage t.
  int device_of(int t) const { return rank_[t]; }
  /// Stages of the plan shape (devices x stages per device).
  int stages() const { return static_cast<int>(rank_.size()); }
  /// Every device's bound for a whole balance (the placed stages are cleared afterwards).
  std::vector<std::int64_t> of(const std::vector<int>& balance);
  /// Per device, its level right after each of its moments (the non-dominated states of its
  /// programme) for a whole balance: what may_fit() relaxes. The device's bound is the largest,
  /// or its parameters alone where that is larger (the state before its first action).
  std::vector<std::vector<std::int64_t>> moment_levels(const std::vector<int>& balance);
  /// False only when no balance can fit every device within `caps` (per device, 0: no cap):
  /// a Lagrangian relaxation of the devices' levels at their moments over every balance, its
  /// best multipliers found by cutting planes (see the definition). True says nothing. Leaves
  /// no stage placed.
  bool may_fit(const std::vector<std::int64_t>& caps);
  /// The same relaxation over the levels and `rows` together: false only when every balance
  /// that fits `caps` has some row above `limit` (with rows that bound the iteration time, no
  /// fitting balance is faster than `limit`). The caps narrow where the layers may go, which
  /// the rows alone, priced on continuous shares, do not see. Throws std::invalid_argument
  /// when the rows are not of this bound's layers and stages.
  bool may_fit(const std::vector<std::int64_t>& caps, const StageWorkRows& rows, double limit);
  /// Cells of the min-sum partitions run so far (stages x layers each), for a caller's budget.
  std::uint64_t partition_cells() const { return partition_cells_; }
  /// Tableau cells of may_fit()'s master programmes' pivots so far, for a caller's budget.
  std::uint64_t pivot_cells() const { return pivot_cells_; }
  /// (Moment, stage) terms that place() and the other bounds of a device have summed so far.
  std::uint64_t level_cells() const { return level_cells_; }

 private:
  // A moment of one device's programme: per local stage, the kept forwards of each size slot
  // in flight, of those the ones between their I and W, and whether its parameter gradients
  // exist, and a constant (the views' slack).
  struct Moment {
    std::vector<int> kept[2];
    std::vector<int> waiting[2];  // pairs between their I and their W
    std::vector<char> gradients;
    std::int64_t constant = 0;
  };
  std::map<std::vector<int>, std::int64_t> device_states(
      const Schedule& schedule, int r, int v, const std::vector<std::int64_t>& sizes) const;
  void collect_moments(const std::vector<std::int64_t>& sizes, ScheduleKind kind,
                       CheckpointMode checkpoint);
  // What device r holds in every state of its programme: library workspaces, the batch on stage
  // 0's device, its stages' parameters and optimizer state (as placed).
  std::int64_t baseline(int r) const;
  std::int64_t device_bound(int r) const;
  std::int64_t moment_level(const Moment& x, int r) const;  // its stages' terms, as placed
  // A capped device's moment: a coordinate of may_fit()'s master programme.
  struct Coordinate {
    int device;
    int moment;
  };
  std::vector<double> relative_levels(const std::vector<Coordinate>& at,
                                      const std::vector<std::int64_t>& caps,
                                      const std::vector<int>& balance);
  bool may_fit(const std::vector<std::int64_t>& caps, const StageWorkRows* rows, double limit);
  struct Relaxation;
  bool master_may_fit(Relaxation& relaxation, const std::vector<double>& equal,
                      std::vector<double>& y);
  bool solve_master(const std::vector<std::vector<double>>& cuts, std::vector<char>& active,
                    std::vector<double>& mixed, std::vector<double>& weight_of,
                    std::vector<std::size_t>& coordinate_of);
  // An average of a device's moments.
  struct Blend {
    std::vector<double> kept[2], waiting[2], gradients;
    double constant = 0.0;
  };
  struct Prefixes {
    std::vector<double> kept[2], kept_before[2], held, trained;  // held: CostModel::held_bytes
    // Per layer end b: the last layer before it that makes storage (-1: none) and that
    // storage's bytes, which kept_before takes off.
    std::vector<int> maker;
    std::vector<double> stored[2];
    // The gradients I keeps for W: prefix sums, and the same less the last layer's.
    std::vector<double> waiting[2], waiting_before[2];
  };
  Prefixes layer_prefixes() const;
  // Weighted rows (StageWorkRows) in the partition: per stage and class the slope on the prefix
  // of that class's work, and their constants.
  struct WorkTerms {
    std::vector<std::vector<double>> prefix;  // [class][layer end]
    std::vector<double> slope;                // [class * stages + stage]
    double constant = 0.0;
  };
  // The least over balances of the devices' levels at `at`, weighted, with the parameters and
  // fixed terms, plus `work`'s weighted rows where given; `balance` gets a balance that reaches
  // it.
  double weighted_fixed(const std::vector<double>& weight, const std::vector<Blend>& at) const;
  double least_weighted(const Prefixes& prefixes, const std::vector<double>& weight,
                        const std::vector<Blend>& at, const WorkTerms* work,
                        std::vector<int>* balance) const;
  void place_all(const std::vector<int>& balance);

  const CostModel& costs_;
  const SizeCosts* size_[2];
  int stages_per_device_;
  double optimizer_state_factor_;
  std::int64_t view_slack_ = 0;               // per backward
  std::vector<int> rank_;                     // per stage: its device
  std::vector<int> local_;                    // per stage: its index among its device's stages
  std::vector<std::vector<int>> stages_of_;   // per device: its stages, by local index
  std::vector<std::vector<Moment>> moments_;  // per device, none dominated by another
  // Per stage as placed: kept bytes and the gradients I keeps for W, per slot, and parameter
  // bytes; 0 while unplaced.
  std::vector<std::int64_t> kept_[2], waiting_[2], held_, trained_;
  // Per stage: its input is a buffer of its own (counted with its kept bytes while
  // count_inputs_; may_fit() turns that off, its partitions price layer sums alone).
  std::vector<char> own_input_;
  bool count_inputs_ = true;
  // Per slot, prefix sums over layers of the output gradient I keeps for a layer's W (its
  // output's size where it has parameters).
  std::vector<std::int64_t> weight_kept_[2];
  std::int64_t weight_kept_last(int slot, int k) const;
  mutable std::uint64_t partition_cells_ = 0;
  std::uint64_t pivot_cells_ = 0;
  mutable std::uint64_t level_cells_ = 0;
};

/// Per stage, whether its input is a buffer of its own, as the simulator has it: the stage before
/// it runs on another memory (another device, and not a share of the same GPU). A checkpointed
/// pair's input on the same memory, which is its own too, is left out. `device_of_stage`: each
/// stage's device in `hardware` (stage_devices()).
std::vector<char> stage_inputs_own(const std::vector<int>& device_of_stage,
                                   const Hardware& hardware);

/// Every device's bound for `plan` (a multi-stage plan that check_plan accepts); with the stages'
/// received inputs where `hardware` says which devices share a memory, without them if null.
std::vector<std::int64_t> multi_stage_peak_bounds(const Profile& profile, const Plan& plan,
                                                  const Hardware* hardware = nullptr);

}  // namespace pipetune
