#pragma once

// pipetune's profiler: every layer of a model, at every micro-batch size, on the real device.
//
// For each size, the model's layers run one after the other on a synthetic batch, each layer's
// input being the previous layer's output (copied into a storage of its own, with a graph
// behind it as a stage's intermediate has, so a layer may work in place). Per layer and size:
//   forward_ms, backward_ms   median of `repeats` full forward and backward passes after
//                             `warmup` passes, each layer timed within the pass, so its weights
//                             are as cold as in a pipeline (spread: the median absolute
//                             deviation); the last layer's include the loss;
//   backward_input_ms, backward_weight_ms
//                             the backward split as zero-bubble schedules run it, timed in a
//                             second backward pass of each repetition: I, the gradient of the
//                             layer's input with the graph kept, then W, the parameters'
//                             gradients from that graph. The model's first layer (its input
//                             needs no gradient) has I = 0 and its whole backward as W, as
//                             torch's first stage runs it; a layer without parameters, W = 0;
//   output_bytes              the output tensor;
//   keeps_input, keeps_output, output_aliases_input
//                             after a forward, with the input and the output let go and only
//                             the graph held: whether the input's and the output's storages
//                             survive, and whether the output is the input's storage;
//   modifies_input            whether that forward moved the input's version counter (an
//                             in-place operation on it);
//   saved_bytes               what the allocator still counts then beyond those storages;
//   workspace_bytes           the forward's peak above its steady state;
//   backward_peak_bytes, backward_accumulate_peak_bytes
//                             the backward's peak above its start, the first time and later,
//                             the output and the gradient fed to it held (a stage's last layer);
//   inner_backward_peak_bytes, inner_backward_accumulate_peak_bytes
//                             the same with both owned by autograd alone (inside a stage);
//   backward_input_peak_bytes, backward_weight_peak_bytes
//                             the split backward's halves at a stage's end, each peak above
//                             its start: I (autograd.grad w.r.t. the input, the graph kept),
//                             then W (w.r.t. the parameters, the graph freed);
//   backward_peak_end, backward_peak_drop_bytes (CPU)
//                             from the counting allocator's record of those four backwards
//                             (every change, timed): a share of the backward's time after
//                             which each stays that many bytes below its peak (peak_release.hpp);
//   param_bytes;
//   forward_corun_ms, backward_corun_ms (CPU, co_runners > 0)
//                             forward_ms and backward_ms times the layer's slowdown beside
//                             `co_runners` threads that each run their own copy of the layer
//                             (forward and backward, on their own input) in a loop with the
//                             same intra-op threads: the median of `repeats` repetitions of
//                             the layer alone against the same beside the co-runners, taken
//                             back to back, so both see the same cache state.
//   forward_launch_ms, backward_launch_ms, forward_nograd_launch_ms (GPU)
//                             the host's time to make the layer's calls, timed by the steady
//                             clock in one untimed and `repeats` timed passes, after every
//                             size's device passes, the sizes taking turns pass by pass, each
//                             from an idle device, with the layers' calls back to back as a stage
//                             makes them (one graph, one backward call, each layer's backward
//                             bounded by hooks on its gradients) and nothing watching them (CUPTI's
//                             callbacks would slow them): where a layer's kernels are small, the
//                             GPU waits for the host, and that pace, not the kernels' time, sets a
//                             stage's. A backward call's own time (device.backward_call_ms: from
//                             backwards through one and two small products), which a stage
//                             pays once, is taken out: half from the last layer's
//                             backward_launch_ms (the call's start), half from the first one's
//                             that has a backward (its end).
//                             With CUPTI, forward_ms and backward_ms are the device's time: its
//                             kernels' durations and the short gaps between kernels it already
//                             had (activity.hpp), not the waits for the host.
// meta.host_pace_us is the host's pace as the launch times were taken (host_pace.hpp).
// device.library_bytes is what stays allocated once the work is done (cuBLAS workspaces).
// Memory comes from the CUDA caching allocator on GPUs and from the counting allocator on the
// CPU, so it is what the executor's measurements count.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "executor/models/model.hpp"
#include "sim/hardware.hpp"
#include "sim/profile.hpp"

namespace pipetune::profiler {

struct ProfileOptions {
  std::string device = "cpu";  ///< "cpu", "cuda" or "cuda:<n>"
  std::int64_t batch_size = 0;
  std::vector<std::int64_t>
      micro_batch_sizes;  ///< empty: powers of two below the batch, and the batch
  int warmup = 2;
  int repeats = 5;
  std::string timer = "auto";  ///< GPU: auto, cupti or events
  /// The host's launch times (LayerProfile::forward_launch_ms): "auto" where the device runs
  /// the layers asynchronously (a GPU), "on" everywhere (on a CPU they equal the layer's
  /// time: its work is its launch), "off" nowhere.
  std::string launch_times = "auto";
  int threads = 0;  ///< CPU intra-op threads (0: torch's default)
  /// CPU: the other devices' threads a layer is also timed beside (0: not measured). CUDA: 0
  /// only; stages sharing one GPU are not measured (InputError).
  int co_runners = 0;
  /// CPU: also time each layer with the core's private cache emptied first (LayerProfile::
  /// forward_cold_ms), for the simulator's cache model; nothing where the cache is unknown.
  bool cold_times = true;
  /// CPU: also time what a wait costs the work after it (ProfileDevice::after_idle), about 3 s
  /// more; nothing on a GPU, whose host launches ahead of the device.
  bool after_idle = true;
  /// CUDA: > 0 profiles on the first of that many equal shares of the GPU's SMs
  /// (executor/sm_partitions.hpp), the device each stage of a pipeline run with
  /// ExecutorOptions::sm_partitions gets; the profile's device name says which share.
  int sm_partitions = 0;
  std::uint64_t seed = 0;
  std::function<void(std::size_t done, std::size_t total)> progress;
};

struct ProfileResult {
  Profile profile;
  std::vector<std::string> warnings;
};

/// Throws InputError for bad options (batch 0, a size above the batch, CUDA without a GPU).
ProfileResult profile_model(models::Model& model, const ProfileOptions& options);

/// The sizes a profile measures by default: 1, 2, 4, … below the batch, and the batch.
std::vector<std::int64_t> default_micro_batch_sizes(std::int64_t batch);

/// Measures the devices a pipeline would use and the links between them: `devices` logical CPU
/// devices (worker threads; memory unknown), or every CUDA device (its memory; peer copies).
/// Link bandwidth from large copies, latency from small ones and the hand-over between threads.
Hardware probe_hardware(const std::string& device, int devices);

}  // namespace pipetune::profiler
