// What the parts of one search share: the devices as it sees them, and plans simulated, judged
// against their caps and kept as candidates.

#include "sim/planner/search_context.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>

#include "sim/memory_model.hpp"
#include "sim/planner/multi_stage_search.hpp"
#include "sim/planner/runtime_support.hpp"
#include "sim/planner/single_stage_search.hpp"

namespace pipetune::planning {

namespace {

// By how much the largest of `peaks` (per device, in r.devices' order) exceeds its device's cap;
// 0 when every one fits.
double excess_over_caps(const SimulationResult& r, const std::vector<std::int64_t>& peaks) {
  double excess = 0.0;
  for (std::size_t d = 0; d < peaks.size(); ++d) {
    const std::int64_t cap = r.devices[d].memory_capacity_bytes;
    if (cap > 0 && peaks[d] > cap) excess = std::max(excess, static_cast<double>(peaks[d] - cap));
  }
  return excess;
}

}  // namespace

Entry::Entry() = default;
Entry::~Entry() = default;
Entry::Entry(Entry&&) noexcept = default;
Entry& Entry::operator=(Entry&&) noexcept = default;

SearchContext::SearchContext(const Profile& profile_in, const Hardware& hardware_in,
                             const PlannerOptions& options_in)
    : profile(profile_in),
      options(options_in),
      costs(profile_in),
      hardware(hardware_in),
      simulator(profile_in, hardware_in),
      stages(static_cast<int>(hardware_in.devices.size())),
      layers(static_cast<int>(profile_in.layers.size())),
      overhead(hardware_in.launch_overhead_ms) {
  const std::vector<int> memory = device_memories(hardware);
  for (int j = 0; j < stages; ++j) {
    speed.push_back(hardware.devices[j].speed);
    capacity.push_back(hardware.devices[j].memory_bytes);
    // Stage j on device j: on a share of its sender's GPU it receives the tensor itself.
    receives_senders_tensor.push_back(j > 0 && memory[j] == memory[j - 1]);
    link.push_back(j + 1 < stages ? &hardware.link_between(j, j + 1) : nullptr);
  }
  total_speed = std::accumulate(speed.begin(), speed.end(), 0.0);
  max_speed = *std::max_element(speed.begin(), speed.end());
}

int recompute_stop(const Config& config) {
  const int m = config.micro_batches();
  switch (config.checkpoint) {
    case CheckpointMode::Always:
      return m;
    case CheckpointMode::ExceptLast:
      return m - 1;
    case CheckpointMode::Never:
      return 0;
  }
  return 0;
}

// `plan`'s configuration: its chunks, checkpoint mode, schedule and stages per device.
Config SearchContext::config_of(const Plan& plan) const {
  Config c;
  c.sizes = split_batch(profile.batch_size, plan.chunks);
  c.chunks = plan.chunks;
  c.checkpoint = plan.checkpoint;
  c.schedule = plan.schedule;
  c.stages_per_device = plan.stages_per_device;
  return c;
}

std::vector<int> SearchContext::stage_devices_of(const Config& c) const {
  const int stages = stage_count(c);
  std::vector<int> device_of(stages);
  for (int s = 0; s < stages; ++s)
    device_of[s] = stage_rank(c.schedule, s, stages, c.stages_per_device);
  return device_of;
}

Plan SearchContext::plan_of(const Config& c, std::vector<int> balance) const {
  Plan plan;
  plan.balance = std::move(balance);
  plan.chunks = c.chunks;
  plan.checkpoint = c.checkpoint;
  plan.schedule = c.schedule;
  plan.stages_per_device = c.stages_per_device;
  plan.optimizer_state_factor = options.optimizer_state_factor;
  return plan;
}

PlanCandidate SearchContext::candidate_of(const Config& c, const Plan& plan,
                                          const SimulationResult& r) const {
  PlanCandidate out;
  out.plan = plan;
  out.micro_batches = c.micro_batches();
  out.iteration_ms = r.iteration_ms;
  out.throughput_samples_per_s = r.throughput_samples_per_s;
  out.bubble_fraction = r.bubble_fraction;
  for (const auto& d : r.devices) {
    out.busy_ms.push_back(d.busy_ms);
    out.peak_memory_bytes.push_back(d.peak_memory_bytes);
    out.memory_capacity_bytes.push_back(d.memory_capacity_bytes);
  }
  return out;
}

Score SearchContext::simulate_for(Entry& e, const std::vector<int>& balance,
                                  std::vector<std::int64_t>* peaks) {
  const Plan plan = plan_of(*e.config, balance);
  SimulationOptions lean;
  lean.record_tasks = false;
  lean.record_memory = false;
  const SimulationResult r = simulate_charged(plan, lean);
  ++e.stats.nodes;
  std::vector<std::int64_t> predicted;
  for (const auto& d : r.devices) predicted.push_back(d.peak_memory_bytes);
  if (peaks != nullptr) {
    peaks->assign(stages, 0);
    for (const auto& d : r.devices) (*peaks)[d.index] = d.peak_memory_bytes;
  }
  Score score{excess_over_caps(r, predicted), r.iteration_ms};
  std::vector<std::int64_t> worst;
  // Of two plans as fast, the one that needs less memory on its fullest device.
  const bool faster = r.iteration_ms < e.best,
             leaner = r.iteration_ms == e.best &&
                      r.max_peak_memory_bytes() < e.candidate.max_peak_memory_bytes();
  if ((faster || leaner) && fits(plan, r, worst)) {
    e.best = r.iteration_ms;
    e.candidate = candidate_of(*e.config, plan, r);
    e.candidate.worst_order_peak_bytes = std::move(worst);
  } else if (!worst.empty()) {
    // Fits as predicted but not in every arrival order: over by what the worst order needs.
    score.excess = excess_over_caps(r, worst);
  }
  // A balance the runtime refuses is worse than any that only misses a cap: local search
  // moves away from it.
  if (!runs(plan)) score.excess = std::numeric_limits<double>::infinity();
  return score;
}

std::vector<std::int64_t> SearchContext::worst_order_peaks_of(const Plan& plan) {
  SimulationOptions ordered;
  ordered.record_tasks = false;
  ordered.record_memory = false;
  ordered.worst_order_peaks = true;
  const SimulationResult w = simulator.run(plan, ordered);
  std::vector<std::int64_t> peaks;
  for (const auto& d : w.devices) peaks.push_back(d.worst_order_peak_bytes);
  return peaks;
}

bool SearchContext::runs(const Plan& plan) const {
  return (!options.stage_inputs_unchanged ||
          torch_changed_stage_input(plan, profile, costs.at(profile.micro_batch_sizes.front()))
              .empty()) &&
         (!options.stage_outputs_detachable || torch_view_stage_output(plan, profile).empty());
}

bool SearchContext::fits(const Plan& plan, const SimulationResult& r,
                         std::vector<std::int64_t>& worst) {
  worst.clear();
  if (!runs(plan) || !r.fits()) return false;
  if (!options.worst_order_memory || !capped()) return true;
  worst = worst_order_peaks_of(plan);
  ++stats.simulations;  // the search's: a plan it judges, unlike the leanest plan's report
  stats.steps += r.task_count * r.devices.size();  // a max-flow per device
  return excess_over_caps(r, worst) == 0.0;
}

const std::vector<double>& SearchContext::boundary_bytes_ascending(const SizeCosts& size) const {
  auto [it, added] = boundary_bytes_.try_emplace(&size);
  if (added) {
    for (std::size_t k = 0; k + 1 < size.output_bytes.size(); ++k)
      it->second.push_back(static_cast<double>(size.output_bytes[k]));
    std::sort(it->second.begin(), it->second.end());
  }
  return it->second;
}

}  // namespace pipetune::planning
