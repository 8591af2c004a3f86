#pragma once

// What a wait costs the work after it (docs/architecture.md, "After a wait"). On a CPU a core
// that slept, or ran other work, runs the next work slower for a while: its instruction and
// address caches and predictors hold something else, and a virtual CPU that halted may find its
// physical core busy. Measured on a 2-vCPU VM, a model's forward ran about 0.1 ms longer after
// 0.5 ms asleep, 0.3 ms after 2 ms, 0.7 ms after 5 ms and 1 ms after 10 ms or more, whether it
// took 1 ms or 10 ms. The profile keeps that curve per device as points (idle, extra); the
// profiler times it with the model's own layers, back to back and after each wait.
//
// A device that waited `w` owes extra(w). It pays at most as fast as it works (a task that
// works t ms pays at most t: half speed at worst, as the probe's 1 ms forwards paid their whole
// extra and no more), so a short task leaves the rest to the task after it. A new wait renews
// the debt to the larger of what is left and what that wait costs.

#include <cstddef>
#include <span>
#include <vector>

namespace pipetune {

struct AfterIdlePoint {
  double idle_ms = 0.0;   ///< how long the device waited
  double extra_ms = 0.0;  ///< how much longer the work after it took
};

/// extra(idle): linear between the points, from (0, 0) to the first, flat after the last; 0
/// without points. `points` ascending by idle.
double after_idle_extra_ms(std::span<const AfterIdlePoint> points, double idle_ms);

/// One device's debt, paid task by task in the device's order: `pay` takes the wait before the
/// task (the first's from the step's start) and its work without the extra, and returns what
/// the task pays.
class AfterIdleDebt {
 public:
  double pay(std::span<const AfterIdlePoint> points, double idle_ms, double work_ms);

 private:
  double owed_ms_ = 0.0;
};

/// The curve from a probe: `samples_ms[k]` the same work timed after waiting about `idle_ms[k]`
/// (ascending; the first 0, back to back). Each point's extra is its median over the first's,
/// made non-decreasing (pooling adjacent points that fall, weighted by their samples: a longer
/// wait never costs less, and noise should not say it does) and at least 0. Empty samples are
/// an error (std::invalid_argument), as are fewer than two idles.
std::vector<AfterIdlePoint> fit_after_idle(std::span<const double> idle_ms,
                                           std::span<const std::vector<double>> samples_ms);

/// The run of consecutive layers the probe times: [first, end) of least total time among those
/// taking at least `at_least` ms (the earliest of equal ones), or every layer where all of them
/// take less. `forward_ms` non-negative.
struct LayerRun {
  std::size_t first = 0, end = 0;
  double ms = 0.0;
};
LayerRun cheapest_run(std::span<const double> forward_ms, double at_least);

}  // namespace pipetune
