#include "sim/interval.hpp"

#include <cmath>
#include <stdexcept>

namespace pipetune {

double normal_quantile(double p) {
  if (!(p > 0.0 && p < 1.0)) throw std::invalid_argument("normal_quantile: p outside (0, 1)");
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                             1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01, -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  const double low = 0.02425;
  if (p < low) {
    const double q = std::sqrt(-2 * std::log(p));
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  if (p > 1 - low) return -normal_quantile(1 - p);
  const double q = p - 0.5, r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
         (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

IterationInterval iteration_interval(const Simulator& simulator, const Profile& profile,
                                     const Plan& plan, double central) {
  SimulationOptions options;
  options.record_tasks = false;
  options.record_memory = false;
  return interval_around(simulator, profile, plan, simulator.run(plan, options).iteration_ms,
                         central);
}

IterationInterval interval_around(const Simulator& simulator, const Profile& profile,
                                  const Plan& plan, double median_ms, double central) {
  if (!(central > 0.0 && central < 1.0))
    throw std::invalid_argument("iteration_interval: central outside (0, 1)");
  IterationInterval out;
  out.central = central;
  out.from_spreads = profile.has_spreads();
  out.median_ms = out.low_ms = out.high_ms = median_ms;
  const double z = normal_quantile(0.5 + central / 2);
  if (out.from_spreads) {
    SimulationOptions options;
    options.record_tasks = false;
    options.record_memory = false;
    options.spread_z = -z;
    out.low_ms = simulator.run(plan, options).iteration_ms;
    options.spread_z = z;
    out.high_ms = simulator.run(plan, options).iteration_ms;
  }
  const double model = simulator.hardware().model_error;
  if (model > 0) {
    out.from_model_error = true;
    const double extra = z * model * out.median_ms;
    out.low_ms = out.median_ms - std::hypot(out.median_ms - out.low_ms, extra);
    out.high_ms = out.median_ms + std::hypot(out.high_ms - out.median_ms, extra);
  }
  return out;
}

std::vector<IterationInterval> intervals_of(const Profile& profile, const Hardware& hardware,
                                            int devices, const std::vector<Plan>& plans,
                                            double central) {
  const Hardware used = first_devices(hardware, devices);  // the Simulator keeps a reference
  const Simulator simulator(profile, used);
  std::vector<IterationInterval> out;
  for (const Plan& plan : plans)
    out.push_back(iteration_interval(simulator, profile, plan, central));
  return out;
}

}  // namespace pipetune
