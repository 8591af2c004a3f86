#pragma once

// The host's pace: how long the host takes to make one small call on a device, measured the
// same way wherever it is asked. A GPU layer whose kernels are small runs at the pace its host
// makes the calls, and that pace moves with the machine's state (a lent machine's host was a
// fifth slower some minutes than others). A profile records the pace its launch times were
// taken at and a run the pace it met, so a prediction can say how much of an error is the
// host's.

#include <string>

namespace pipetune::profiler {

/// Microseconds per call of an in-place add on a one-element tensor on `device` ("cpu",
/// "cpu:<n>", "cuda", "cuda:<n>"; InputError otherwise): the median of several timed batches of
/// calls, each batch from an idle device and none waiting for the device (a batch is far shorter
/// than a launch queue). On a CPU the call runs where it is made: its time is the op's dispatch and
/// work.
double measure_host_pace_us(const std::string& device);

}  // namespace pipetune::profiler
