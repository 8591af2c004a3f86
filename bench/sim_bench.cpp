// Simulator and sweep speed (targets in docs/benchmarks.md):
//   simulating K = 16 stages x M = 128 micro-batches: at least 10 million tasks per second;
//   a sweep of 1,000 plans on a 100-layer profile: under one second.

#include <benchmark/benchmark.h>

#include <random>

#include "bench/synthetic_profile.hpp"
#include "sim/balance.hpp"
#include "sim/event_engine.hpp"
#include "sim/interval.hpp"
#include "sim/planner/planner.hpp"
#include "sim/simulator.hpp"
#include "sim/sweep.hpp"

namespace pipetune::bench {
namespace {

// The simulator benchmarks' pipeline: the synthetic profile at 4 layers a stage, one stage per
// device, 10 GB/s links, the batch in `micro_batches` chunks. The simulator keeps references to
// the profile and the hardware, so this outlives it.
struct SyntheticPipeline {
  Profile profile;
  Hardware hardware;
  Plan plan;
};

SyntheticPipeline synthetic_pipeline(int stages, int micro_batches) {
  SyntheticPipeline p{synthetic_profile(4 * stages, micro_batches), {}, {}};
  p.hardware = replicate_device(p.profile.device, stages);
  p.hardware.link.bandwidth_bytes_per_s = 1e10;
  p.plan.balance.assign(stages, 4);
  p.plan.chunks = micro_batches;
  return p;
}

// Iteration time, busy time and per-device peaks; no timeline kept.
SimulationOptions lean_options() {
  SimulationOptions lean;
  lean.record_tasks = false;
  lean.record_memory = false;
  return lean;
}

void BM_Simulate(benchmark::State& state) {
  SyntheticPipeline p =
      synthetic_pipeline(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)));
  p.plan.checkpoint = static_cast<CheckpointMode>(state.range(2));
  const Simulator simulator(p.profile, p.hardware);
  const SimulationOptions lean = lean_options();
  std::size_t tasks = 0;
  for (auto _ : state) {
    const auto r = simulator.run(p.plan, lean);
    tasks = r.task_count;
    benchmark::DoNotOptimize(r.iteration_ms);
  }
  state.counters["tasks"] = static_cast<double>(tasks);
  state.counters["tasks_per_s"] =
      benchmark::Counter(static_cast<double>(tasks), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Simulate)
    ->Args({16, 128, static_cast<int>(CheckpointMode::Never)})
    ->Args({16, 128, static_cast<int>(CheckpointMode::ExceptLast)})
    ->Args({4, 32, static_cast<int>(CheckpointMode::Never)})
    ->Unit(benchmark::kMicrosecond);

// The same 16 x 128 plan through the event engine's run by events, which plans with locks
// (shares of one GPU) or paced launches take instead of the one pass.
void BM_SimulateByEvents(benchmark::State& state) {
  SyntheticPipeline p = synthetic_pipeline(16, 128);
  p.plan.checkpoint = CheckpointMode::Never;
  const Simulator simulator(p.profile, p.hardware);
  const SimulationOptions lean = lean_options();
  EventEngine::always_process_events(true);
  std::size_t tasks = 0;
  for (auto _ : state) {
    const auto r = simulator.run(p.plan, lean);
    tasks = r.task_count;
    benchmark::DoNotOptimize(r.iteration_ms);
  }
  EventEngine::always_process_events(false);
  state.counters["tasks_per_s"] =
      benchmark::Counter(static_cast<double>(tasks), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_SimulateByEvents)->Unit(benchmark::kMicrosecond);

// A prediction with its 80 % interval (sim/interval.hpp): three simulations, the profile's
// layers given a spread of 5 % of their times.
void BM_Interval(benchmark::State& state) {
  SyntheticPipeline p =
      synthetic_pipeline(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)));
  for (auto& layer : p.profile.layers) {
    for (double ms : layer.forward_ms) layer.forward_ms_spread.push_back(0.05 * ms);
    for (double ms : layer.backward_ms) layer.backward_ms_spread.push_back(0.05 * ms);
  }
  const Simulator simulator(p.profile, p.hardware);
  for (auto _ : state) {
    const IterationInterval r = iteration_interval(simulator, p.profile, p.plan);
    benchmark::DoNotOptimize(r.high_ms);
  }
}
BENCHMARK(BM_Interval)->Args({16, 128})->Args({4, 32})->Unit(benchmark::kMillisecond);

// A run of p's plan per iteration, `change` applied to the plan before each; tasks per second
// over them all (the task count may change from run to run).
template <typename Change>
void simulate_changed_each_run(benchmark::State& state, SyntheticPipeline& p, Change change) {
  const Simulator simulator(p.profile, p.hardware);
  const SimulationOptions lean = lean_options();
  std::size_t tasks = 0;
  for (auto _ : state) {
    change(p.plan);
    const auto r = simulator.run(p.plan, lean);
    tasks += r.task_count;
    benchmark::DoNotOptimize(r.iteration_ms);
  }
  state.counters["tasks_per_s"] =
      benchmark::Counter(static_cast<double>(tasks), benchmark::Counter::kIsRate);
}

// Every run a new shape (128 and 127 micro-batches alternate), so the task graph is built
// from scratch each time: what a sweep over chunk counts pays.
void BM_SimulateNewShapeEachRun(benchmark::State& state) {
  SyntheticPipeline p = synthetic_pipeline(16, 128);
  std::size_t runs = 0;
  simulate_changed_each_run(state, p,
                            [&](Plan& plan) { plan.chunks = 127 + static_cast<int>(runs++ % 2); });
}
BENCHMARK(BM_SimulateNewShapeEachRun)->Unit(benchmark::kMicrosecond);

// What the planner's local search simulates: 1,000 layers in 16 stages and 16 micro-batches,
// each run with a random stage end moved by a layer (two stages' layers change, the others' not).
void BM_SimulateOneEndMovedEachRun(benchmark::State& state) {
  SyntheticPipeline p = synthetic_pipeline(16, 16);
  p.profile = synthetic_profile(1000, 16);
  p.plan.balance.assign(16, 62);
  p.plan.balance.back() = 1000 - 15 * 62;
  std::mt19937 rng(7);
  simulate_changed_each_run(state, p, [&](Plan& plan) {
    for (;;) {  // a move that leaves both stages a layer at least
      const int end = static_cast<int>(rng() % 15), way = rng() % 2 == 0 ? 1 : -1;
      if (plan.balance[end] + way < 1 || plan.balance[end + 1] - way < 1) continue;
      plan.balance[end] += way;
      plan.balance[end + 1] -= way;
      return;
    }
  });
}
BENCHMARK(BM_SimulateOneEndMovedEachRun)->Unit(benchmark::kMicrosecond);

// The same with every task's times and the memory curves recorded (what `simulate --trace`
// and the GUI need).
void BM_SimulateWithTimeline(benchmark::State& state) {
  const SyntheticPipeline p = synthetic_pipeline(16, 128);
  const Simulator simulator(p.profile, p.hardware);
  std::size_t tasks = 0;
  for (auto _ : state) {
    const auto r = simulator.run(p.plan);
    tasks = r.task_count;
    benchmark::DoNotOptimize(r.iteration_ms);
  }
  state.counters["tasks_per_s"] =
      benchmark::Counter(static_cast<double>(tasks), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_SimulateWithTimeline)->Unit(benchmark::kMicrosecond);

// The worst arrival order's peaks on top of a simulation (one max-flow per device): what
// `simulate`, `validate` and the GUI's plan editor pay for them.
void BM_SimulateWithWorstOrderPeaks(benchmark::State& state) {
  SyntheticPipeline p =
      synthetic_pipeline(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)));
  p.plan.checkpoint = CheckpointMode::Never;
  p.plan.schedule = ScheduleKind::OneFOneB;
  const Simulator simulator(p.profile, p.hardware);
  SimulationOptions options = lean_options();
  options.worst_order_peaks = true;
  std::size_t tasks = 0;
  for (auto _ : state) {
    const auto r = simulator.run(p.plan, options);
    tasks = r.task_count;
    benchmark::DoNotOptimize(r.devices.front().worst_order_peak_bytes);
  }
  state.counters["tasks"] = static_cast<double>(tasks);
}
BENCHMARK(BM_SimulateWithWorstOrderPeaks)
    ->Args({4, 32})
    ->Args({8, 64})
    ->Args({16, 128})
    ->Args({16, 256})
    ->Unit(benchmark::kMillisecond);

// 1,000 plans: 5 device counts x 25 chunk counts x 2 schedules x 4 link bandwidths, each with
// its own time-balanced split (the checkpoint mode fixed at except_last).
void BM_Sweep1000Plans(benchmark::State& state) {
  const Profile profile = synthetic_profile(100, 256);
  const Hardware hw = replicate_device(profile.device, 16);
  SweepSpec spec;
  spec.device_counts = {2, 4, 8, 12, 16};
  for (int c = 1; c <= 25; ++c) spec.chunks.push_back(c * 10);
  spec.checkpoints = {CheckpointMode::ExceptLast};
  spec.schedules = {ScheduleKind::GPipe, ScheduleKind::OneFOneB};
  spec.bandwidths = {1e9, 1e10, 5e10, 1e11};
  std::size_t plans = 0;
  for (auto _ : state) {
    const auto rows = run_sweep(profile, hw, spec);
    plans = rows.size();
    benchmark::DoNotOptimize(rows.data());
  }
  state.counters["plans"] = static_cast<double>(plans);
}
BENCHMARK(BM_Sweep1000Plans)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace
}  // namespace pipetune::bench

namespace pipetune::bench {
namespace {

// The planner's target: 1,000 layers, 16 devices, every chunk count up to 256, three
// checkpoint modes, two schedules; the best plan in under a second on one core. Counters:
// whether the search finished (proven optimal) and, if not, the proven gap.
void BM_Plan1000Layers16Devices(benchmark::State& state) {
  const Profile profile = synthetic_profile(1000, 256);
  Hardware hw = replicate_device(profile.device, 16);
  set_synthetic_links(hw);
  PlannerOptions options = single_stage_planner_options();
  options.top = 1;
  PlanSearchResult result;
  for (auto _ : state) {
    result = find_best_plans(profile, hw, options);
    benchmark::DoNotOptimize(result.ranked.data());
  }
  state.counters["proven"] = result.stats.proven ? 1 : 0;
  state.counters["gap_percent"] = 100.0 * result.stats.gap();
  state.counters["simulations"] = static_cast<double>(result.stats.simulations);
  state.counters["configurations"] = static_cast<double>(result.stats.configurations);
  state.counters["best_ms"] = result.stats.best_ms;
}
BENCHMARK(BM_Plan1000Layers16Devices)->Unit(benchmark::kMillisecond)->Iterations(2);

void report_search(benchmark::State& state, const PlanSearchResult& result) {
  state.counters["proven"] = result.stats.proven ? 1 : 0;
  state.counters["gap_percent"] = 100.0 * result.stats.gap();
  state.counters["nodes"] = static_cast<double>(result.stats.nodes);
  state.counters["best_ms"] = result.stats.best_ms;
}

// Plans in every iteration and reports the search with its steps.
void plan_and_report_steps(benchmark::State& state, const Profile& profile, const Hardware& hw,
                           const PlannerOptions& options) {
  PlanSearchResult result;
  for (auto _ : state) {
    result = find_best_plans(profile, hw, options);
    benchmark::DoNotOptimize(result.ranked.data());
  }
  report_search(state, result);
  state.counters["steps"] = static_cast<double>(result.stats.steps);
}

// Issue 15's second case: lognormal layer costs, random activation and parameter sizes, 16
// devices on 20 GB/s links; with range(0) = 1, each device capped at 2.5 x its share of the
// parameters, so that checkpointing and the chunk count matter.
void BM_PlanLognormal1000Layers16Devices(benchmark::State& state) {
  const Profile profile = lognormal_profile(1000, 256);
  Hardware hw = replicate_device(profile.device, 16);
  hw.link.bandwidth_bytes_per_s = 2e10;
  if (state.range(0) == 1) cap_at_parameter_share(hw, profile, 2.5);
  PlannerOptions options = single_stage_planner_options();
  options.top = 1;
  PlanSearchResult result;
  for (auto _ : state) {
    result = find_best_plans(profile, hw, options);
    benchmark::DoNotOptimize(result.ranked.data());
  }
  report_search(state, result);
}
BENCHMARK(BM_PlanLognormal1000Layers16Devices)
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

// The same profile under a cap no plan fits (1.6 x the parameters / 16 per device): the search
// for time finds nothing and the rest of the budget goes to the leanest plan, whose memory bound
// walks each stage's layers (counted as a step per layer since 2026-11-26; before, this took
// 100 s).
void BM_PlanNothingFits1000Layers16Devices(benchmark::State& state) {
  const Profile profile = lognormal_profile(1000, 256);
  Hardware hw = replicate_device(profile.device, 16);
  hw.link.bandwidth_bytes_per_s = 2e10;
  cap_at_parameter_share(hw, profile, 1.6);
  PlannerOptions options = single_stage_planner_options();
  options.top = 1;
  PlanSearchResult result;
  for (auto _ : state) {
    result = find_best_plans(profile, hw, options);
    benchmark::DoNotOptimize(result.leanest);
  }
  state.counters["fits"] = result.ranked.empty() ? 0 : 1;
  state.counters["leanest_peak_mib"] =
      result.leanest ? static_cast<double>(result.leanest->max_peak_memory_bytes()) / (1 << 20)
                     : 0.0;
  state.counters["leanest_proven"] = result.leanest_proven ? 1 : 0;
}
BENCHMARK(BM_PlanNothingFits1000Layers16Devices)->Unit(benchmark::kMillisecond)->Iterations(1);

// Unequal devices: the synthetic profile, range(0) layers on range(1) devices of speeds 1.5, 1,
// 0.75, 1 repeated (set_unequal_speeds).
void BM_PlanHeterogeneous(benchmark::State& state) {
  const int devices = static_cast<int>(state.range(1));
  const Profile profile = synthetic_profile(static_cast<int>(state.range(0)), 256);
  Hardware hw = replicate_device(profile.device, devices);
  set_unequal_speeds(hw);
  set_synthetic_links(hw);
  PlannerOptions options = single_stage_planner_options();
  options.top = 1;
  plan_and_report_steps(state, profile, hw, options);
}
BENCHMARK(BM_PlanHeterogeneous)
    ->Args({1000, 16})
    ->Args({100, 4})
    ->Args({100, 8})
    ->Args({1000, 4})
    ->Args({200, 8})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

// How the search scales: the synthetic profile, range(0) layers on range(1) devices, every
// chunk count, checkpoint mode and schedule, the default budget.
void BM_PlanScaling(benchmark::State& state) {
  const Profile profile = synthetic_profile(static_cast<int>(state.range(0)), 256);
  Hardware hw = replicate_device(profile.device, static_cast<int>(state.range(1)));
  set_synthetic_links(hw);
  PlannerOptions options = single_stage_planner_options();
  options.top = 1;
  PlanSearchResult result;
  for (auto _ : state) {
    result = find_best_plans(profile, hw, options);
    benchmark::DoNotOptimize(result.ranked.data());
  }
  report_search(state, result);
}
BENCHMARK(BM_PlanScaling)
    ->Args({100, 16})
    ->Args({300, 16})
    ->Args({3000, 16})
    ->Args({1000, 4})
    ->Args({1000, 8})
    ->Args({1000, 32})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

// The proofs the default budget does not reach, with a budget of a billion steps: range(0) 0 is
// the capped lognormal 1,000 x 16 case, 1 the unequal devices' 1,000 x 16, 2 the synthetic
// profile on 32 devices. Not part of the `Plan` filter: each takes seconds.
void BM_ProofAtScale(benchmark::State& state) {
  const int which = static_cast<int>(state.range(0));
  const Profile profile = which == 0 ? lognormal_profile(1000, 256) : synthetic_profile(1000, 256);
  Hardware hw = replicate_device(profile.device, which == 2 ? 32 : 16);
  if (which == 0) {
    hw.link.bandwidth_bytes_per_s = 2e10;
    cap_at_parameter_share(hw, profile, 2.5);
  } else {
    if (which == 1) set_unequal_speeds(hw);
    set_synthetic_links(hw);
  }
  PlannerOptions options = single_stage_planner_options();
  options.top = 1;
  options.search_budget = 1'000'000'000;
  plan_and_report_steps(state, profile, hw, options);
}
BENCHMARK(BM_ProofAtScale)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->Iterations(1);

// A model the size users profile (48 blocks, 4 devices, batch 64): the search finishes.
void BM_Plan48Layers4Devices(benchmark::State& state) {
  const Profile profile = synthetic_profile(48, 64);
  Hardware hw = replicate_device(profile.device, 4);
  hw.link.bandwidth_bytes_per_s = 1e10;
  PlanSearchResult result;
  for (auto _ : state) {
    result = find_best_plans(profile, hw, single_stage_planner_options());
    benchmark::DoNotOptimize(result.ranked.data());
  }
  state.counters["proven"] = result.stats.proven ? 1 : 0;
  state.counters["simulations"] = static_cast<double>(result.stats.simulations);
}
BENCHMARK(BM_Plan48Layers4Devices)->Unit(benchmark::kMillisecond);

// The same with every schedule, as `pipetune plan` searches by default: the multi-stage
// configurations are enumerated with their balance bound (docs/planner.md).
void BM_Plan48Layers4DevicesEverySchedule(benchmark::State& state) {
  const Profile profile = synthetic_profile(48, 64);
  Hardware hw = replicate_device(profile.device, 4);
  hw.link.bandwidth_bytes_per_s = 1e10;
  PlannerOptions options = single_stage_planner_options();
  options.schedules.assign(std::begin(kAllScheduleKinds), std::end(kAllScheduleKinds));
  PlanSearchResult result;
  for (auto _ : state) {
    result = find_best_plans(profile, hw, options);
    benchmark::DoNotOptimize(result.ranked.data());
  }
  report_search(state, result);
}
BENCHMARK(BM_Plan48Layers4DevicesEverySchedule)->Unit(benchmark::kMillisecond)->Iterations(1);

// Issue 15's four 1,000 x 16 cases with every schedule, as `pipetune plan` searches by default:
// range(0) = 0 the synthetic profile (10 GB/s, 0.01 ms links), 1 the lognormal one (20 GB/s),
// 2 the lognormal one capped at 2.5 x its share of the parameters, 3 the synthetic one on
// devices of speeds 1.5, 1, 0.75, 1 repeated. Counter `multi_stage`: whether the best plan runs
// several stages per device.
void BM_Plan1000Layers16DevicesEverySchedule(benchmark::State& state) {
  const bool lognormal = state.range(0) == 1 || state.range(0) == 2;
  const Profile profile = lognormal ? lognormal_profile(1000, 256) : synthetic_profile(1000, 256);
  Hardware hw = replicate_device(profile.device, 16);
  if (lognormal) {
    hw.link.bandwidth_bytes_per_s = 2e10;
  } else {
    set_synthetic_links(hw);
  }
  if (state.range(0) == 2) cap_at_parameter_share(hw, profile, 2.5);
  if (state.range(0) == 3) set_unequal_speeds(hw);
  PlannerOptions options = single_stage_planner_options();
  options.top = 1;
  options.schedules.assign(std::begin(kAllScheduleKinds), std::end(kAllScheduleKinds));
  PlanSearchResult result;
  for (auto _ : state) {
    result = find_best_plans(profile, hw, options);
    benchmark::DoNotOptimize(result.ranked.data());
  }
  report_search(state, result);
  state.counters["multi_stage"] =
      !result.ranked.empty() && result.ranked.front().plan.stages_per_device > 1 ? 1 : 0;
}
BENCHMARK(BM_Plan1000Layers16DevicesEverySchedule)
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Arg(3)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

}  // namespace
}  // namespace pipetune::bench
