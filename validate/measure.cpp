#include "validate/measure.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "executor/executor.hpp"
#include "executor/placement.hpp"
#include "profiler/host_pace.hpp"
#include "sim/compare.hpp"
#include "sim/error.hpp"
#include "sim/replay.hpp"

namespace pipetune::validate {

double MeasuredRun::median_pipeline_ms() const {
  return median(pipeline_ms);
}
double MeasuredRun::median_step_ms() const {
  return median(step_ms);
}
double MeasuredRun::median_host_pace_us() const {
  return host_pace_us.empty() ? 0.0 : median(host_pace_us);
}
double MeasuredRun::median_cpu_share() const {
  return cpu_share.empty() ? -1.0 : median(cpu_share);
}
double MeasuredRun::median_on_cpu_ms() const {
  return on_cpu_ms.empty() ? -1.0 : median(on_cpu_ms);
}
double MeasuredRun::spread_ms() const {
  const double m = median(pipeline_ms);
  std::vector<double> deviations;
  for (double t : pipeline_ms) deviations.push_back(std::abs(t - m));
  return median(deviations);
}

namespace {

// Each device's largest value so far.
void keep_largest(std::vector<std::int64_t>& largest, const std::vector<std::int64_t>& step) {
  largest.resize(std::max(largest.size(), step.size()), 0);
  for (std::size_t d = 0; d < step.size(); ++d) largest[d] = std::max(largest[d], step[d]);
}

}  // namespace

MeasuredRun merge_rounds(std::vector<MeasuredRun> rounds) {
  std::vector<double> round_medians;
  for (const MeasuredRun& r : rounds) round_medians.push_back(r.median_pipeline_ms());
  MeasuredRun merged = std::move(rounds.front());
  auto append = [](std::vector<double>& to, const std::vector<double>& from) {
    to.insert(to.end(), from.begin(), from.end());
  };
  for (std::size_t r = 1; r < rounds.size(); ++r) {
    append(merged.pipeline_ms, rounds[r].pipeline_ms);
    append(merged.step_ms, rounds[r].step_ms);
    append(merged.losses, rounds[r].losses);
    append(merged.host_pace_us, rounds[r].host_pace_us);
    append(merged.cpu_share, rounds[r].cpu_share);
    append(merged.on_cpu_ms, rounds[r].on_cpu_ms);
    keep_largest(merged.peak_memory_bytes, rounds[r].peak_memory_bytes);
    keep_largest(merged.library_memory_bytes, rounds[r].library_memory_bytes);
  }
  const double overall = merged.median_pipeline_ms();
  std::size_t nearest = 0;
  for (std::size_t r = 1; r < rounds.size(); ++r) {
    if (std::abs(round_medians[r] - overall) < std::abs(round_medians[nearest] - overall))
      nearest = r;
  }
  if (nearest > 0) {
    merged.trace = std::move(rounds[nearest].trace);
    merged.traced_step_peak_bytes = std::move(rounds[nearest].traced_step_peak_bytes);
  }
  for (std::size_t d = 0; d < merged.trace.devices.size() && d < merged.peak_memory_bytes.size();
       ++d) {
    merged.trace.devices[d].peak_memory_bytes = merged.peak_memory_bytes[d];
  }
  return merged;
}

void add_cpu_times(MeasuredRun& run, const Trace& step) {
  const double share = cpu_share(step.tasks);
  if (share < 0) return;
  run.cpu_share.push_back(share);
  run.on_cpu_ms.push_back(replay_on_cpu_ms(step, "the measured step"));
}

std::vector<MeasuredRun> measure_plans(
    models::Model& model, const std::vector<Plan>& plans, const RunSettings& settings,
    const std::function<void(std::size_t, std::size_t)>& progress) {
  if (settings.steps < 1)
    throw InputError(Input::Steps, fmt::format("expected at least 1, got {}", settings.steps));
  const int rounds = std::clamp(settings.rounds, 1, settings.steps);
  std::vector<MeasuredRun> runs(plans.size());
  std::vector<std::vector<Trace>> traces(plans.size());
  std::vector<std::vector<std::vector<std::int64_t>>> step_peaks(plans.size());
  const std::size_t total =
      plans.size() * static_cast<std::size_t>(settings.steps + rounds * settings.warmup);
  std::size_t done = 0;
  int step_index = 0;  // a different batch every step, the same sequence for every plan
  for (int round = 0; round < rounds; ++round) {
    // Steps of this round: the measured steps shared out, earlier rounds taking the remainder.
    const int measured = settings.steps / rounds + (round < settings.steps % rounds ? 1 : 0);
    for (std::size_t p = 0; p < plans.size(); ++p) {
      exec::ExecutorOptions options;
      options.devices = exec::executor_devices(plans[p], settings.device, settings.sm_partitions);
      options.sm_partitions = settings.sm_partitions;
      options.threads_per_cpu_device = settings.threads;
      options.seed = settings.seed;
      options.optimizer = exec::parse_optimizer(settings.optimizer);
      options.learning_rate = settings.learning_rate;
      exec::Pipeline pipeline(model, exec::with_executor_devices(plans[p], options.devices),
                              settings.batch, options);
      MeasuredRun& run = runs[p];
      run.plan = plans[p];
      run.host_pace_us.push_back(profiler::measure_host_pace_us(options.devices.front()));
      for (int k = 0; k < settings.warmup + measured; ++k) {
        auto [input, target] = model.make_batch(settings.batch, step_index + k, settings.seed);
        const exec::StepRecord record = pipeline.step(input, target);
        if (k >= settings.warmup) {
          run.pipeline_ms.push_back(record.pipeline_ms);
          run.step_ms.push_back(record.step_ms);
          run.losses.push_back(record.loss);
          keep_largest(run.peak_memory_bytes, record.peak_memory_bytes);
          keep_largest(run.library_memory_bytes, record.library_memory_bytes);
          traces[p].push_back(exec::measured_trace(pipeline, record, model.name));
          add_cpu_times(run, traces[p].back());
          step_peaks[p].push_back(record.peak_memory_bytes);
        }
        if (progress) progress(++done, total);
      }
    }
    step_index += settings.warmup + measured;
  }
  for (std::size_t p = 0; p < plans.size(); ++p) {
    const std::size_t median = median_step(runs[p].pipeline_ms);
    Trace& trace = traces[p][median];
    runs[p].traced_step_peak_bytes = step_peaks[p][median];
    for (std::size_t d = 0; d < trace.devices.size() && d < runs[p].peak_memory_bytes.size(); ++d) {
      trace.devices[d].peak_memory_bytes = runs[p].peak_memory_bytes[d];
    }
    runs[p].trace = std::move(trace);
  }
  return runs;
}

}  // namespace pipetune::validate
