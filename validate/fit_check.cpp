#include "validate/fit_check.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <set>

#include "profiler/profiler.hpp"
#include "sim/error.hpp"
#include "sim/hardware.hpp"
#include "sim/simulator.hpp"
#include "sim/units.hpp"

namespace pipetune::validate {

namespace {

// The distinct micro-batch sizes the plan splits the batch into: all a memory check needs.
std::vector<std::int64_t> sizes_of(const Plan& plan, std::int64_t batch) {
  const auto split = split_batch(batch, plan.chunks);
  std::set<std::int64_t> distinct(split.begin(), split.end());
  return {distinct.begin(), distinct.end()};
}

}  // namespace

std::vector<DoesNotFit> predict_misfits(const FitCheck& check, const Plan& plan,
                                        const ModelFactory& make_model) {
  const std::int64_t memory = check.memory_bytes;
  // CPU devices have no memory of their own to exceed unless the user gives one.
  const bool known = check.device_kind == "cuda" || !check.hardware_path.empty() || memory > 0;
  if (!known) return {};

  Profile profile;
  if (!check.profile_path.empty()) {
    profile = load_profile(check.profile_path);
  } else {
    // Byte counts are exact after one pass; the times of this profile are not used.
    profiler::ProfileOptions o;
    o.device = check.device_kind;
    o.batch_size = check.batch;
    o.micro_batch_sizes = sizes_of(plan, check.batch);
    o.warmup = 0;
    o.repeats = 1;
    o.threads = 1;
    o.timer = "events";  // no CUPTI session left behind for the run that follows
    o.launch_times = "off";
    models::Model model = make_model();
    profile = profiler::profile_model(model, o).profile;
  }

  Hardware hw;
  if (!check.hardware_path.empty()) {
    hw = load_hardware(check.hardware_path);
  } else {
    for (const auto& name : check.devices)
      // `run --sm-partitions` splits cuda:0.
      hw.devices.push_back(
          {name, profile.device.memory_bytes, 1.0, check.sm_partitions > 0 ? "cuda:0" : ""});
  }
  if (memory > 0) {
    for (auto& d : hw.devices) d.memory_bytes = memory;
  }
  Plan predicted = plan;
  predicted.optimizer_state_factor = check.optimizer_state_factor;
  check_plan(predicted, profile, hw, check.plan_source);
  SimulationOptions lean;
  lean.record_tasks = false;
  const Simulator simulator(profile, hw);
  const SimulationResult result = check.schedule ? simulator.run(predicted, *check.schedule, lean)
                                                 : simulator.run(predicted, lean);

  std::vector<DoesNotFit> out;
  for (const auto& d : result.devices) {
    if (d.memory_capacity_bytes > 0 && d.peak_memory_bytes > d.memory_capacity_bytes) {
      out.push_back({d.name, d.peak_memory_bytes, d.memory_capacity_bytes});
    }
  }
  return out;
}

std::string misfit_message(const std::string& plan_source, const std::vector<DoesNotFit>& misfits) {
  std::vector<std::string> parts;
  for (const auto& m : misfits) {
    parts.push_back(fmt::format("{} needs {} ({} bytes) predicted, has {} ({} bytes)", m.device,
                                format_bytes(m.predicted_bytes), m.predicted_bytes,
                                format_bytes(m.capacity_bytes), m.capacity_bytes));
  }
  return fmt::format("{}: the plan does not fit: {}", plan_source, fmt::join(parts, "; "));
}

}  // namespace pipetune::validate
