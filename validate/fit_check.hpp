#pragma once

// Before a plan runs: does its predicted peak exceed a device's memory? `run` refuses such a plan,
// naming the device and both byte counts, so a user learns it now and not from an out-of-memory
// error mid-step. The prediction is the simulator's, from a profile given or a quick memory-only
// one made here.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "executor/models/model.hpp"
#include "sim/plan.hpp"
#include "sim/schedule.hpp"

namespace pipetune::validate {

struct FitCheck {
  std::string plan_source;   ///< the plan file, for messages
  std::string profile_path;  ///< a profile of the model; empty: a quick memory-only profile
  std::string
      hardware_path;  ///< devices' memory from this file; empty: memory_bytes or the device's own
  std::int64_t memory_bytes = 0;     ///< every device's memory, overriding the above; 0: not given
  std::string device_kind;           ///< "cpu" or "cuda"
  std::vector<std::string> devices;  ///< the executor's devices, in the order the plan indexes them
  /// > 0: the devices are shares of one GPU's SMs (`run --sm-partitions`), whose tensors the
  /// GPU's one memory holds: each share's peak is the GPU's, all of them together.
  int sm_partitions = 0;
  /// > 0: a distributed run's ranks, all on this machine with this many GPUs: device cuda:k is a
  /// process on GPU k mod rank_gpus. Each process's caching allocator keeps the memory it has
  /// reached, so the ranks on one GPU need their peaks added up.
  int rank_gpus = 0;
  /// Bytes an executor device (its name) can still take now, 0 where not known: on a GPU its
  /// memory less what the CUDA context and other processes hold (exec::cuda_free_bytes()).
  /// Not asked with rank_gpus (`run` sets it for runs in one process only).
  std::function<std::int64_t(const std::string& device)> free_bytes;
  std::int64_t batch = 0;
  double optimizer_state_factor = 0.0;  ///< of the optimizer the run will use
  std::optional<Schedule> schedule;     ///< run instead of the plan's (torch's CSV)
};

/// One device the plan does not fit, as predicted.
struct DoesNotFit {
  std::string device;  ///< or "GPU 0 (cuda:0 + cuda:2)" for ranks sharing one
  std::int64_t predicted_bytes = 0;
  std::int64_t capacity_bytes = 0;
  /// The plan fits the device's memory but not what was free on it at the check
  /// (capacity_bytes, FitCheck::free_bytes): a warning, not a refusal.
  bool free_now = false;
};

/// Builds a fresh instance of the model to profile, so the run's own model stays untouched.
using ModelFactory = std::function<models::Model()>;

/// The devices `plan` (with executor device names) does not fit, predicted by the simulator from
/// the profile. Empty when every device fits or no device's memory is known (CPU devices without
/// a hardware file or memory_bytes), in which case nothing is profiled.
std::vector<DoesNotFit> predict_misfits(const FitCheck& check, const Plan& plan,
                                        const ModelFactory& model);

/// "PLAN: the plan does not fit: cpu:0 needs 1.50 GiB (… bytes) predicted, has …; …"; entries all
/// free_now: "PLAN: the plan may not fit what is free now: cuda:0 needs … predicted, has … free
/// (the rest of the memory held by the CUDA context, other processes and this process's
/// tensors)".
std::string misfit_message(const std::string& plan_source, const std::vector<DoesNotFit>& misfits);

}  // namespace pipetune::validate
