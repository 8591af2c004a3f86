#pragma once

// Before `run` does any work: a plan whose predicted peak exceeds a device's memory is refused,
// naming the device and both byte counts, so a user learns it now and not from an out-of-memory
// error mid-step.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "executor/models/model.hpp"
#include "sim/plan.hpp"

namespace pipetune::cli {

struct FitCheck {
  std::string plan_source;    ///< the plan file, for messages
  std::string profile_path;   ///< a profile of the model; empty: a quick memory-only profile
  std::string hardware_path;  ///< devices' memory from this file; empty: --memory or the device's own
  std::string memory;         ///< --memory, per device ("16GiB"); empty: none
  std::string device_kind;    ///< "cpu" or "cuda"
  std::vector<std::string> devices;  ///< the executor's devices, in the order the plan indexes them
  std::int64_t batch = 0;
  double optimizer_state_factor = 0.0;  ///< of the optimizer the run will use
  bool force = false;
};

/// One device the plan does not fit, as predicted.
struct DoesNotFit {
  std::string device;
  std::int64_t predicted_bytes = 0;
  std::int64_t capacity_bytes = 0;
};

/// Builds a fresh instance of the model to profile, so the run's own model stays untouched.
using ModelFactory = std::function<models::Model()>;

/// The devices `plan` (with executor device names) does not fit, predicted by the simulator from
/// the profile. Empty when every device fits or no device's memory is known (CPU devices without
/// --hardware or --memory), in which case nothing is profiled.
std::vector<DoesNotFit> predict_misfits(const FitCheck& check, const Plan& plan, const ModelFactory& model);

/// Throws WorkError listing every device that does not fit, unless `check.force`, in which case
/// it says so on stderr and returns.
void refuse_plans_that_do_not_fit(const FitCheck& check, const Plan& plan, const ModelFactory& model);

}  // namespace pipetune::cli
