#pragma once

// A prediction with its spread: the iteration's time at the median and at the ends of a central
// interval, from the layers' measured spread (LayerProfile::forward_ms_spread). A machine that
// runs slow runs every task of a step slow (the host's pace, the cores' clocks), so the model
// takes one factor for the whole step: each compute task at its time plus z standard deviations
// of its layers' spread. The iteration is a longest path, which grows with every duration, so
// its quantiles are the iteration at the normal's quantiles of z: two more simulations, exact
// under that model, no sampling. The model's own error on the machine, where the hardware knows
// it (Hardware::model_error, a relative standard deviation), is independent of the step's pace:
// each half of the interval becomes the root of the sum of its square and that error's at the
// same quantile. With neither, the interval has zero width.

#include <vector>

#include "sim/plan.hpp"
#include "sim/simulator.hpp"

namespace pipetune {

struct IterationInterval {
  double central = 0.8;           ///< the share of steps the interval is for
  double low_ms = 0.0;            ///< its lower end (p10 for 0.8)
  double median_ms = 0.0;         ///< the prediction itself
  double high_ms = 0.0;           ///< its upper end (p90 for 0.8)
  bool from_spreads = false;      ///< the profile had spreads
  bool from_model_error = false;  ///< the hardware knew the model's error (Hardware::model_error)

  bool known() const { return from_spreads || from_model_error; }

  double width() const { return median_ms > 0 ? (high_ms - low_ms) / median_ms : 0.0; }
  bool holds(double ms) const { return low_ms <= ms && ms <= high_ms; }
};

/// The normal's quantile z with P(Z ≤ z) = p, 0 < p < 1 (Acklam's rational approximation,
/// relative error below 1.2e-9).
double normal_quantile(double p);

/// The plan's iteration interval holding `central` of the steps (0 < central < 1).
IterationInterval iteration_interval(const Simulator& simulator, const Profile& profile,
                                     const Plan& plan, double central = 0.8);

/// The interval of each of `plans`, on the first `devices` of `hardware` (the devices a planner
/// searched): what `plan` and the GUI show beside the ranked plans.
std::vector<IterationInterval> intervals_of(const Profile& profile, const Hardware& hardware,
                                            int devices, const std::vector<Plan>& plans,
                                            double central = 0.8);

/// The same around a prediction already made (`median_ms`: the plan's iteration by this
/// simulator, as the GUI has it after each edit): only the ends are simulated, and only where
/// the profile has spreads.
IterationInterval interval_around(const Simulator& simulator, const Profile& profile,
                                  const Plan& plan, double median_ms, double central = 0.8);

}  // namespace pipetune
