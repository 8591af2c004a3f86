#pragma once

// The GPipe executor: runs a plan's schedule IR (sim/schedule.hpp) on real devices, action by
// action, so that what it measures is the programme the simulator predicted.
//
// Each device of the plan has a worker thread that runs its programme in order: forward (F),
// recompute (R) and backward, whole (B) or split into I (w.r.t. the stage input) and W (w.r.t.
// its weights), of (stage, micro-batch); a device may hold several stages (the interleaved, V
// and looped schedules), each with its own parameters, optimizer and saved state. A forward
// hands its output to the next stage; a B or I hands its input's gradient to the previous one
// at once. Stages on one device
// hand over the tensor itself; between devices a copy channel (one thread per direction, a copy
// stream on CUDA) moves it, overlapping compute. Checkpointed micro-batches run forward without
// autograd and keep only their input; their recompute runs the forward again right before the
// backward, with the same dropout masks (each (step, stage, micro-batch) has its own seed).
//
// A distributed run (one process per device) is the same code: a send to a device in another
// process goes through a Transport, and a receiver thread per peer takes what arrives, in the
// order this device's programme needs it.
//
// CPU "devices" are worker threads with their own intra-op thread count, so the whole pipeline
// runs and is tested without a GPU; memory is charged to them by a counting allocator.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/modules/container/sequential.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "executor/models/model.hpp"
#include "executor/optimizer.hpp"
#include "sim/error.hpp"
#include "sim/plan.hpp"
#include "sim/schedule.hpp"
#include "sim/trace.hpp"

namespace pipetune::exec {

/// A stage failed: names the stage, micro-batch and action ("2F3") and what went wrong.
class ExecutorError : public WorkError {
 public:
  ExecutorError(int stage, int micro_batch, const std::string& action, const std::string& what);
  int stage, micro_batch;
};

/// request_stop() was called (Ctrl-C): the step did not finish.
class Interrupted : public std::runtime_error {
 public:
  Interrupted() : std::runtime_error("interrupted") {}
};

class Transport;  // executor/transport.hpp

struct ExecutorOptions {
  /// The devices the plan names, in order; a plan without `devices` puts stage i on entry i.
  /// Names are "cpu:<n>" (a worker thread) or "cuda:<n>".
  std::vector<std::string> devices;
  int threads_per_cpu_device = 0;  ///< 0: the machine's threads shared out among CPU devices
  std::uint64_t seed = 0;          ///< dropout seeds derive from (seed, step, stage, micro-batch)
  OptimizerKind optimizer = OptimizerKind::Sgd;
  double learning_rate = 0.01;
  bool record_memory_history = true;  ///< the memory curve per device (peaks are always kept)
  /// One process of a distributed run (distributed/): device i of the plan runs in the process
  /// of rank i; this process runs device transport->rank() and reaches the others through it.
  /// StepRecord then holds this rank's tasks, or on rank 0 every rank's, merged on its clock.
  std::shared_ptr<Transport> transport;
  /// A schedule to run instead of the plan's (torch's CSV): the plan then gives the layers per
  /// stage and the chunks; the schedule's programmes place the stages unless the plan names
  /// devices, and its R actions are the recomputes.
  std::optional<Schedule> schedule;
  /// > 0: device "cuda:<n>" is share n of that many equal shares of the first GPU's SMs
  /// (sm_partitions.hpp), so stages on different devices really run at once on one GPU; every
  /// device's memory is then the whole GPU's. 0: each "cuda:<n>" is GPU n.
  int sm_partitions = 0;
};

/// What one training step measured. Times in ms from the step's start, one time base for all
/// devices.
struct StepRecord {
  int step = 0;
  double loss = 0.0;
  double pipeline_ms = 0.0;  ///< first task's start to last task's end: what the simulator predicts
  double step_ms = 0.0;      ///< the whole step, optimizer included
  std::vector<TraceTask> tasks;  ///< device = index into device_names(), in the order they ran
  /// Per device: the most the device's allocator held beyond what it held before the pipeline
  /// was built (a GPU's allocator serves the whole process), which the simulator predicts.
  std::vector<std::int64_t> peak_memory_bytes;
  /// Per device: of those bytes as the step started, the ones in no tensor of the pipeline: the
  /// libraries' workspaces (cuBLAS keeps one per stream and thread); 0 on CPU devices.
  std::vector<std::int64_t> library_memory_bytes;
  std::vector<std::vector<CounterSample>> memory;  ///< per device, when recorded
};

class Pipeline {
 public:
  /// Splits `model` by the plan's balance and places the stages. Throws InputError for a plan
  /// that does not fit the model or the devices, before any work.
  Pipeline(models::Model& model, const Plan& plan, std::int64_t batch_size,
           ExecutorOptions options);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  /// One training step on a mini-batch of batch_size samples: the schedule's forwards and
  /// backwards, then the optimizer. Throws ExecutorError (a stage failed: the pipeline cannot
  /// be used again) or Interrupted.
  StepRecord step(const at::Tensor& input, const at::Tensor& target);

  /// Async-signal-safe: the current step stops after the running tasks and throws Interrupted.
  void request_stop();

  /// The devices that hold stages, in the order of StepRecord's per-device vectors.
  const std::vector<std::string>& device_names() const;
  const std::vector<int>& stage_device() const;  ///< stage -> index into device_names()
  std::vector<torch::nn::Sequential>& stages();
  const Plan& plan() const;
  const std::vector<std::int64_t>& micro_batch_sizes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The measured trace of one step, in the format of sim/trace.hpp (kind "measured").
Trace measured_trace(const Pipeline& pipeline, const StepRecord& step, const std::string& model,
                     const std::vector<std::int64_t>& capacity_bytes = {});

}  // namespace pipetune::exec
