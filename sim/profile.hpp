#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sim/after_idle.hpp"

namespace pipetune {

/// One layer (one child of the top-level Sequential) measured at each micro-batch size.
/// Every vector has one entry per size in Profile::micro_batch_sizes.
struct LayerProfile {
  std::string name;
  std::int64_t param_bytes = 0;
  /// Optional (-1 when absent: every parameter trains): the part of param_bytes that trains
  /// (`requires_grad`). Frozen parameters get no gradient and no optimizer state; the layers
  /// before the model's first that trains build no graph, their input being data, so they have
  /// no backward (the profiler and the executor ask no gradient of their inputs).
  std::int64_t trainable_param_bytes = -1;
  std::int64_t trained_bytes() const {
    return trainable_param_bytes < 0 ? param_bytes : trainable_param_bytes;
  }
  /// Optional (0 when absent): bytes of its buffers (batch norm's running statistics, a rotary
  /// or position table, a relative-position index), held from step to step like its parameters
  /// but with no gradient and no optimizer state.
  std::int64_t buffer_bytes = 0;
  std::vector<double> forward_ms;
  std::vector<double> backward_ms;
  std::vector<std::int64_t> output_bytes;     ///< what the layer hands to the next layer
  std::vector<std::int64_t> saved_bytes;      ///< kept for backward, besides input and output
  std::vector<std::int64_t> workspace_bytes;  ///< transient peak while it runs
  /// Optional (empty when absent; both or neither): the peak allocated above a backward's start,
  /// its input's gradient and its parameters' gradients included, when the parameter gradients
  /// are created (a stage's first backward) and when they are added into (every later one).
  /// Without them the memory model estimates both from the fields above.
  std::vector<std::int64_t> backward_peak_bytes;
  std::vector<std::int64_t> backward_accumulate_peak_bytes;
  /// Optional (empty when absent; both or neither, only with the two above): the same peaks for
  /// the layer inside a stage, where nothing but autograd holds its output and the gradient it
  /// receives, so both die as soon as the layer's backward is done with them; given above a
  /// level that holds that gradient. Absent: the peaks above, measured with both held.
  std::vector<std::int64_t> inner_backward_peak_bytes;
  std::vector<std::int64_t> inner_backward_accumulate_peak_bytes;
  /// Optional (empty when absent; both or neither, every layer or none, only with the peaks
  /// above): from `backward_peak_end` (a share of backward_ms, 0 to 1) on, the layer's backward
  /// stays `backward_peak_drop_bytes` below its peak, in each of the four ways its peaks were
  /// measured. Absent: the peak lasts until the layer's backward ends.
  std::vector<double> backward_peak_end;
  std::vector<std::int64_t> backward_peak_drop_bytes;
  /// Optional (empty when absent; both or neither, every layer or none, only with the peaks
  /// above): the split backward's halves as zero-bubble schedules run them at a stage's end,
  /// each peak above its start: I (the input's gradient, the graph kept, so no saved tensor is
  /// freed on the way; 0 where the input needs no gradient) and then W (the parameters'
  /// gradients, all returned at once, the graph freed as it goes). Absent: estimated from the
  /// backward's peaks.
  std::vector<std::int64_t> backward_input_peak_bytes;
  std::vector<std::int64_t> backward_weight_peak_bytes;
  /// Optional (empty when absent): the forward without autograd, as a checkpointed micro-batch
  /// runs it; nothing is recorded for the backward, so it is often cheaper. Absent: forward_ms.
  std::vector<double> forward_nograd_ms;
  /// What autograd keeps of the layer's input and output for the backward, by storage (a view
  /// keeps its whole storage alive). Optional, each defaulting to what a profile without them
  /// meant: the input kept, the output not kept by the layer itself, the output its own storage.
  bool keeps_input = true;    ///< a saved tensor is the input or a view of it
  bool keeps_output = false;  ///< a saved tensor is its own output (ReLU, Sigmoid)
  bool output_aliases_input =
      false;  ///< the output is a view of the input, or the input modified in place
  /// The layer changes its input in place (its version counter moves). A stage that starts with
  /// such a layer, or with views of its input and then one, works on a copy of its input (the
  /// input is the leaf that collects its gradient, which autograd does not let change), and the
  /// memory model charges that copy. Optional, default false.
  bool modifies_input = false;
  /// Optional (empty when absent; every layer or none): what torch.distributed.pipelining's
  /// zero-bubble I keeps of the layer for its W, measured on torch's own I (the eager profile,
  /// scripts/eager_profile.py): the gradient flowing into each operation with weights, by
  /// storage, besides the gradient of the layer's output; for the model's last layer, whose
  /// output gradient the loss makes, that one too where it is kept. 0 where the layer has no
  /// I. Absent: torch's I is taken to keep what pipetune's executor keeps (one gradient per
  /// layer that trains).
  std::vector<std::int64_t> torch_weight_gradient_bytes;
  /// With the field above (both or neither): what autograd saved of the layer that dies when
  /// that I ends with the layer last in its stage, as torch then detaches the stage's output:
  /// what was saved above its last operation with weights, all of it in a layer without.
  std::vector<std::int64_t> torch_freed_by_input_bytes;
  /// With the field above: torch's I also keeps the gradient of the layer's output (its last
  /// operation has weights). Optional, default false.
  bool torch_keeps_output_gradient = false;
  /// Optional (empty when absent; both or neither, only with the two above, every layer or
  /// none): torch's W (`stage_backward_weight`) of the layer alone after its forward and I, its
  /// peak above its start the first time (its weight gradients made and kept as `.grad`) and a
  /// later time (added into `.grad`). Absent: the executor's W.
  std::vector<std::int64_t> torch_weight_peak_bytes;
  std::vector<std::int64_t> torch_weight_accumulate_peak_bytes;
  /// Optional (empty when absent; only with the two above, every layer or none): what that W
  /// frees as it goes inside a stage, before the graph dies at W's end: what only the layer's
  /// operations with weights saved (autograd frees it as they are done), besides its input and
  /// output. Absent: W frees what autograd saved at its end.
  std::vector<std::int64_t> torch_weight_freed_bytes;
  /// With the field above: only the layer's operations with weights saved its input, so W frees
  /// it too unless the layer before keeps it (keeps_output) or it is a view of an earlier
  /// storage. Optional, default false.
  bool torch_weight_frees_input = false;
  /// Optional (empty when absent; both or neither, every layer or none): the backward split as
  /// zero-bubble schedules run it, I (autograd w.r.t. the layer input, graph kept) then W
  /// (w.r.t. the parameters). Absent: a layer with parameters splits backward_ms in halves, one
  /// without gives it all to I (CostModel).
  std::vector<double> backward_input_ms;
  std::vector<double> backward_weight_ms;
  /// Optional (empty when absent; both or neither, every layer or none, only with
  /// Profile::co_runners): forward and backward while `co_runners` other threads each run the
  /// same layer's forward and backward on their own inputs, as the other devices of a pipeline
  /// on the same CPU (or streams on the same GPU) do. Absent: no co-run slowdown is modelled.
  std::vector<double> forward_corun_ms;
  std::vector<double> backward_corun_ms;
  /// Optional (empty when absent; both or neither, every layer or none, only with
  /// ProfileDevice::cache_bytes): forward and backward with the device's cache emptied first,
  /// where the times above are taken hot (each backward right after its forward). The
  /// simulator's cache model (sim/cache_model.hpp) places a task between the two. Absent: hot.
  std::vector<double> forward_cold_ms;
  std::vector<double> backward_cold_ms;
  /// Optional (empty when absent; only with the cold times above, every layer or none): the
  /// forward timed as a device's first task of a step runs it, right after the optimizer's step
  /// has swept every parameter and its gradient (on a CPU that sweep leaves the caches holding
  /// the optimizer's data, not the stage's). The simulator times each device's first forward of
  /// a step at it. Absent: that forward at its cold cache's time, as every other.
  std::vector<double> forward_step_start_ms;
  /// Optional (empty when absent; both or neither, every layer or none): the host's time to
  /// launch the layer's forward and backward on a device that runs them asynchronously (a
  /// GPU), measured with nothing watching the launches. A stage's host launches its layers one
  /// after another while the device runs what was launched, so a task takes the larger of the
  /// two sums (CostModel). Absent: the device's times alone (a CPU, where they are one thing).
  std::vector<double> forward_launch_ms;
  std::vector<double> backward_launch_ms;
  /// Optional (empty when absent; only with the two above, every layer or none): the same for
  /// the forward without autograd. Absent: forward_launch_ms.
  std::vector<double> forward_nograd_launch_ms;
  std::vector<double> forward_ms_spread;   ///< optional (empty when absent)
  std::vector<double> backward_ms_spread;  ///< optional (empty when absent)
};

struct ProfileDevice {
  std::string type;               ///< "cpu", "cuda", ...
  std::string name;               ///< human-readable model of the device
  std::int64_t memory_bytes = 0;  ///< 0: unknown, no memory limit is enforced
  /// Optional (0 when absent): what the device's libraries keep allocated once used, on every
  /// device of a pipeline (cuBLAS keeps a workspace per thread and stream); 0 on a CPU.
  std::int64_t library_bytes = 0;
  /// Optional (0 when absent; used with launch times): the host's time of one backward call
  /// beyond its layers' launches (autograd hands the graph to its device thread and waits for
  /// it), which a stage's backward pays once, however many layers it holds. The layers'
  /// backward_launch_ms leave it out.
  double backward_call_ms = 0.0;
  /// Optional (0 when absent: the whole device): the profile was taken on one of this many
  /// equal shares of the GPU's SMs (`profile --sm-partitions`).
  int sm_shares = 0;
  /// Optional (0 when absent; only with the layers' cold times): the cache a device's threads
  /// have to themselves, in bytes, the one the cold times were taken with emptied.
  std::int64_t cache_bytes = 0;
  /// Optional (empty when absent): what a wait costs the device's next work (sim/after_idle.hpp),
  /// points ascending by idle. Absent: nothing.
  std::vector<AfterIdlePoint> after_idle{};
};

/// The per-layer costs that the simulator and the planner read (format pipetune.profile/1).
/// A parameter several layers hold as one tensor (tied weights: an embedding and the output
/// projection that reuses its matrix). Each holder's param_bytes includes it. A stage holding
/// one or more of the layers holds the tensor once; a plan that splits them holds one copy per
/// stage holding any (the executor sums the copies' gradients before each step).
struct TiedTensor {
  std::string name;         ///< e.g. "embed.weight": the first holder's name for it
  std::vector<int> layers;  ///< the holders, strictly increasing, at least two
  std::int64_t bytes = 0;
  bool trained = true;  ///< false: frozen, in no holder's trainable_param_bytes
};

struct Profile {
  std::string model;
  ProfileDevice device;
  std::string dtype;
  /// How times were taken: "clock" (the host's steady clock, CPU), "cupti" (CUPTI's activity
  /// records of the device's work), "cuda-events" (CUDA events around each region); "": unknown.
  std::string timer;
  std::int64_t batch_size = 0;
  std::vector<std::int64_t> micro_batch_sizes;  ///< strictly increasing, ≥ 1
  /// Optional (1 when absent): the fewest samples a micro-batch may hold, where a layer cannot
  /// train on fewer (batch norm over one value per channel); no micro_batch_sizes below it.
  std::int64_t min_micro_batch = 1;
  std::vector<std::int64_t> input_bytes;  ///< model input, one per micro-batch size
  std::vector<LayerProfile> layers;
  std::vector<TiedTensor> tied;  ///< optional ("tied_parameters"): empty when nothing is tied
  /// Optional (0 when absent): how many co-runners the layers' *_corun_ms were measured with.
  int co_runners = 0;
  std::string meta_json;  ///< optional free-form provenance object, kept verbatim ("" if none)

  std::size_t layer_count() const { return layers.size(); }
  bool has_corun_times() const { return co_runners > 0; }
  bool has_cold_times() const { return device.cache_bytes > 0; }
  bool has_after_idle() const { return !device.after_idle.empty(); }
  /// Every layer has forward_step_start_ms (only ever with cold times).
  bool has_step_start_times() const {
    return has_cold_times() && !layers.empty() &&
           std::all_of(layers.begin(), layers.end(),
                       [](const auto& l) { return !l.forward_step_start_ms.empty(); });
  }
  /// Every layer has both spreads (forward_ms_spread, backward_ms_spread).
  bool has_spreads() const {
    return !layers.empty() && std::all_of(layers.begin(), layers.end(), [](const auto& l) {
      return !l.forward_ms_spread.empty() && !l.backward_ms_spread.empty();
    });
  }
  bool has_launch_times() const { return !layers.empty() && !layers[0].forward_launch_ms.empty(); }
};

/// The stages a plan's `balance` puts the holders of `tied` on, each once, in order (one
/// stage: the tensor is one tensor there; several: a copy on each).
std::vector<int> stages_holding(const TiedTensor& tied, const std::vector<int>& balance);

inline constexpr std::string_view kProfileFormat = "pipetune.profile/1";

/// The measured micro-batch sizes at which the whole model's launches (forward and backward,
/// one backward call) take longer than its device time: a pipeline of micro-batches that small
/// runs at the host's pace, not the device's. Empty without launch times.
std::vector<std::int64_t> launch_bound_sizes(const Profile& profile);

/// Parses and validates a profile; `source` names it in error messages (usually the path).
Profile parse_profile(std::string_view text, const std::string& source);
Profile load_profile(const std::string& path);
std::string profile_to_json(const Profile& profile);
void save_profile(const Profile& profile, const std::string& path);

}  // namespace pipetune
