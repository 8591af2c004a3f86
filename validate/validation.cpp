#include "validate/validation.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <utility>

#include "executor/models/model.hpp"
#include "executor/models/shared_tensors.hpp"
#include "executor/placement.hpp"
#include "profiler/profiler.hpp"
#include "sim/balance.hpp"
#include "sim/error.hpp"
#include "sim/profile_pool.hpp"
#include "sim/simulator.hpp"

namespace pipetune::validate {

namespace fs = std::filesystem;

std::size_t Validation::predicted_best() const {
  std::size_t best = 0;
  for (std::size_t k = 0; k < plans.size(); ++k) {
    if (headline(plans[k]).predicted_ms < headline(plans[best]).predicted_ms) best = k;
  }
  return best;
}

std::size_t Validation::measured_best() const {
  std::size_t best = 0;
  for (std::size_t k = 0; k < plans.size(); ++k) {
    if (plans[k].measured.median_pipeline_ms() < plans[best].measured.median_pipeline_ms())
      best = k;
  }
  return best;
}

bool Validation::predicted_best_within_noise() const {
  if (plans.empty()) return true;
  const MeasuredRun& p = plans[predicted_best()].measured;
  const MeasuredRun& m = plans[measured_best()].measured;
  return p.median_pipeline_ms() - m.median_pipeline_ms() <= p.spread_ms() + m.spread_ms();
}

namespace {

SimulationOptions full_record() {
  SimulationOptions o;
  o.record_edges = true;
  o.worst_order_peaks = true;
  return o;
}

Trace predict(const Profile& profile, const Hardware& hardware, const Plan& plan) {
  return trace_from_simulation(Simulator(profile, hardware).run(plan, full_record()),
                               profile.model);
}

Hardware without_calibration(Hardware hardware) {
  hardware.calibration = {};
  return hardware;
}

// A profile taken now, at `sizes` (empty: the profiler's default sizes).
Profile profile_now(models::Model& model, const ValidationOptions& options,
                    const std::vector<std::int64_t>& sizes) {
  profiler::ProfileOptions po;
  po.device = options.run.device;
  po.batch_size = options.run.batch;
  po.micro_batch_sizes = sizes;
  po.repeats = options.profile_repeats;
  po.warmup = options.profile_warmup;
  po.seed = options.run.seed;
  po.threads = options.run.threads;
  po.sm_partitions = options.run.sm_partitions;
  if (po.threads == 0 && options.run.device == "cpu") {
    // The threads each CPU device will have when the executor runs the plans.
    po.threads = exec::cpu_threads_per_device(options.devices);
  }
  po.co_runners = options.co_runners >= 0       ? options.co_runners
                  : options.run.device == "cpu" ? options.devices - 1
                                                : 0;
  if (options.progress) {
    po.progress = [&](std::size_t done, std::size_t total) {
      options.progress("profile", done, total);
    };
  }
  return std::move(profiler::profile_model(model, po).profile);
}

Profile obtain_profile(models::Model& model, const ValidationOptions& options, Validation& v) {
  if (!options.profile_path.empty()) {
    Profile profile = load_profile(options.profile_path);
    const std::string& src = options.profile_path;
    if (profile.model != model.name) {
      throw InputError(fmt::format("{}: \"model\" is \"{}\", but the model builds \"{}\"", src,
                                   profile.model, model.name));
    }
    if (profile.batch_size != options.run.batch) {
      throw InputError(fmt::format("{}: \"batch_size\" is {}, but the batch size is {}", src,
                                   profile.batch_size, options.run.batch));
    }
    // A profile taken on a share times each layer as a stage on a share runs it; one taken on
    // the whole GPU would predict every stage about K times too fast.
    if (options.run.sm_partitions > 0 && profile.device.sm_shares != options.run.sm_partitions) {
      throw InputError(fmt::format(
          "{}: taken on {}, but the plans run on {} shares of the GPU's SMs: profile with "
          "--sm-partitions {}",
          src,
          profile.device.sm_shares > 1 ? fmt::format("1 of {} shares", profile.device.sm_shares)
                                       : "the whole device",
          options.run.sm_partitions, options.run.sm_partitions));
    }
    if (profile.layer_count() != model.layer_names.size()) {
      throw InputError(fmt::format("{}: {} layers, but the model has {}", src,
                                   profile.layer_count(), model.layer_names.size()));
    }
    v.profile_path = options.profile_path;
    return profile;
  }
  const auto started = std::chrono::steady_clock::now();
  Profile profile = profile_now(model, options, {});
  v.profile_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  v.profiled = true;
  v.profile_path = (fs::path(options.out_dir) / "profile.json").string();
  if (options.profile_rounds > 1) {
    // The pool is written as profile.json once every round is in.
    v.round_profile_paths.push_back((fs::path(options.out_dir) / "profile-1.json").string());
    save_profile(profile, v.round_profile_paths.back());
  } else {
    save_profile(profile, v.profile_path);
  }
  return profile;
}

Hardware obtain_hardware(const ValidationOptions& options, const Profile& profile, int layers) {
  if (!options.hardware_path.empty()) return load_hardware(options.hardware_path);
  // Shares of one GPU: devices like the profiled share, their hand-overs on that GPU (no link).
  if (options.run.sm_partitions > 0) return replicate_device(profile.device, options.devices);
  if (options.probe) return options.probe(layers);
  return first_devices(profiler::probe_hardware(options.run.device, options.devices),
                       options.devices);
}

// The measured sizes a later profile round retimes: those the plans' micro-batches take, and
// for a size the first profile did not measure, the two it is interpolated between (as
// CostModel reads them).
std::vector<std::int64_t> sizes_to_reprofile(const std::vector<std::int64_t>& measured,
                                             const std::vector<Plan>& plans, std::int64_t batch) {
  std::vector<std::int64_t> out;
  auto add = [&](std::int64_t size) {
    if (std::find(out.begin(), out.end(), size) == out.end()) out.push_back(size);
  };
  for (const Plan& plan : plans) {
    for (std::int64_t size : split_batch(batch, plan.chunks)) {
      if (std::find(measured.begin(), measured.end(), size) != measured.end()) {
        add(size);
      } else if (measured.size() == 1) {
        add(measured.front());
      } else if (!measured.empty()) {
        const auto upper = std::upper_bound(measured.begin(), measured.end(), size);
        const std::size_t k =
            std::clamp<std::size_t>(static_cast<std::size_t>(upper - measured.begin()), 1,
                                    measured.size() - 1) -
            1;
        add(measured[k]);
        add(measured[k + 1]);
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The memory model's peaks in the traced step's own order (empty: a task is not in the trace).
std::vector<std::int64_t> measured_order_peaks(const Profile& profile, const Hardware& hardware,
                                               const MeasuredRun& run) {
  SimulationOptions options;
  options.record_tasks = false;
  options.record_memory = false;
  options.measured_times = measured_task_times(run.trace, "the measured step");
  const SimulationResult r =
      Simulator(profile, without_calibration(hardware)).run(run.plan, options);
  // In the measured trace's order of devices (the executor's), paired by the stages they hold,
  // as compare_traces pairs them.
  std::vector<std::int64_t> peaks;
  for (const TraceDevice& measured : run.trace.devices) {
    const auto it = std::find_if(r.devices.begin(), r.devices.end(), [&](const DeviceReport& d) {
      return d.stages == measured.stages;
    });
    if (it == r.devices.end() || it->measured_order_peak_bytes == 0) return {};
    peaks.push_back(it->measured_order_peak_bytes);
  }
  return peaks;
}

// Each plan's predictions, written beside its measured trace and compared with it.
PlanValidation judge(const Profile& profile, const Hardware& hardware, MeasuredRun run,
                     const std::string& stem) {
  PlanValidation pv;
  pv.measured = std::move(run);
  const Plan& plan = pv.measured.plan;
  pv.predicted = predict(profile, without_calibration(hardware), plan);
  pv.predicted_calibrated =
      hardware.calibration.empty() ? pv.predicted : predict(profile, hardware, plan);
  pv.predicted_calibrated.kind = "predicted";
  const double measured_ms = pv.measured.median_pipeline_ms();
  pv.uncalibrated =
      compare_traces(pv.predicted, pv.measured.trace, stem + ".measured.trace.json", measured_ms);
  pv.calibrated = compare_traces(pv.predicted_calibrated, pv.measured.trace,
                                 stem + ".measured.trace.json", measured_ms);
  pv.measured_order_peak_bytes = measured_order_peaks(profile, hardware, pv.measured);
  // With the calibration the headline uses (`hardware` carries it when it is used).
  pv.interval = iteration_interval(Simulator(profile, hardware), profile, plan);
  for (double ms : pv.measured.pipeline_ms) pv.steps_inside += pv.interval.holds(ms) ? 1 : 0;
  pv.plan_path = stem + ".plan.json";
  pv.measured_trace_path = stem + ".measured.trace.json";
  pv.predicted_trace_path = stem + ".predicted.trace.json";
  save_plan(plan, profile, pv.plan_path);
  save_trace(pv.measured.trace, pv.measured_trace_path);
  save_trace(pv.predicted, pv.predicted_trace_path);
  if (!hardware.calibration.empty()) {
    pv.calibrated_trace_path = stem + ".calibrated.trace.json";
    save_trace(pv.predicted_calibrated, pv.calibrated_trace_path);
  }
  return pv;
}

}  // namespace

std::optional<std::string> outside_fitted_sizes(const std::vector<Plan>& fitted_on,
                                                const std::vector<Plan>& predicted,
                                                std::int64_t batch) {
  auto range = [batch](const std::vector<Plan>& plans) {
    std::int64_t low = std::numeric_limits<std::int64_t>::max(), high = 0;
    for (const Plan& p : plans) {
      for (std::int64_t size : split_batch(batch, p.chunks)) {
        low = std::min(low, size);
        high = std::max(high, size);
      }
    }
    return std::pair{low, high};
  };
  if (fitted_on.empty() || predicted.empty()) return std::nullopt;
  const auto [fit_low, fit_high] = range(fitted_on);
  const auto [low, high] = range(predicted);
  if (low >= fit_low && high <= fit_high) return std::nullopt;
  auto samples = [](std::int64_t a, std::int64_t b) {
    return a == b ? fmt::format("{} sample{}", a, a == 1 ? "" : "s")
                  : fmt::format("{} to {} samples", a, b);
  };
  return fmt::format(
      "fitted on micro-batches of {}, the plans it would predict have {}: a calibration is "
      "judged only within the sizes it was fitted on",
      samples(fit_low, fit_high), samples(low, high));
}

namespace {

// Fits a calibration on the runs of the calibration plans and keeps it where it earns its
// place (choose_calibration): `hardware` then carries it and the model's error on this machine,
// which widens every interval from here on (sim/interval.hpp).
void fit_calibration(const Profile& profile, Hardware& hardware, std::vector<MeasuredRun> runs,
                     const std::vector<Plan>& validated, const std::string& out_dir,
                     Validation& v) {
  std::vector<CalibrationRun> fit_runs;
  for (const auto& r : runs) {
    fit_runs.push_back({r.plan, r.trace, r.median_pipeline_ms(), measurement_noise(r.pipeline_ms)});
  }
  // Applied only where it earns its place; else the report says why, and predicts without.
  CalibrationChoice choice = choose_calibration(profile, hardware, fit_runs);
  if (choice.used) {
    std::vector<Plan> fitted_on;
    for (const auto& r : runs) fitted_on.push_back(r.plan);
    if (auto outside = outside_fitted_sizes(fitted_on, validated, profile.batch_size)) {
      choice.used = false;
      choice.reason = "not used: " + *outside;
    }
  }
  v.calibration_reason = choice.reason;
  if (!choice.used) v.unused_calibration = choice.fitted;
  hardware.calibration = choice.used ? choice.fitted : Calibration{};
  v.calibration_fitted = choice.used;
  // The model's error as the headline predicts: out of sample where the calibration is used (a
  // fit on the other runs), uncalibrated where not.
  const std::vector<double>& errors =
      choice.used ? choice.out_of_sample_error : choice.uncalibrated_error;
  if (errors.size() >= 2) {
    double squares = 0.0;
    for (double e : errors) squares += e * e;
    hardware.model_error = std::sqrt(squares / static_cast<double>(errors.size()));
  }
  for (std::size_t k = 0; k < runs.size(); ++k) {
    v.calibration_runs.push_back(
        judge(profile, hardware, std::move(runs[k]),
              (fs::path(out_dir) / fmt::format("calibration-{}", k + 1)).string()));
  }
}

using Measure =
    std::function<std::vector<MeasuredRun>(const std::vector<Plan>&, const RunSettings&,
                                           const std::function<void(std::size_t, std::size_t)>&)>;

// The runs in profile rounds: before each round but the first (whose profile is `profile`), a
// profile of the sizes the plans read; each round runs every plan once, its share of the steps.
// `profile` becomes the rounds' pool, written as the validation's profile.
std::vector<MeasuredRun> run_in_profile_rounds(models::Model& model,
                                               const ValidationOptions& options,
                                               const std::vector<Plan>& plans,
                                               const Measure& measure, Profile& profile,
                                               Validation& v) {
  const int rounds = options.profile_rounds;
  const RunSettings& run = options.run;
  v.reprofiled_sizes = sizes_to_reprofile(profile.micro_batch_sizes, plans, run.batch);
  std::vector<Profile> profiles{profile};
  std::vector<std::vector<MeasuredRun>> by_plan(plans.size());
  const std::size_t total =
      plans.size() * static_cast<std::size_t>(run.steps + rounds * run.warmup);
  std::size_t done = 0;
  for (int r = 0; r < rounds; ++r) {
    if (r > 0) {
      const auto started = std::chrono::steady_clock::now();
      profiles.push_back(profile_now(model, options, v.reprofiled_sizes));
      v.profile_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      v.round_profile_paths.push_back(
          (fs::path(options.out_dir) / fmt::format("profile-{}.json", r + 1)).string());
      save_profile(profiles.back(), v.round_profile_paths.back());
    }
    RunSettings rs = run;
    rs.rounds = 1;
    rs.steps = run.steps / rounds + (r < run.steps % rounds ? 1 : 0);
    std::size_t this_round = 0;
    std::vector<MeasuredRun> measured = measure(plans, rs, [&](std::size_t d, std::size_t) {
      this_round = d;
      if (options.progress) options.progress("run", done + d, total);
    });
    done += this_round;
    for (std::size_t p = 0; p < plans.size(); ++p) by_plan[p].push_back(std::move(measured[p]));
  }
  profile = pool_profiles(profiles, v.round_profile_paths);
  save_profile(profile, v.profile_path);
  std::vector<MeasuredRun> runs;
  for (auto& rounds_of_plan : by_plan) runs.push_back(merge_rounds(std::move(rounds_of_plan)));
  return runs;
}

// Options no validation can run with, refused before any work.
void check_options(const ValidationOptions& options) {
  if (options.out_dir.empty())
    throw InputError(Input::OutputFolder, "a folder for the traces and the report is needed");
  if (options.devices < 1)
    throw InputError(Input::Devices, fmt::format("expected at least 1, got {}", options.devices));
  if (options.top < 1)
    throw InputError(Input::Top, fmt::format("expected at least 1, got {}", options.top));
  if (options.profile_rounds < 1) {
    throw InputError(
        fmt::format("profile rounds: expected at least 1, got {}", options.profile_rounds));
  }
  if (options.profile_rounds > 1 && !options.profile_path.empty()) {
    throw InputError(fmt::format(
        "{}: a profile given is not taken again: {} profile rounds need the profiles taken now",
        options.profile_path, options.profile_rounds));
  }
  if (options.run.steps < options.profile_rounds) {
    throw InputError(Input::Steps,
                     fmt::format("expected at least {} (a step a profile round), got {}",
                                 options.profile_rounds, options.run.steps));
  }
}

// The model's shared tensors that must stay on one stage: those the executor cannot give each
// stage a copy of (executor/tied_copies.hpp). Refused where the planner would have to keep
// them together, and where a given plan splits them.
std::vector<models::SharedTensor> unsplittable_tensors(models::Model& model,
                                                       const ValidationOptions& options) {
  std::vector<models::SharedTensor> unsplittable = models::shared_tensors(model);
  std::erase_if(unsplittable, [&](const models::SharedTensor& s) {
    return models::why_not_split(model, s).empty();
  });
  for (std::size_t k = 0; k < options.plans.size(); ++k) {
    models::check_tied_split(model, options.plans[k].balance,
                             k < options.plan_sources.size() ? options.plan_sources[k] : "plan");
  }
  if (!unsplittable.empty() && options.plans.empty()) {
    throw InputError(fmt::format(
        "model: {}, and {}: the planner cannot yet keep them on one stage; validate plans that "
        "do (--plan), or untie them",
        models::describe(model, unsplittable.front()),
        models::why_not_split(model, unsplittable.front())));
  }
  return unsplittable;
}

// The plans given, checked, or else the planner's top ones.
std::vector<Plan> plans_to_validate(const ValidationOptions& options, const Profile& profile,
                                    const Hardware& hardware, const std::string& hardware_source,
                                    Validation& v) {
  std::vector<Plan> plans;
  if (!options.plans.empty()) {
    for (std::size_t k = 0; k < options.plans.size(); ++k) {
      check_plan(options.plans[k], profile, hardware,
                 k < options.plan_sources.size() ? options.plan_sources[k] : "plan");
      plans.push_back(options.plans[k]);
    }
  } else {
    PlannerOptions po = options.planner;
    po.top = static_cast<std::size_t>(options.top);
    if (options.progress)
      po.progress = [&](std::size_t d, std::size_t t) { options.progress("plan", d, t); };
    const PlanSearchResult result = find_best_plans(profile, hardware, po);
    if (result.ranked.empty()) {
      throw WorkError(
          result.none_fits_proven
              ? fmt::format("no plan of {} fits the memory of {}", profile.model, hardware_source)
              : fmt::format("no plan of {} that fits the memory of {} found before the "
                            "planner's search budget ran out (`pipetune plan --budget` searches "
                            "longer: a plan may fit)",
                            profile.model, hardware_source));
    }
    for (const auto& c : result.ranked) plans.push_back(c.plan);
    v.planner_proven = result.stats.proven;
    v.planner_space = result.search_space;
  }

  return plans;
}

// The plans a calibration is fitted on, and their runs where they run before the validated
// plans (one profile round); none where the calibration is reused or none is asked for.
struct CalibrationPlans {
  std::vector<Plan> fit_on;
  std::vector<MeasuredRun> measured;
};

CalibrationPlans calibration_runs(const ValidationOptions& options, const Profile& profile,
                                  const Hardware& hardware, const std::vector<Plan>& plans,
                                  const std::vector<models::SharedTensor>& unsplittable,
                                  const Measure& measure) {
  CalibrationPlans out;
  if (!hardware.calibration.empty() || options.calibration_plans <= 0) return out;
  // Stages of the one-stage-per-device calibration plans: the devices the plans use.
  const int stages = plans.front().stages() / std::max(1, plans.front().stages_per_device);
  out.fit_on = calibration_plans(profile, hardware, stages, plans, options.calibration_plans);
  // Time-balanced calibration plans may split what must stay on one stage: left out.
  std::erase_if(out.fit_on, [&](const Plan& p) {
    return models::split_by(unsplittable, p.balance).has_value();
  });
  if (!out.fit_on.empty() && options.profile_rounds <= 1) {
    RunSettings rs = options.run;
    rs.steps = std::max(1, options.calibration_steps);
    rs.rounds = 1;
    out.measured = measure(out.fit_on, rs, [&](std::size_t d, std::size_t t) {
      if (options.progress) options.progress("calibrate", d, t);
    });
  }
  return out;
}

// Ranks among the plans validated, 1 = fastest, predicted and measured.
void rank_plans(Validation& v) {
  for (auto& p : v.plans) {
    p.predicted_rank = p.measured_rank = 1;
    for (const auto& q : v.plans) {
      p.predicted_rank += v.headline(q).predicted_ms < v.headline(p).predicted_ms ? 1 : 0;
      p.measured_rank += q.measured.median_pipeline_ms() < p.measured.median_pipeline_ms() ? 1 : 0;
    }
  }
}

}  // namespace

std::size_t Validation::steps_inside() const {
  std::size_t n = 0;
  for (const auto& p : plans) n += p.steps_inside;
  return n;
}

std::size_t Validation::steps_measured() const {
  std::size_t n = 0;
  for (const auto& p : plans) n += p.measured.pipeline_ms.size();
  return n;
}

std::vector<Plan> calibration_plans(const Profile& profile, const Hardware& hardware, int stages,
                                    const std::vector<Plan>& validated, int count) {
  const CostModel costs(profile);
  const Simulator simulator(profile, hardware);
  const int batch = static_cast<int>(profile.batch_size);
  // Varied shapes: micro-batch sizes and checkpoint modes change every task's duration and the
  // copies' sizes, which is what lets the fit tell a scale from an overhead.
  struct Shape {
    int chunks;
    CheckpointMode checkpoint;
    ScheduleKind schedule;
  };
  std::vector<Shape> shapes = {{2, CheckpointMode::Never, ScheduleKind::GPipe},
                               {8, CheckpointMode::Always, ScheduleKind::OneFOneB},
                               {4, CheckpointMode::ExceptLast, ScheduleKind::GPipe},
                               {1, CheckpointMode::Never, ScheduleKind::GPipe},
                               {16, CheckpointMode::Never, ScheduleKind::OneFOneB},
                               {3, CheckpointMode::Always, ScheduleKind::GPipe}};
  // First the validated plans' fewest and most chunks: a calibration is used only within the
  // micro-batch sizes it was fitted on (fit_calibration), and judged out of sample among them.
  // Fitted on micro-batches of 1 and 2 samples, one made plans of 4 and 8 47-54 % short.
  if (!validated.empty()) {
    const auto [fewest, most] =
        std::minmax_element(validated.begin(), validated.end(),
                            [](const Plan& a, const Plan& b) { return a.chunks < b.chunks; });
    std::vector<Shape> bracket{{fewest->chunks, CheckpointMode::Never, ScheduleKind::GPipe}};
    if (most->chunks != fewest->chunks)
      bracket.push_back({most->chunks, CheckpointMode::Always, ScheduleKind::OneFOneB});
    shapes.insert(shapes.begin(), bracket.begin(), bracket.end());
  }
  std::vector<Plan> out;
  // `plan` gives the schedule, stages per device and devices; `s` the chunks and checkpoint.
  auto add = [&](Plan plan, const Shape& s, int stage_count) {
    if (static_cast<int>(out.size()) >= count) return;
    plan.chunks = std::min(s.chunks, batch);
    plan.optimizer_state_factor =
        validated.empty() ? 0.0 : validated.front().optimizer_state_factor;
    plan.checkpoint = s.checkpoint;
    plan.balance = time_balanced(costs, hardware, stage_count, plan);
    if (plan.balance.empty()) return;
    if (std::find(validated.begin(), validated.end(), plan) != validated.end()) return;
    if (std::find(out.begin(), out.end(), plan) != out.end()) return;
    try {
      check_plan(plan, profile, hardware, "calibration plan");
    } catch (const InputError&) {
      return;  // a chunk count this schedule cannot run
    }
    SimulationOptions lean;
    lean.record_tasks = false;
    lean.record_memory = false;
    if (!simulator.run(plan, lean).fits()) return;
    out.push_back(plan);
  };
  // First the validated plans' own layouts (schedule, stages per device, devices), taken in
  // turn, each at other chunk counts and checkpoint modes: a calibration is judged on plans like
  // the ones it will predict, where a two-stages-per-device schedule's extra copies and
  // switches show.
  std::vector<Plan> layouts;
  for (const Plan& v : validated) {
    Plan layout;
    layout.schedule = v.schedule;
    layout.stages_per_device = v.stages_per_device;
    layout.devices = v.devices;
    layout.balance.assign(v.balance.size(), 0);  // only its length tells layouts apart
    if (std::find(layouts.begin(), layouts.end(), layout) == layouts.end())
      layouts.push_back(layout);
  }
  for (std::size_t k = 0; k < shapes.size() && !layouts.empty(); ++k) {
    const Plan& layout = layouts[k % layouts.size()];
    add(layout, shapes[k], static_cast<int>(layout.balance.size()));
  }
  // Then one stage per device on the devices the plans use, in the shapes' own schedules.
  for (const Shape& s : shapes) {
    Plan plan;
    plan.schedule = s.schedule;
    add(plan, s, stages);
  }
  return out;
}

Validation run_validation(const ValidationOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  check_options(options);

  Validation v;
  v.model_spec = options.model_spec;
  v.device = options.run.device;
  v.batch = options.run.batch;
  models::ModelOptions mo;
  mo.dtype = options.run.float64 ? c10::kDouble : c10::kFloat;
  mo.deferred_batch_norm = options.deferred_batch_norm;
  mo.seed = options.run.seed;
  models::Model model = models::build_model(options.model_spec, mo);
  models::check_model_batch(model, options.run.batch);
  const std::vector<models::SharedTensor> unsplittable = unsplittable_tensors(model, options);
  fs::create_directories(options.out_dir);  // only once the model and its data are known good
  v.model = model.name;

  const Measure measure = [&](const std::vector<Plan>& to_run, const RunSettings& settings,
                              const std::function<void(std::size_t, std::size_t)>& progress) {
    return options.measure ? options.measure(to_run, settings, progress)
                           : measure_plans(model, to_run, settings, progress);
  };
  Profile profile = obtain_profile(model, options, v);
  Hardware hardware = obtain_hardware(options, profile, static_cast<int>(model.layer_names.size()));
  const std::string hardware_source =
      options.hardware_path.empty() ? "the probed hardware" : options.hardware_path;

  const std::vector<Plan> plans = plans_to_validate(options, profile, hardware, hardware_source, v);

  // The calibration: reused, or fitted on other plans run briefly; fitted once the profile is
  // final. With profile rounds its plans run in every round beside the validated ones, so that
  // the model's error it measures is not one minute's drift.
  const bool reuse = !hardware.calibration.empty() && !options.recalibrate;
  if (!reuse) hardware.calibration = {};
  CalibrationPlans calibration =
      calibration_runs(options, profile, hardware, plans, unsplittable, measure);

  // The calibration fitted where there is one, and the hardware written: before the runs where
  // the profile is final already, so that a run that fails leaves it behind.
  const auto fit_and_save = [&] {
    if (!calibration.measured.empty()) {
      fit_calibration(profile, hardware, std::move(calibration.measured), plans, options.out_dir,
                      v);
    }
    v.hardware = hardware;
    v.hardware_path = (fs::path(options.out_dir) / "hardware.json").string();
    save_hardware(hardware, v.hardware_path);
  };
  // The real runs, interleaved, and the comparisons.
  std::vector<MeasuredRun> runs;
  if (options.profile_rounds > 1) {
    std::vector<Plan> all = plans;
    all.insert(all.end(), calibration.fit_on.begin(), calibration.fit_on.end());
    runs = run_in_profile_rounds(model, options, all, measure, profile, v);
    const auto first_calibration = runs.begin() + static_cast<std::ptrdiff_t>(plans.size());
    calibration.measured.assign(std::make_move_iterator(first_calibration),
                                std::make_move_iterator(runs.end()));
    runs.erase(first_calibration, runs.end());
    fit_and_save();
  } else {
    fit_and_save();
    runs = measure(plans, options.run, [&](std::size_t d, std::size_t t) {
      if (options.progress) options.progress("run", d, t);
    });
  }
  for (std::size_t k = 0; k < runs.size(); ++k) {
    v.plans.push_back(judge(profile, hardware, std::move(runs[k]),
                            (fs::path(options.out_dir) / fmt::format("plan-{}", k + 1)).string()));
  }
  rank_plans(v);
  v.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return v;
}

}  // namespace pipetune::validate
