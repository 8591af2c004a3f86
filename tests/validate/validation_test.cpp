// The parts of validation that need no model: which plans calibrate, and how plans are ranked.

#include "validate/validation.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>

#include "sim/simulator.hpp"
#include "tests/sim/fixtures.hpp"
#include "tests/support/scratch_dir.hpp"
#include "validate/fit_check.hpp"

namespace pipetune::validate {
namespace {

TEST(CalibrationPlans, AreDistinctNotValidatedAndFit) {
  const Profile profile = testing::make_profile(
      {{1, 2, 100, 10, 5, 0}, {2, 3, 100, 10, 5, 0}, {1, 1, 100, 10, 5, 0}, {3, 2, 100, 10, 5, 0}},
      16, 4);
  Hardware hw = replicate_device(profile.device, 2);
  // The first plan calibration would pick is validated already.
  const std::vector<Plan> first = calibration_plans(profile, hw, 2, {}, 1);
  ASSERT_EQ(first.size(), 1u);
  const Plan validated = first[0];
  const std::vector<Plan> plans = calibration_plans(profile, hw, 2, {validated}, 3);
  ASSERT_EQ(plans.size(), 3u);
  for (std::size_t i = 0; i < plans.size(); ++i) {
    EXPECT_NE(plans[i], validated);
    EXPECT_EQ(plans[i].stages(), 2);
    for (std::size_t j = 0; j < i; ++j) EXPECT_NE(plans[i], plans[j]);
  }
  // With a memory limit only the leanest shapes are left: every plan returned fits.
  const Simulator simulator(profile, hw);
  std::int64_t leanest = INT64_MAX;
  for (const Plan& p : calibration_plans(profile, hw, 2, {}, 6))
    leanest = std::min(leanest, simulator.run(p).max_peak_memory_bytes());
  for (auto& d : hw.devices) d.memory_bytes = leanest;
  const Simulator limited(profile, hw);
  const auto fitting = calibration_plans(profile, hw, 2, {}, 6);
  ASSERT_FALSE(fitting.empty());
  for (const Plan& p : fitting) EXPECT_TRUE(limited.run(p).fits()) << describe_plan(p);
}

TEST(CalibrationPlans, FollowTheValidatedPlansLayoutsInTurnThenOneStagePerDevice) {
  const Profile profile = testing::make_profile({{1, 2, 100, 10, 5, 0},
                                                 {2, 3, 100, 10, 5, 0},
                                                 {1, 1, 100, 10, 5, 0},
                                                 {3, 2, 100, 10, 5, 0},
                                                 {2, 2, 100, 10, 5, 0},
                                                 {1, 3, 100, 10, 5, 0}},
                                                16, 4);
  const Hardware hw = replicate_device(profile.device, 2);
  Plan interleaved = testing::make_plan({2, 1, 2, 1}, 4, CheckpointMode::Never);
  interleaved.schedule = ScheduleKind::Interleaved1F1B;
  interleaved.stages_per_device = 2;
  Plan zbv = testing::make_plan({1, 2, 2, 1}, 2, CheckpointMode::Never);
  zbv.schedule = ScheduleKind::ZBV;
  zbv.stages_per_device = 2;
  const std::vector<Plan> validated{interleaved, zbv, interleaved};
  const std::vector<Plan> plans = calibration_plans(profile, hw, 2, validated, 9);
  ASSERT_EQ(plans.size(), 9u);
  // First the validated plans' fewest and most chunks (2 and 4), in the two layouts in turn, so
  // that two calibration plans span the validated micro-batch sizes.
  EXPECT_EQ(plans[0].schedule, ScheduleKind::Interleaved1F1B);
  EXPECT_EQ(plans[0].chunks, 2);
  EXPECT_EQ(plans[1].schedule, ScheduleKind::ZBV);
  EXPECT_EQ(plans[1].chunks, 4);
  // Then the table's shapes, the layouts still in turn (the repeated one counts once; a shape
  // that makes a plan already there is skipped), each at another chunk count or checkpoint mode,
  // then one stage per device.
  const ScheduleKind expected[] = {ScheduleKind::Interleaved1F1B,
                                   ScheduleKind::ZBV,
                                   ScheduleKind::ZBV,
                                   ScheduleKind::Interleaved1F1B,
                                   ScheduleKind::ZBV,
                                   ScheduleKind::Interleaved1F1B,
                                   ScheduleKind::ZBV};
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const Plan& p = plans[i];
    EXPECT_EQ(std::count(validated.begin(), validated.end(), p), 0) << describe_plan(p);
    for (std::size_t j = 0; j < i; ++j) EXPECT_NE(p, plans[j]);
    if (i < std::size(expected)) {
      EXPECT_EQ(p.schedule, expected[i]) << i;
      EXPECT_EQ(p.stages(), 4);
      EXPECT_EQ(p.stages_per_device, 2);
    } else {
      EXPECT_EQ(p.stages(), 2) << describe_plan(p);
      EXPECT_EQ(p.stages_per_device, 1);
    }
    EXPECT_NO_THROW(check_plan(p, profile, hw, "calibration")) << describe_plan(p);
  }
}

// tensor.chunk's sizes, by hand: 8 in 8 chunks is 1 each, in 4 is 2 each, in 3 is 3, 3 and 2,
// in 2 is 4 each, in 1 is 8.
TEST(CalibrationRange, IsTheMicroBatchSizesItWasFittedOn) {
  auto chunked = [](std::initializer_list<int> chunks) {
    std::vector<Plan> plans;
    for (int c : chunks) plans.push_back(testing::make_plan({1, 1}, c, CheckpointMode::Never));
    return plans;
  };
  EXPECT_FALSE(outside_fitted_sizes(chunked({8, 2}), chunked({4, 3, 2}), 8));
  EXPECT_FALSE(outside_fitted_sizes(chunked({4, 3}), chunked({3}), 8));  // 2 to 3 samples
  EXPECT_EQ(outside_fitted_sizes(chunked({8, 4}), chunked({2, 1}), 8),
            "fitted on micro-batches of 1 to 2 samples, the plans it would predict have 4 to 8 "
            "samples: a calibration is judged only within the sizes it was fitted on");
  EXPECT_EQ(outside_fitted_sizes(chunked({2}), chunked({4, 3}), 8),
            "fitted on micro-batches of 4 samples, the plans it would predict have 2 to 3 "
            "samples: a calibration is judged only within the sizes it was fitted on");
  EXPECT_FALSE(outside_fitted_sizes({}, chunked({1}), 8));  // nothing fitted: nothing to judge
}

PlanValidation measured(double predicted_ms, std::vector<double> steps) {
  PlanValidation p;
  p.uncalibrated.predicted_ms = predicted_ms;
  p.calibrated.predicted_ms = predicted_ms * 2;  // only used when there is a calibration
  p.measured.pipeline_ms = std::move(steps);
  return p;
}

TEST(Ranking, PredictedAndMeasuredBestAndTheNoiseBetweenThem) {
  Validation v;
  v.plans = {measured(10, {20, 21, 22}), measured(9, {19, 25, 24}), measured(12, {30, 30, 30})};
  EXPECT_EQ(v.predicted_best(), 1u);
  EXPECT_EQ(v.measured_best(), 0u);  // medians 21, 24, 30
  // Plan 2 measured 3 ms slower; spreads (median absolute deviations) 1 and 1: beyond them.
  EXPECT_FALSE(v.predicted_best_within_noise());
  v.plans[1].measured.pipeline_ms = {19, 22.5, 30};  // median 22.5, spread 3.5
  EXPECT_TRUE(v.predicted_best_within_noise());
  // With a calibration, the calibrated predictions rank (here in the same order).
  v.hardware.calibration.compute_scale[2] = 2.0;
  EXPECT_EQ(v.predicted_best(), 1u);
  v.plans[2].calibrated.predicted_ms = 1.0;
  EXPECT_EQ(v.predicted_best(), 2u);
}

TEST(MeasuredRun, MedianAndSpread) {
  MeasuredRun r;
  r.pipeline_ms = {10, 12, 11, 50};
  EXPECT_DOUBLE_EQ(r.median_pipeline_ms(), 11.5);
  EXPECT_DOUBLE_EQ(r.spread_ms(), 1.0);  // deviations 1.5, 0.5, 0.5, 38.5
}

// `run --sm-partitions K` checks a plan against the GPU's one memory: its shares' tensors
// together, not each share's alone (the simulator's GPU peak is at least each share's own and
// here above the largest of them).
TEST(FitCheck, SharesOfOneGpuAreCheckedAgainstTheGpusOneMemory) {
  const Profile profile =
      testing::make_profile({{1.0, 2.0, 4000, 300, 500, 0}, {1.0, 2.0, 4000, 300, 500, 0}}, 4, 100);
  const auto path = testing::scratch_dir() / "pipetune-fit-shares.profile.json";
  save_profile(profile, path.string());
  const Plan plan = testing::make_plan({1, 1}, 2, CheckpointMode::Never);
  Hardware apart = replicate_device(profile.device, 2);
  std::int64_t largest = 0;
  for (const DeviceReport& d : Simulator(profile, apart).run(plan).devices)
    largest = std::max(largest, d.peak_memory_bytes);
  FitCheck check;
  check.plan_source = "p.json";
  check.profile_path = path.string();
  check.device_kind = "cuda";
  check.devices = {"cuda:0", "cuda:1"};
  check.batch = profile.batch_size;
  check.memory_bytes = largest;  // each share's own tensors fit
  const ModelFactory unused = []() -> models::Model { throw std::logic_error("not profiled"); };
  EXPECT_TRUE(predict_misfits(check, plan, unused).empty());
  check.sm_partitions = 2;
  const auto misfits = predict_misfits(check, plan, unused);
  ASSERT_EQ(misfits.size(), 2u);
  for (const DoesNotFit& m : misfits) {
    EXPECT_GT(m.predicted_bytes, largest);
    EXPECT_EQ(m.predicted_bytes, misfits[0].predicted_bytes);  // the GPU's, on each share
  }
  std::filesystem::remove(path);
}

// A fit check of `plan` on CUDA devices cuda:0, cuda:1, ... with `profile` saved under `name`
// (removed with it), and each device's own peak, as one process per device has it.
struct CudaFitCase {
  std::filesystem::path path;
  std::vector<std::int64_t> peaks;
  FitCheck check;
  CudaFitCase(const Profile& profile, const Plan& plan, const std::string& name)
      : path(testing::scratch_dir() / name) {
    save_profile(profile, path.string());
    const int devices = static_cast<int>(plan.balance.size());
    for (const DeviceReport& d :
         Simulator(profile, replicate_device(profile.device, devices)).run(plan).devices)
      peaks.push_back(d.peak_memory_bytes);
    check.plan_source = "p.json";
    check.profile_path = path.string();
    check.device_kind = "cuda";
    for (int k = 0; k < devices; ++k) check.devices.push_back("cuda:" + std::to_string(k));
    check.batch = profile.batch_size;
  }
  ~CudaFitCase() { std::filesystem::remove(path); }
};

// A GPU's CUDA context and other processes hold part of its memory. A plan within the memory but
// above what is free at the check is returned as free_now (`run` warns, and runs it); above
// the memory it is refused as before, whatever is free; with ranks in several processes the
// free bytes are not asked (each rank's would miss the others' contexts).
TEST(FitCheck, WhatIsFreeNowIsWarnedOfNotRefused) {
  const Profile profile =
      testing::make_profile({{1.0, 2.0, 4000, 300, 500, 0}, {1.0, 2.0, 6000, 300, 700, 0}}, 4, 100);
  const Plan plan = testing::make_plan({1, 1}, 2, CheckpointMode::Never);
  CudaFitCase fit(profile, plan, "pipetune-fit-free.profile.json");
  const std::vector<std::int64_t>& peaks = fit.peaks;
  FitCheck& check = fit.check;
  check.memory_bytes = 2 * std::max(peaks[0], peaks[1]);
  std::map<std::string, std::int64_t> free{{"cuda:0", peaks[0]}, {"cuda:1", peaks[1] - 1}};
  std::vector<std::string> asked;
  check.free_bytes = [&](const std::string& device) {
    asked.push_back(device);
    return free.at(device);
  };
  const ModelFactory unused = []() -> models::Model { throw std::logic_error("not profiled"); };
  auto misfits = predict_misfits(check, plan, unused);
  EXPECT_EQ(asked, (std::vector<std::string>{"cuda:0", "cuda:1"}));
  ASSERT_EQ(misfits.size(), 1u);
  EXPECT_EQ(misfits[0].device, "cuda:1");
  EXPECT_TRUE(misfits[0].free_now);
  EXPECT_EQ(misfits[0].predicted_bytes, peaks[1]);
  EXPECT_EQ(misfits[0].capacity_bytes, peaks[1] - 1);
  const std::string message = misfit_message("p.json", misfits);
  EXPECT_NE(message.find("may not fit what is free now"), std::string::npos) << message;
  EXPECT_NE(message.find("CUDA context"), std::string::npos) << message;

  // Unknown (0) is no check; above the device's memory it does not fit, free or not.
  free["cuda:1"] = 0;
  EXPECT_TRUE(predict_misfits(check, plan, unused).empty());
  check.memory_bytes = peaks[1] - 1;
  free["cuda:1"] = peaks[1] + 100;
  misfits = predict_misfits(check, plan, unused);
  ASSERT_EQ(misfits.size(), 1u);
  EXPECT_FALSE(misfits[0].free_now);
  EXPECT_NE(misfit_message("p.json", misfits).find("does not fit"), std::string::npos);

  // A hardware file naming the GPUs in another order: each asked by its own name.
  Hardware swapped = replicate_device(profile.device, 2);
  swapped.devices[0].name = "cuda:1";
  swapped.devices[1].name = "cuda:0";
  const auto hardware = testing::scratch_dir() / "pipetune-fit-free.hw.json";
  save_hardware(swapped, hardware.string());
  check.hardware_path = hardware.string();
  check.memory_bytes = 2 * std::max(peaks[0], peaks[1]);
  free = {{"cuda:0", peaks[1]}, {"cuda:1", peaks[0] - 1}};
  asked.clear();
  misfits = predict_misfits(check, plan, unused);
  EXPECT_EQ(asked, (std::vector<std::string>{"cuda:1", "cuda:0"}));
  ASSERT_EQ(misfits.size(), 1u);
  EXPECT_EQ(misfits[0].device, "cuda:1");
  EXPECT_EQ(misfits[0].predicted_bytes, peaks[0]);
  check.hardware_path.clear();
  std::filesystem::remove(hardware);

  // Shares of one GPU, each with the GPU's peak: asked once, warned once.
  check.sm_partitions = 2;
  free = {{"cuda:0", 1}, {"cuda:1", 1}};
  asked.clear();
  misfits = predict_misfits(check, plan, unused);
  EXPECT_EQ(asked, (std::vector<std::string>{"cuda:0"}));
  ASSERT_EQ(misfits.size(), 1u);
  EXPECT_TRUE(misfits[0].free_now);
  check.sm_partitions = 0;

  // Ranks in processes of their own: not asked.
  check.memory_bytes = 2 * std::max(peaks[0], peaks[1]);
  free["cuda:1"] = 1;
  check.rank_gpus = 2;
  asked.clear();
  EXPECT_TRUE(predict_misfits(check, plan, unused).empty());
  EXPECT_TRUE(asked.empty());
}

TEST(FitCheck, DistributedRanksSharingAGpuAddTheirPeaksUp) {
  const Profile profile = testing::make_profile(
      {{1.0, 2.0, 4000, 300, 500, 0}, {1.0, 2.0, 6000, 300, 700, 0}, {1.0, 2.0, 5000, 300, 900, 0}},
      4, 100);
  const Plan plan = testing::make_plan({1, 1, 1}, 2, CheckpointMode::Never);
  // Each rank's own peak, as three processes on three devices have them.
  CudaFitCase fit(profile, plan, "pipetune-fit-ranks.profile.json");
  const std::vector<std::int64_t>& peaks = fit.peaks;
  FitCheck& check = fit.check;
  const ModelFactory unused = []() -> models::Model { throw std::logic_error("not profiled"); };

  // Two GPUs: cuda:0 and cuda:2 on GPU 0, cuda:1 alone on GPU 1.
  check.rank_gpus = 2;
  check.memory_bytes = peaks[0] + peaks[2];
  EXPECT_TRUE(predict_misfits(check, plan, unused).empty());
  check.memory_bytes = peaks[0] + peaks[2] - 1;
  auto misfits = predict_misfits(check, plan, unused);
  ASSERT_EQ(misfits.size(), 1u);
  EXPECT_EQ(misfits[0].device, "GPU 0 (cuda:0 + cuda:2)");
  EXPECT_EQ(misfits[0].predicted_bytes, peaks[0] + peaks[2]);
  EXPECT_EQ(misfits[0].capacity_bytes, peaks[0] + peaks[2] - 1);

  // One GPU under all three; with a GPU each, each rank alone.
  check.rank_gpus = 1;
  check.memory_bytes = peaks[0] + peaks[1] + peaks[2] - 1;
  misfits = predict_misfits(check, plan, unused);
  ASSERT_EQ(misfits.size(), 1u);
  EXPECT_EQ(misfits[0].device, "GPU 0 (cuda:0 + cuda:1 + cuda:2)");
  EXPECT_EQ(misfits[0].predicted_bytes, peaks[0] + peaks[1] + peaks[2]);
  check.rank_gpus = 3;
  check.memory_bytes = *std::max_element(peaks.begin(), peaks.end());
  EXPECT_TRUE(predict_misfits(check, plan, unused).empty());
  check.memory_bytes -= 1;
  EXPECT_EQ(predict_misfits(check, plan, unused).size(), 1u);

  // A hardware file naming its devices otherwise: each takes the executor's device in its
  // place, so the ranks on one GPU still add up.
  Hardware named = replicate_device(profile.device, 3);
  for (int k = 0; k < 3; ++k) named.devices[k].name = "gpu" + std::to_string(k);
  const auto hardware = testing::scratch_dir() / "pipetune-fit-ranks.hw.json";
  save_hardware(named, hardware.string());
  check.hardware_path = hardware.string();
  check.rank_gpus = 2;
  check.memory_bytes = peaks[0] + peaks[2] - 1;
  misfits = predict_misfits(check, plan, unused);
  ASSERT_EQ(misfits.size(), 1u);
  EXPECT_EQ(misfits[0].device, "GPU 0 (gpu0 + gpu2)");
  EXPECT_EQ(misfits[0].predicted_bytes, peaks[0] + peaks[2]);
  std::filesystem::remove(hardware);
}

}  // namespace
}  // namespace pipetune::validate
