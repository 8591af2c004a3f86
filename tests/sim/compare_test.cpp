// Prediction against measurement, on hand-built pairs of traces with known differences.

#include "sim/compare.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "sim/error.hpp"
#include "sim/simulator.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

struct Scenario {
  Profile profile;
  Hardware hardware;
  Plan plan;
  SimulationResult result;
  Trace predicted;
};

Scenario scenario(std::vector<int> balance, int chunks,
                  CheckpointMode mode = CheckpointMode::ExceptLast) {
  testing::LayerSpec a{1.0, 2.0, 1000, 400, 50, 0}, b{0.5, 1.5, 500, 4000, 10, 0};
  Scenario s;
  s.profile = testing::make_profile({a, b, a, b}, 8, 10);
  s.hardware = replicate_device(s.profile.device, static_cast<int>(balance.size()));
  s.hardware.link.bandwidth_bytes_per_s = 1e6;
  s.hardware.link.latency_ms = 0.1;
  s.plan = testing::make_plan(std::move(balance), chunks, mode);
  s.result = Simulator(s.profile, s.hardware).run(s.plan);
  s.predicted = trace_from_simulation(s.result, "m");
  return s;
}

// The measured run of the same plan: every time stretched by `factor`, shifted by `shift`.
Trace stretched(const Trace& t, double factor, double shift) {
  Trace m = t;
  m.kind = "measured";
  for (auto& task : m.tasks) {
    task.start_ms = task.start_ms * factor + shift;
    task.end_ms = task.end_ms * factor + shift;
  }
  m.iteration_ms = t.iteration_ms * factor;
  return m;
}

// Copies of 256 B take 0.5 ms; 256 B + 1 MB take 1 ms more: latency 0.5 ms, 1e9 bytes/s. The
// medians ignore one outlier each; a large copy no slower than a small one stays finite.
// The shown step is a lower median: at most (n-1)/2 steps are faster, and it with the ones no
// slower than it make up more than (n-1)/2; checked on random step times with ties.
TEST(MedianStep, IsTheLowerMedianAndAStepThatHappened) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<double> ms(1 + rng() % 12);
    for (double& t : ms) t = static_cast<double>(rng() % 5);
    const std::size_t k = median_step(ms);
    ASSERT_LT(k, ms.size());
    std::size_t faster = 0, not_slower = 0;
    for (double t : ms) {
      faster += t < ms[k] ? 1 : 0;
      not_slower += t <= ms[k] ? 1 : 0;
    }
    const std::size_t rank = (ms.size() - 1) / 2;
    EXPECT_LE(faster, rank);
    EXPECT_GT(not_slower, rank);
  }
  EXPECT_EQ(median_step({}), 0u);
  EXPECT_EQ(median_step({5, 1, 3, 2}), 3u);  // sorted 1 2 3 5: the lower middle is 2, step 3
}

TEST(LinkFromCopies, LatencyAndBandwidthFromTheMedians) {
  const Link link = link_from_copies({0.5, 9.0, 0.5}, 256, {1.5, 1.5, 0.1}, 256 + 1'000'000);
  EXPECT_DOUBLE_EQ(link.latency_ms, 0.5);
  EXPECT_NEAR(link.bandwidth_bytes_per_s, 1e9, 1e-3);
  const Link flat = link_from_copies({2.0}, 256, {1.0}, 1 << 20);
  EXPECT_DOUBLE_EQ(flat.bandwidth_bytes_per_s, 1e15);
}

TEST(CompareTraces, KnownStretchAndOffsets) {
  const Scenario s = scenario({2, 2}, 4);
  Trace measured = stretched(s.predicted, 1.25, 3.0);
  measured.devices[0].peak_memory_bytes =
      s.predicted.devices[0].peak_memory_bytes * 2;  // we predict half
  measured.devices[1].peak_memory_bytes = s.predicted.devices[1].peak_memory_bytes;
  const TraceComparison c = compare_traces(s.predicted, measured, "m.json");
  EXPECT_DOUBLE_EQ(c.measured_ms, 1.25 * s.predicted.iteration_ms);
  EXPECT_NEAR(c.time_error, 1.0 / 1.25 - 1.0, 1e-12);  // -20 %
  EXPECT_NEAR(c.memory_error[0], -0.5, 1e-12);
  EXPECT_NEAR(c.memory_error[1], 0.0, 1e-12);
  EXPECT_EQ(c.unmatched, 0u);
  ASSERT_EQ(c.tasks.size(), s.predicted.tasks.size());
  for (const auto& t : c.tasks) {
    // Aligned at each iteration's start, every offset is the stretch of the predicted time.
    EXPECT_NEAR(t.measured_start_ms, 1.25 * t.predicted_start_ms, 1e-9) << t.label();
    EXPECT_NEAR(t.start_offset_ms(), -0.25 * t.predicted_start_ms, 1e-9) << t.label();
    if (t.measured_ms() > 0) {
      EXPECT_NEAR(t.duration_error(), -0.2, 1e-9) << t.label();
    }
  }
  EXPECT_NEAR(c.median_abs_duration_error, 0.2, 1e-9);
  EXPECT_TRUE(c.same_critical_path);
  EXPECT_DOUBLE_EQ(c.critical_path_agreement, 1.0);
  // A median over steps replaces the trace's own time when given.
  EXPECT_NEAR(
      compare_traces(s.predicted, measured, "m.json", 2.0 * s.predicted.iteration_ms).time_error,
      -0.5, 1e-12);
}

TEST(CompareTraces, OneSlowTaskIsTheMostMispredictedAndMovesTheCriticalPath) {
  const Scenario s = scenario({2, 2}, 4, CheckpointMode::Never);
  Trace measured = s.predicted;
  measured.kind = "measured";
  // 0F3 takes 50 ms longer: everything after it on its device shifts.
  for (auto& t : measured.tasks) {
    if (t.label() == "0F3") t.end_ms += 50.0;
  }
  const TraceComparison c =
      compare_traces(s.predicted, measured, "m.json", s.predicted.iteration_ms + 50.0);
  ASSERT_FALSE(c.most_mispredicted(1).empty());
  EXPECT_EQ(c.most_mispredicted(1)[0].label(), "0F3");
  EXPECT_NEAR(c.most_mispredicted(1)[0].measured_ms() - c.most_mispredicted(1)[0].predicted_ms(),
              50.0, 1e-9);
  // The measured critical path runs through the slow task.
  EXPECT_NE(std::find(c.measured_critical_path.begin(), c.measured_critical_path.end(), "0F3"),
            c.measured_critical_path.end());
}

TEST(CompareTraces, DevicesArePairedByTheirStagesNotTheirOrder) {
  // Stage 0 on cpu:1, stage 1 on cpu:0: the prediction lists cpu:0 (stage 1) first, the
  // executor's measurement cpu:1 (stage 0), the device its first stage uses.
  Scenario s = scenario({2, 2}, 4);
  s.plan.devices = {"cpu:1", "cpu:0"};
  s.predicted = trace_from_simulation(Simulator(s.profile, s.hardware).run(s.plan), "m");
  ASSERT_EQ(s.predicted.devices[0].stages, (std::vector<int>{1}));
  Trace measured = stretched(s.predicted, 1.0, 0.0);
  std::swap(measured.devices[0], measured.devices[1]);
  measured.devices[0].peak_memory_bytes =
      s.predicted.devices[1].peak_memory_bytes;  // stage 0: exact
  measured.devices[1].peak_memory_bytes =
      2 * s.predicted.devices[0].peak_memory_bytes;  // stage 1: half
  const TraceComparison c = compare_traces(s.predicted, measured, "m.json");
  EXPECT_EQ(c.devices, (std::vector<std::string>{"cpu:0", "cpu:1"}));
  EXPECT_NEAR(c.memory_error[0], -0.5, 1e-12);
  EXPECT_NEAR(c.memory_error[1], 0.0, 1e-12);
}

TEST(CompareTraces, DifferentPlansAreRefused) {
  const Scenario a = scenario({2, 2}, 4), b = scenario({1, 3}, 4);
  EXPECT_THROW(compare_traces(a.predicted, stretched(b.predicted, 1.0, 0.0), "m.json"), InputError);
}

// Calibration runs of three plans, each measured as its prediction stretched by `factors[k]`.
std::vector<CalibrationRun> stretched_runs(const std::vector<double>& factors) {
  const Scenario plans[] = {scenario({2, 2}, 4), scenario({1, 3}, 2), scenario({3, 1}, 8)};
  std::vector<CalibrationRun> runs;
  for (std::size_t k = 0; k < factors.size(); ++k) {
    const Scenario& s = plans[k % 3];
    runs.push_back(
        {s.plan, stretched(s.predicted, factors[k], 0.0), factors[k] * s.predicted.iteration_ms});
  }
  return runs;
}

TEST(ChooseCalibration, UsedWhenItHelpsOnPlansItWasNotFittedOn) {
  const Scenario s = scenario({2, 2}, 4);
  const CalibrationChoice c =
      choose_calibration(s.profile, s.hardware, stretched_runs({1.25, 1.25, 1.25}));
  EXPECT_TRUE(c.used) << c.reason;
  ASSERT_EQ(c.out_of_sample_error.size(), 3u);
  for (std::size_t k = 0; k < 3; ++k) {
    EXPECT_NEAR(c.uncalibrated_error[k], 1.0 / 1.25 - 1.0, 1e-9);
    EXPECT_NEAR(c.out_of_sample_error[k], 0.0, 1e-6);
    EXPECT_NEAR(c.in_sample_error[k], 0.0, 1e-6);
  }
  EXPECT_THAT(c.reason, ::testing::StartsWith("used: "));
}

// A gain out of sample no larger than the runs' own noise is luck: the plans run 25 % slower than
// predicted, so the calibration gains 20 points of error (0.2 against 0); runs as noisy as
// ±30 % keep the uncalibrated prediction, runs of ±10 % take it.
TEST(ChooseCalibration, NotUsedWhenItGainsNoMoreThanTheNoise) {
  const Scenario s = scenario({2, 2}, 4);
  std::vector<CalibrationRun> noisy = stretched_runs({1.25, 1.25, 1.25});
  for (auto& r : noisy) r.noise = 0.3;
  const CalibrationChoice c = choose_calibration(s.profile, s.hardware, noisy);
  EXPECT_FALSE(c.used);
  EXPECT_THAT(c.reason, ::testing::HasSubstr("a gain within the runs' own noise (±30.0 %)"));
  for (auto& r : noisy) r.noise = 0.1;
  EXPECT_TRUE(choose_calibration(s.profile, s.hardware, noisy).used);
}

// 1.96 standard errors of the median, relative: steps 9, 10, 11, 10, 10 have median 10 and
// median absolute deviation 0 (three of five at 10); 8, 10, 12, 10 has median 10 and deviation 1.
TEST(MeasurementNoise, StandardErrorOfTheMedian) {
  EXPECT_EQ(measurement_noise({9, 10, 11, 10, 10}), 0.0);
  EXPECT_NEAR(measurement_noise({8, 10, 12, 10}), 1.96 * 1.253 * 1.4826 * 1.0 / 2.0 / 10.0, 1e-12);
  EXPECT_EQ(measurement_noise({10}), 0.0);
}

TEST(ChooseCalibration, NotUsedWhenItDoesNotCarryOver) {
  // One plan 30 % slower than predicted, the next 20 % faster: a fit on either is worse on the
  // other than no calibration.
  const Scenario s = scenario({2, 2}, 4);
  const CalibrationChoice c = choose_calibration(s.profile, s.hardware, stretched_runs({1.3, 0.8}));
  EXPECT_FALSE(c.used);
  EXPECT_FALSE(c.fitted.empty());
  EXPECT_THAT(c.reason, ::testing::StartsWith("not used: on plans it was not fitted on"));
  // One run leaves nothing to judge it on.
  const CalibrationChoice one = choose_calibration(s.profile, s.hardware, stretched_runs({1.25}));
  EXPECT_FALSE(one.used);
  EXPECT_EQ(one.reason, "one run leaves none to judge it on");
}

TEST(ChooseCalibration, NeverWorseThanUncalibratedOnThePlansItWasFittedOn) {
  const Scenario s = scenario({2, 2}, 4);
  for (const auto& factors : std::vector<std::vector<double>>{{1.2, 1.2, 1.0},
                                                              {1.25, 1.25, 1.25},
                                                              {1.1, 0.9, 1.0},
                                                              {1.0, 1.0, 1.0},
                                                              {0.7, 0.75, 0.8},
                                                              {1.3, 0.8}}) {
    const CalibrationChoice c = choose_calibration(s.profile, s.hardware, stretched_runs(factors));
    ASSERT_EQ(c.in_sample_error.size(), factors.size());
    if (!c.used) continue;
    for (std::size_t k = 0; k < factors.size(); ++k) {
      EXPECT_LE(std::abs(c.in_sample_error[k]), std::abs(c.uncalibrated_error[k])) << c.reason;
    }
  }
  // A calibration that fits two plans and is off on the third is not used.
  const CalibrationChoice c =
      choose_calibration(s.profile, s.hardware, stretched_runs({1.2, 1.2, 1.0}));
  EXPECT_FALSE(c.used) << c.reason;
}

// Runs on a machine whose copies follow a slow link (2 ms + bytes / 2e5 B/s, against the
// hardware's 0.1 ms + bytes / 1e6 B/s) in every run while compute takes its profiled time in two
// runs and 1.4x in the third: the copy part carries over from any two runs to the third, the
// compute scale does not (fitted on a 1.0 and a 1.4 run it over-predicts the other 1.0 run).
TEST(ChooseCalibration, KeepsThePartThatCarriesOverWithoutTheOther) {
  const Scenario plans[] = {scenario({2, 2}, 4), scenario({1, 3}, 2, CheckpointMode::Never),
                            scenario({3, 1}, 8, CheckpointMode::Always)};
  const double compute_factor[] = {1.0, 1.0, 1.4};
  std::vector<CalibrationRun> runs;
  for (int k = 0; k < 3; ++k) {
    const Scenario& s = plans[k];
    Hardware truth = s.hardware;
    truth.link = Link{2e5, 2.0};
    for (auto& d : truth.devices) d.speed = 1.0 / compute_factor[k];
    Trace measured = trace_from_simulation(Simulator(s.profile, truth).run(s.plan), "m");
    measured.kind = "measured";
    runs.push_back({s.plan, measured, measured.iteration_ms});
  }
  const CalibrationChoice c = choose_calibration(plans[0].profile, plans[0].hardware, runs);
  ASSERT_TRUE(c.used) << c.reason;
  EXPECT_THAT(c.reason, ::testing::StartsWith("used (copies only): ")) << c.reason;
  EXPECT_TRUE(c.fitted.compute_scale.empty());
  EXPECT_EQ(c.fitted.task_overhead_ms, 0.0);
  ASSERT_TRUE(c.fitted.copy);
  EXPECT_NEAR(c.fitted.copy->latency_ms, 2.0, 1e-6);
  EXPECT_NEAR(c.fitted.copy->bandwidth_bytes_per_s, 2e5, 1e-3);
  // With the true link, the two runs whose compute took its profiled time are predicted exactly,
  // in sample and out of sample; the third is short by its compute alone.
  for (int k = 0; k < 2; ++k) {
    EXPECT_NEAR(c.in_sample_error[static_cast<std::size_t>(k)], 0.0, 1e-9);
    EXPECT_NEAR(c.out_of_sample_error[static_cast<std::size_t>(k)], 0.0, 1e-9);
  }
  EXPECT_LT(c.in_sample_error[2], 0.0);
  for (int k = 0; k < 3; ++k) {
    EXPECT_LE(std::abs(c.in_sample_error[static_cast<std::size_t>(k)]),
              std::abs(c.uncalibrated_error[static_cast<std::size_t>(k)]));
  }
}

TEST(Calibration, FittedOnSomePlansAppliedToAnotherStoredAndReloaded) {
  // Runs of two plans in which compute takes 1.3x its profiled time and copies follow a link of
  // 0.5 ms + bytes / 2 MB/s.
  std::vector<std::pair<Trace, Trace>> runs;
  for (const Scenario& s : {scenario({2, 2}, 4), scenario({1, 3}, 2, CheckpointMode::Never)}) {
    Trace measured = s.predicted;
    measured.kind = "measured";
    for (auto& t : measured.tasks) {
      const double d = is_compute(t.kind) ? 1.3 * t.duration_ms()
                                          : 0.5 + static_cast<double>(t.bytes) / 2e6 * 1e3;
      t.end_ms = t.start_ms + d;
    }
    runs.emplace_back(s.predicted, measured);
  }
  const Calibration cal = fit_calibration(runs, {"[2,2] x4", "[1,3] x2"});
  ASSERT_EQ(cal.compute_scale.count(2), 1u);
  EXPECT_NEAR(cal.compute_scale.at(2), 1.3, 1e-9);
  ASSERT_TRUE(cal.copy);
  EXPECT_NEAR(cal.copy->latency_ms, 0.5, 1e-6);
  EXPECT_NEAR(cal.copy->bandwidth_bytes_per_s, 2e6, 1e-3);

  // Stored and reloaded with the hardware.
  Scenario other = scenario({3, 1}, 8, CheckpointMode::Always);
  other.hardware.calibration = cal;
  const Hardware reloaded = parse_hardware(hardware_to_json(other.hardware), "hw.json");
  EXPECT_EQ(reloaded.calibration.compute_scale, cal.compute_scale);
  EXPECT_EQ(reloaded.calibration.fitted_on, cal.fitted_on);
  ASSERT_TRUE(reloaded.calibration.copy);
  EXPECT_NEAR(reloaded.calibration.copy->latency_ms, 0.5, 1e-9);

  // Applied to a plan it was not fitted on: every compute task takes 1.3x, copies the new link.
  const Hardware applied = calibrated(reloaded, 2);
  Hardware uncalibrated = other.hardware;
  uncalibrated.calibration = {};
  const auto plain = Simulator(other.profile, uncalibrated).run(other.plan);
  const auto fitted = Simulator(other.profile, applied).run(other.plan);
  ASSERT_EQ(plain.tasks.size(), fitted.tasks.size());
  for (std::size_t k = 0; k < plain.tasks.size(); ++k) {
    if (is_compute(plain.tasks[k].kind)) {
      EXPECT_NEAR(fitted.tasks[k].duration_ms(), 1.3 * plain.tasks[k].duration_ms(), 1e-9);
    } else {
      EXPECT_NEAR(fitted.tasks[k].duration_ms(),
                  0.5 + static_cast<double>(fitted.tasks[k].bytes) / 2e6 * 1e3, 1e-9);
    }
  }
  // The simulator applies a hardware's calibration itself; calibrated() empties it, so that it
  // is not applied twice.
  EXPECT_TRUE(applied.calibration.empty());
  EXPECT_NEAR(Simulator(other.profile, reloaded).run(other.plan).iteration_ms, fitted.iteration_ms,
              1e-9);
  EXPECT_NEAR(Simulator(other.profile, applied).run(other.plan).iteration_ms, fitted.iteration_ms,
              1e-9);
  // With no calibration, calibrated() changes nothing.
  EXPECT_EQ(hardware_to_json(calibrated(uncalibrated, 2)), hardware_to_json(uncalibrated));
}

TEST(Calibration, APerTaskOverheadIsToldApartFromTheScale) {
  // Compute takes 1.1x its profiled time plus 0.4 ms per task; two tasks out of many are 5x slow.
  std::vector<std::pair<Trace, Trace>> runs;
  for (const Scenario& s :
       {scenario({2, 2}, 8, CheckpointMode::Never), scenario({1, 3}, 8, CheckpointMode::Always)}) {
    Trace measured = s.predicted;
    int outliers = 0;
    for (auto& t : measured.tasks) {
      if (!is_compute(t.kind)) continue;
      double d = 1.1 * t.duration_ms() + 0.4;
      if (t.micro_batch == 5 && outliers++ < 2) d *= 5;
      t.end_ms = t.start_ms + d;
    }
    runs.emplace_back(s.predicted, measured);
  }
  const Calibration cal = fit_calibration(runs, {"a", "b"});
  EXPECT_NEAR(cal.task_overhead_ms, 0.4, 1e-9);
  EXPECT_NEAR(cal.compute_scale.at(2), 1.1, 1e-9);
  // Copies took what the hardware's link predicts; the fitted link is that link.
  ASSERT_TRUE(cal.copy);
  EXPECT_NEAR(cal.copy->latency_ms, 0.1, 1e-6);
  EXPECT_NEAR(cal.copy->bandwidth_bytes_per_s, 1e6, 1e-3);
}

TEST(Calibration, CopiesWhoseTimeDoesNotGrowWithTheirSizeGiveTheirMeanAsALatency) {
  // Every copy takes 3 ms, or 2 and 4 ms alternately, whatever its size (the scenario's copies
  // are 50 and 10 bytes a sample: two sizes): the best line with a slope of at least zero is
  // flat at the mean.
  for (const bool alternate : {false, true}) {
    std::vector<std::pair<Trace, Trace>> runs;
    int copy = 0;
    for (const Scenario& s : {scenario({2, 2}, 4), scenario({1, 3}, 2, CheckpointMode::Never)}) {
      Trace measured = s.predicted;
      for (auto& t : measured.tasks) {
        if (is_compute(t.kind)) continue;
        t.end_ms = t.start_ms + (alternate ? (copy++ % 2 == 0 ? 2.0 : 4.0) : 3.0);
      }
      runs.emplace_back(s.predicted, measured);
    }
    const Calibration cal = fit_calibration(runs, {"a", "b"});
    ASSERT_TRUE(cal.copy);
    if (alternate) {
      ASSERT_EQ(copy % 2, 0);  // as many 2 ms as 4 ms copies: the mean is 3 ms
    }
    EXPECT_NEAR(cal.copy->latency_ms, 3.0, 0.05) << alternate;
    EXPECT_NEAR(cal.copy->transfer_ms(1e6), 3.0, 0.05) << alternate;  // a megabyte adds nothing
  }
}

TEST(Calibration, ALinkTheUserSetsReplacesTheCalibratedOne) {
  // Copies of 1e6 bytes: calibrated 1e9 B/s + 0.5 ms = 1.5 ms; the user's 1e8 B/s and 0 ms: 10 ms.
  const Profile profile = testing::uniform_profile(2, 1.0, 2.0, 1);
  Hardware hw = replicate_device(profile.device, 2);
  hw.calibration.copy = Link{1e9, 0.5};
  hw.calibration.compute_scale[2] = 1.5;
  set_all_links(hw, 1e8, 0.0);
  EXPECT_FALSE(hw.calibration.copy);
  EXPECT_EQ(hw.calibration.compute_scale.at(2), 1.5);  // the rest of the calibration stays
  EXPECT_DOUBLE_EQ(calibrated(hw, 2).link.transfer_ms(1e6), 10.0);
  // Neither given: nothing changes.
  Hardware untouched = replicate_device(profile.device, 2);
  untouched.calibration.copy = Link{1e9, 0.5};
  set_all_links(untouched, std::nullopt, std::nullopt);
  EXPECT_TRUE(untouched.calibration.copy);
}

}  // namespace
}  // namespace pipetune
