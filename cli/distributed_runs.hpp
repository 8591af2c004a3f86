#pragma once

// `pipetune validate --distributed`: each plan run for real as one process per device, by
// `pipetune launch -n K -- run --distributed`, and the links probed between such processes.
// validate's loop (validate/validation.hpp) is unchanged; these are its measure and probe.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sim/hardware.hpp"
#include "validate/measure.hpp"

namespace pipetune::cli {

struct DistributedRuns {
  std::string model_spec;
  std::string dtype = "float32";
  bool deferred_batch_norm = false;
  std::string work_dir;      ///< plans, traces and the links are written here
  double timeout_s = 300.0;  ///< --timeout of every rank
  int devices = 2;           ///< processes of the link probe
  /// Launches so far, numbering the files of each (calibration and validation runs share
  /// work_dir); shared by the copies of this struct that validate's hooks hold.
  std::shared_ptr<int> launches = std::make_shared<int>(0);
};

/// Runs every plan for settings.warmup + settings.steps steps (rounds are not interleaved: each
/// plan is one launch). Throws WorkError naming the plan when its ranks fail.
std::vector<validate::MeasuredRun> measure_plans_distributed(
    const DistributedRuns& runs, const std::vector<Plan>& plans,
    const validate::RunSettings& settings,
    const std::function<void(std::size_t, std::size_t)>& progress);

/// The links between `runs.devices` processes, measured by `run --distributed --links-out` on a
/// plan of one stage per process and one step.
Hardware probe_distributed_links(const DistributedRuns& runs, int layers,
                                 const validate::RunSettings& settings);

}  // namespace pipetune::cli
