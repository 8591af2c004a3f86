#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "sim/cost_model.hpp"
#include "sim/plan.hpp"

namespace pipetune {

/// An I walk's levels above I's start (StageMemory::input_backward, torch_input): its peak, what
/// it leaves (net), and two steps down from the peak as backward_after_peak and
/// backward_after_layer are, at fractions of I's time.
struct InputBackwardMemory {
  std::int64_t peak = 0, net = 0, after_peak = 0, after_layer = 0;
  double peak_end = 1.0, layer_end = 1.0;
  std::int64_t kept_for_weights = 0;  ///< of net, what W frees
  std::int64_t freed_saved = 0;       ///< of the forward's kept bytes, what dies as I ends
};

/// A W walk's levels above W's start (StageMemory::weight_backward, torch_weight): its peak and
/// two steps down, as InputBackwardMemory's.
struct WeightBackwardMemory {
  std::int64_t peak = 0, after_peak = 0, after_layer = 0;
  double peak_end = 1.0, layer_end = 1.0;
};

/// What one micro-batch of one stage (layers [first, end)) allocates and frees, from walking its
/// layers in order (docs/memory-model.md derives every term). Bytes; "transient" is allocated
/// when a task starts and freed when it ends; every value is ≥ 0 unless said otherwise.
struct StageMemory {
  std::int64_t input_bytes = 0;   ///< stage input: received activation, gradient sent back
  std::int64_t output_bytes = 0;  ///< stage output: activation sent on, gradient received
  /// The gradients sent back and received: input_bytes and output_bytes, or 0 where no layer
  /// before the input (the output) trains, so autograd makes none (a frozen stem's stages).
  std::int64_t input_gradient_bytes = 0;
  std::int64_t output_gradient_bytes = 0;
  /// Kept after a forward with autograd: Σ saved + Σ outputs, the stage output included except
  /// on the last stage, where the model output dies once the loss exists.
  std::int64_t kept_bytes = 0;
  /// Peak above kept_bytes while a forward or recompute with autograd runs.
  std::int64_t forward_transient = 0;
  /// The stage's buffers (LayerProfile::buffer_bytes), copied for the length of a recompute to
  /// be put back after it (batch norm counts each micro-batch once).
  std::int64_t buffer_bytes = 0;
  /// The same for a micro-batch whose backward is split (I, then W): the executor also holds the
  /// output of every layer with parameters that train until W ends. StageMemoryTerms::All only.
  std::int64_t split_kept_bytes = 0;
  std::int64_t split_forward_transient = 0;
  /// Peak above the stage output while a checkpointed forward (no autograd) runs.
  std::int64_t checkpointed_forward_transient = 0;
  /// Peak above the memory at the start of a backward; "first" when it also allocates the
  /// parameter gradients (the stage's first backward of the iteration).
  std::int64_t backward_peak = 0;
  std::int64_t backward_peak_first = 0;
  /// Net change over a backward's layer walk (may be negative): + input gradient − saved bytes −
  /// intermediate outputs; "first" adds the parameter gradients. The stage output and the
  /// received gradient are freed by the simulator at the end of the backward, not counted here.
  std::int64_t backward_net = 0;
  std::int64_t backward_net_first = 0;
  /// Once the walk's peak layer is done with its peak (at `*_peak_end`, a fraction of the walk's
  /// time by its layers' backward times), the level above the start never again exceeds
  /// `*_after_peak` (at least the net): what arrives after that stacks on it, not on the peak.
  /// Once that layer has ended (at `*_layer_end`), never `*_after_layer` (≤ after_peak; both
  /// steps are one where the profile does not record when a layer is done with its peak).
  std::int64_t backward_after_peak = 0;
  std::int64_t backward_after_peak_first = 0;
  double backward_peak_end = 1.0;
  double backward_peak_end_first = 1.0;
  std::int64_t backward_after_layer = 0;
  std::int64_t backward_after_layer_first = 0;
  double backward_layer_end = 1.0;
  double backward_layer_end_first = 1.0;
  /// The backward split (I then W). I walks the layers for input gradients only, with the graph
  /// kept: it frees no activation, and of the gradients of the layers' outputs it keeps those
  /// of layers with parameters, which their weight gradients read. Peak above I's start, and
  /// what I leaves (the stage's input gradient and, kept_for_weights, the gradients kept for W).
  InputBackwardMemory input_backward;
  /// I as torch.distributed.pipelining runs it (`stage_backward_input`): the graph kept, and a
  /// gradient kept for W per operation with weights (LayerProfile::torch_weight_gradient_bytes),
  /// where the executor keeps one per layer. input_backward where the profile has no count.
  InputBackwardMemory torch_input;
  /// W as torch runs it (`stage_backward_weight`: one operation's weight gradients at a time),
  /// from each layer's W measured alone on torch (LayerProfile::torch_weight_peak_bytes). [0] a
  /// later W, [1] the stage's first. weight_backward where the profile has no such record.
  std::array<WeightBackwardMemory, 2> torch_weight{};
  /// W computes each layer's parameter gradients from its own output gradient, one layer at a
  /// time, first layer first. A layer's W allocates its parameter gradients and whatever its
  /// backward makes on the way to them (a ReLU's gradient before the Linear's weights): its
  /// measured backward peak less the input gradient W does not compute, or its parameters when
  /// the profile has no backward peaks. The stage's first W keeps them as `.grad`; later ones
  /// add them into `.grad` and free them. Autograd frees each layer's saved tensors once its W
  /// is done (the graph is not kept), and with them the storages only that layer still kept, so
  /// the level falls as W goes: a walk of levels above W's start like the backward's, tracked as
  /// its peak and two steps down (fractions of W's time by its layers' weight times). What the
  /// walk does not free (the boundaries and gradients the stage keeps for W, the parameterless
  /// layers' saved tensors) goes when W ends. [0] a later W, [1] the stage's first.
  std::array<WeightBackwardMemory, 2> weight_backward{};
};

/// What stage_memory() fills: everything, or what stage_peak_bound() reads (the forward with
/// autograd and both backward walks' levels; the checkpointed forward's transient and the I and
/// W terms stay 0, and the backward walks' fractions of time, which no bound reads, 1), about
/// half the walks over the stage's layers.
enum class StageMemoryTerms { All, PeakBound };

/// `first_stage`: the model input needs no gradient, so the backward allocates none for it.
StageMemory stage_memory(const CostModel& model, const SizeCosts& costs, int first, int end,
                         bool first_stage, StageMemoryTerms terms = StageMemoryTerms::All);

/// What a task allocates on its device when it starts, frees once its peak is over (at
/// `peak_end` × its duration), frees once its peak layer has ended (at `layer_end`, no earlier)
/// and frees when it ends; the simulator charges these, and the planner's memory bound is
/// derived from them.
struct MemoryEffect {
  std::int64_t allocated = 0;
  std::int64_t freed = 0;  ///< at the end
  std::int64_t freed_after_peak = 0;
  double peak_end = 1.0;
  std::int64_t freed_after_layer = 0;
  double layer_end = 1.0;
};

/// What a stage holds for the whole iteration: every parameter and buffer (`held`,
/// CostModel::held_bytes), and the optimizer's state (`optimizer_state_factor` times their
/// bytes) of the parameters that train. Rounded as the simulator and the planner's bounds both
/// take it, per stage.
std::int64_t resident_bytes(std::int64_t held, std::int64_t trained, double optimizer_state_factor);
/// What a backward (B, or W when split) frees besides its layer walk: the stage output and the
/// received gradient (the last stage has neither), and the stage input when it is the stage's
/// own buffer (received from another device, or left by a checkpointed stage on this one).
std::int64_t dies_with_backward(const StageMemory& m, bool last_stage, bool own_input);
/// A forward: with autograd it keeps kept_bytes (split_kept_bytes where the micro-batch's
/// backward is `split`); checkpointed, only the output survives (the last stage drops it with
/// the loss).
MemoryEffect forward_effect(const StageMemory& m, bool checkpointed, bool last_stage,
                            bool split = false);
MemoryEffect recompute_effect(const StageMemory& m, bool split = false);
/// A recompute task's: recompute_effect() and, for its length, the copy of the stage's buffers
/// that is put back after it.
MemoryEffect recompute_task_effect(const StageMemory& m, bool split = false);
/// `first_time`: the stage's first backward, which creates the parameter gradients.
MemoryEffect backward_effect(const StageMemory& m, bool first_time, std::int64_t dies);
/// `torch`: as torch.distributed.pipelining runs it (StageMemory::torch_input), else as
/// pipetune's executor does.
MemoryEffect input_backward_effect(const StageMemory& m, bool torch = false);
/// `torch`: the micro-batch's forward kept kept_bytes and torch's I its gradients; else (pipetune's
/// executor) the forward kept split_kept_bytes.
MemoryEffect weight_backward_effect(const StageMemory& m, std::int64_t param_bytes, bool first_time,
                                    bool last_stage, std::int64_t dies, bool torch = false);

/// What a stage's backward leaves of its micro-batch once it has ended and its input gradient
/// has gone to the previous device (kept activations and the walk's net change, less the held
/// output and the input gradient): the parameter gradients for the first backward (`first_time`),
/// nothing for the others, as long as the stage's last layer makes its own storage; when that
/// layer is a view, the freed output's size may exceed the held storage's by up to the output's
/// size.
std::int64_t left_by_backward(const StageMemory& m, bool first_time, bool last_stage);

/// A device that runs one stage, just before one of its backwards (of micro-batch q) starts:
/// what its programme has certainly left allocated. Slots: 0 the common micro-batch size, 1 a
/// smaller last one.
struct BeforeBackward {
  /// Micro-batches forwarded with autograd and not yet backwarded, q included when it was.
  std::array<int, 2> kept_forwards{};
  /// Micro-batches forwarded and not yet backwarded whose input came from another device.
  std::array<int, 2> received_inputs{};
  int slot = 0;             ///< q's size
  bool recomputed = false;  ///< q is recomputed right before this backward
  bool first = false;       ///< the stage's first backward (no parameter gradients yet)
  /// What the stage's earlier backwards left (left_by_backward() summed, or a lower bound).
  std::int64_t left_by_earlier = 0;
};

/// A lower bound on the simulated peak of that device, from the effects above: `baseline`
/// (parameters, optimizer state, the batch, library workspaces), the kept activations and
/// received inputs in flight, q's recompute, its received gradient (unless `last_stage`) and
/// what the earlier backwards left, plus what the backward allocates when it
/// starts; for the first backward also the level once it ends. Only what is certain counts: a
/// checkpointed forward's output, freed when its copy ends, does not. `memory[slot]` is
/// stage_memory() at each size (or less of each term, for a weaker bound).
std::int64_t peak_bound_before_backward(std::int64_t baseline,
                                        const std::array<StageMemory, 2>& memory,
                                        const BeforeBackward& state, bool last_stage);

/// What stage_peak_bound() needs of a GPipe or 1F1B plan with one stage per device besides
/// the stage's layers.
struct StagePeakShape {
  ScheduleKind schedule = ScheduleKind::GPipe;
  CheckpointMode checkpoint = CheckpointMode::Never;
  int micro_batches = 1;
  bool last_differs = false;  ///< tensor.chunk left a smaller last micro-batch
  int stages = 1;
  double optimizer_state_factor = 0.0;
  std::int64_t batch_input_bytes = 0;  ///< the mini-batch, on stage 0's device
  std::int64_t library_bytes = 0;
  /// Per size slot, the largest output of a layer that is a view (for `nested`, see below).
  std::array<std::int64_t, 2> view_output_bytes{};
  /// Per stage (empty: none): whether it is on a share of the same GPU as the stage before it
  /// (HardwareDevice::share_of). It then receives the sender's tensor itself, perhaps a view of
  /// what the sender holds, so its received inputs are not counted.
  std::vector<bool> receives_senders_tensor;
};

/// The shape of `plan` (its balance aside) for a profile of these costs.
StagePeakShape stage_peak_shape(const CostModel& model, const Plan& plan, int stages);

/// A lower bound on the simulated peak of the device that runs stage `stage` = layers [first,
/// end), from peak_bound_before_backward() just before the backwards where the most is held
/// (GPipe: of M - 1 and M - 2 after every forward; 1F1B: of 0 after the w = min(M, K - stage)
/// warm-up forwards, of 1 after one more forward, of M - w, the first after the last forward,
/// and of M - 1) and once the first backward has ended.
/// `common`, `last`: the costs at the common and the last micro-batch size. With `nested` the
/// stage's memory is reduced to its kept activations but the output's storage
/// (SizeCosts::kept_bytes_within, O(1)), received
/// inputs and gradients are left out, and each backward is taken to leave its parameter
/// gradients (the first) less the largest output of a view layer: a weaker bound that only grows as
/// the stage grows at either end (what the planner's tables over suffixes need).
std::int64_t stage_peak_bound(const CostModel& model, const SizeCosts& common,
                              const SizeCosts& last, const StagePeakShape& shape, int stage,
                              int first, int end, bool nested);

}  // namespace pipetune
