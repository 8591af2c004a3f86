#include "gui/model/plan_editor.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "gui/model/overlay_summary.hpp"
#include "gui/model/timeline_model.hpp"
#include "sim/interval.hpp"
#include "tests/gui/gui_test_support.hpp"

namespace pipetune::gui {
namespace {

Profile tiny() {
  return load_profile(testing::data_path("tiny.profile.json"));
}
Hardware two_gpus() {
  return load_hardware(testing::data_path("hardware-2.json"));
}

// The editor's prediction must be what a fresh Simulator predicts for the editor's plan.
void expect_matches_fresh_simulation(const PlanEditor& editor) {
  const SimulationResult truth =
      testing::simulate_directly(editor.profile(), editor.hardware(), editor.plan());
  const SimulationResult& r = editor.result();
  EXPECT_DOUBLE_EQ(r.iteration_ms, truth.iteration_ms);
  ASSERT_EQ(r.devices.size(), truth.devices.size());
  for (std::size_t d = 0; d < r.devices.size(); ++d) {
    EXPECT_EQ(r.devices[d].peak_memory_bytes, truth.devices[d].peak_memory_bytes);
    EXPECT_EQ(r.devices[d].memory_capacity_bytes, truth.devices[d].memory_capacity_bytes);
  }
  ASSERT_EQ(r.tasks.size(), truth.tasks.size());
  for (std::size_t k = 0; k < r.tasks.size(); ++k) {
    EXPECT_EQ(r.tasks[k].label(), truth.tasks[k].label());
    EXPECT_DOUBLE_EQ(r.tasks[k].start_ms, truth.tasks[k].start_ms);
    EXPECT_DOUBLE_EQ(r.tasks[k].end_ms, truth.tasks[k].end_ms);
  }
}

// Work of layers [a, b) per iteration at micro-batch size 1 (the tiny profile's first measured
// size), M micro-batches of which all but the last are recomputed (except_last).
double stage_work(const Profile& p, int a, int b, int micro_batches) {
  double work = 0;
  for (int l = a; l < b; ++l) {
    work += p.layers[l].forward_ms[0] * (2 * micro_batches - 1) +
            p.layers[l].backward_ms[0] * micro_batches;
  }
  return work;
}

TEST(PlanEditor, OpensAProfileWithATimeBalancedPlan) {
  PlanEditor editor;
  const Profile profile = tiny();
  editor.open_profile(profile);
  // No hardware: four copies of the profiled device (the profile has six layers).
  ASSERT_EQ(editor.hardware().devices.size(), 4u);
  EXPECT_EQ(editor.hardware().devices[3].name, "cpu:3");
  EXPECT_EQ(editor.plan().chunks, 8);  // min(batch 8, 4 × devices)
  EXPECT_EQ(editor.plan().checkpoint, CheckpointMode::ExceptLast);
  ASSERT_EQ(editor.plan().stages(), 4);

  // Brute force over every split of 6 layers into 4 stages: the editor's is a best one.
  double best = INFINITY;
  for (int a = 1; a < 6; ++a) {
    for (int b = a + 1; b < 6; ++b) {
      for (int c = b + 1; c < 6; ++c) {
        best =
            std::min(best, std::max({stage_work(profile, 0, a, 8), stage_work(profile, a, b, 8),
                                     stage_work(profile, b, c, 8), stage_work(profile, c, 6, 8)}));
      }
    }
  }
  double worst_stage = 0;
  int first = 0;
  for (int n : editor.plan().balance) {
    worst_stage = std::max(worst_stage, stage_work(profile, first, first + n, 8));
    first += n;
  }
  EXPECT_NEAR(worst_stage, best, 1e-9);
  expect_matches_fresh_simulation(editor);
}

// Every prediction comes with its 80 % interval where the profile has spreads: the one
// iteration_interval() gives a fresh Simulator (and the band the timeline draws); none without.
TEST(PlanEditor, ThePredictionsIntervalIsAFreshSimulatorsAndNoneWithoutSpreads) {
  PlanEditor editor;
  Profile profile = tiny();
  editor.open_profile(profile);
  EXPECT_FALSE(editor.interval().from_spreads);
  EXPECT_EQ(editor.interval().low_ms, editor.result().iteration_ms);
  for (auto& l : profile.layers) {
    for (double ms : l.forward_ms) l.forward_ms_spread.push_back(0.05 * ms);
    for (double ms : l.backward_ms) l.backward_ms_spread.push_back(0.05 * ms);
  }
  editor.open_profile(profile);
  const Simulator fresh(editor.profile(), editor.hardware());
  const IterationInterval truth = iteration_interval(fresh, editor.profile(), editor.plan());
  ASSERT_TRUE(editor.interval().from_spreads);
  EXPECT_DOUBLE_EQ(editor.interval().low_ms, truth.low_ms);
  EXPECT_DOUBLE_EQ(editor.interval().high_ms, truth.high_ms);
  EXPECT_LT(editor.interval().low_ms, editor.result().iteration_ms);
  EXPECT_GT(editor.interval().high_ms, editor.result().iteration_ms);

  TimelineModel model;
  model.set_prediction(editor.result());
  model.set_predicted_interval(editor.interval().low_ms, editor.interval().high_ms);
  EXPECT_GE(model.extent_ms(), editor.interval().high_ms);
  const OverlaySummary summary = summarize(model, &editor.plan());
  EXPECT_EQ(summary.predicted_low_ms, editor.interval().low_ms);
  EXPECT_EQ(summary.predicted_high_ms, editor.interval().high_ms);
  model.set_prediction(editor.result());  // a new prediction drops the old interval
  EXPECT_FALSE(model.predicted_interval().has_value());
}

TEST(PlanEditor, EveryEditIsReSimulatedAtOnce) {
  PlanEditor editor;
  editor.open_profile(tiny(), two_gpus());
  int simulations = 0;
  QObject::connect(&editor, &PlanEditor::simulated, [&] { ++simulations; });

  const std::vector<std::function<void()>> edits = {
      [&] {
        EXPECT_TRUE(editor.set_balance({2, 4}).isEmpty());
      },
      [&] { editor.move_boundary(0, 4); },
      [&] { editor.set_chunks(3); },
      [&] { editor.set_checkpoint(CheckpointMode::Never); },
      [&] { editor.set_schedule(ScheduleKind::OneFOneB); },
      [&] { editor.set_optimizer_state_factor(2.0); },
      [&] { editor.set_link_bandwidth(5e7); },
      [&] { editor.set_memory_per_device(64 << 20); },
  };
  for (std::size_t k = 0; k < edits.size(); ++k) {
    edits[k]();
    EXPECT_EQ(simulations, static_cast<int>(k) + 1);
    expect_matches_fresh_simulation(editor);
  }
  EXPECT_EQ(editor.plan().balance, (std::vector<int>{4, 2}));
  EXPECT_EQ(editor.plan().chunks, 3);
  EXPECT_EQ(editor.plan().checkpoint, CheckpointMode::Never);
  EXPECT_EQ(editor.plan().schedule, ScheduleKind::OneFOneB);
  EXPECT_DOUBLE_EQ(editor.hardware().link.bandwidth_bytes_per_s, 5e7);
  EXPECT_EQ(editor.hardware().devices[1].memory_bytes, 64 << 20);

  // A drag that lands on the boundary's own place moves nothing and simulates nothing.
  editor.move_boundary(0, 4);
  EXPECT_EQ(simulations, static_cast<int>(edits.size()));
}

TEST(PlanEditor, PlanEditsKeepTheSimulatorHardwareEditsReplaceIt) {
  PlanEditor editor;
  editor.open_profile(tiny(), two_gpus());
  const auto built = editor.simulators_built();
  const Simulator* simulator = &editor.simulator();
  editor.set_balance({1, 5});
  for (int gap = 1; gap < 6; ++gap) editor.move_boundary(0, gap);  // a drag across the strip
  editor.set_chunks(2);
  editor.set_checkpoint(CheckpointMode::Always);
  editor.set_schedule(ScheduleKind::OneFOneB);
  EXPECT_EQ(editor.simulators_built(), built);
  EXPECT_EQ(&editor.simulator(), simulator);
  editor.set_memory_per_device(1 << 30);
  EXPECT_EQ(editor.simulators_built(), built + 1);
  editor.set_link_bandwidth(1e9);
  EXPECT_EQ(editor.simulators_built(), built + 2);
}

TEST(PlanEditor, MemoryBelowThePredictedPeakDoesNotFit) {
  PlanEditor editor;
  editor.open_profile(tiny(), two_gpus());
  const SimulationResult truth =
      testing::simulate_directly(editor.profile(), editor.hardware(), editor.plan());
  std::int64_t largest = 0;
  for (const auto& d : truth.devices) largest = std::max(largest, d.peak_memory_bytes);
  EXPECT_TRUE(editor.result().fits());  // 128 MiB each in hardware-2.json

  editor.set_memory_per_device(largest - 1);
  EXPECT_FALSE(editor.result().fits());
  for (const auto& d : editor.result().devices) {
    EXPECT_EQ(d.fits(), d.peak_memory_bytes <= largest - 1) << d.name;
  }
  editor.set_memory_per_device(largest);
  EXPECT_TRUE(editor.result().fits());
  editor.set_memory_per_device(0);  // unknown: no limit
  EXPECT_TRUE(editor.result().fits());
}

TEST(PlanEditor, RefusesABadBalanceAndKeepsThePlan) {
  PlanEditor editor;
  editor.open_profile(tiny(), two_gpus());
  const Plan before = editor.plan();
  const QString problem = editor.set_balance({2, 2});
  EXPECT_TRUE(problem.contains(QStringLiteral("balance"))) << problem.toStdString();
  EXPECT_EQ(editor.plan(), before);
}

TEST(PlanEditor, DeviceCountSetsTheStagesAndBalancesThem) {
  PlanEditor editor;
  editor.open_profile(tiny());
  EXPECT_TRUE(editor.set_device_count(3).isEmpty());
  EXPECT_EQ(editor.hardware().devices.size(), 3u);
  ASSERT_EQ(editor.plan().stages(), 3);
  int layers = 0;
  for (int n : editor.plan().balance) {
    layers += n;
    EXPECT_GE(n, 1);
  }
  EXPECT_EQ(layers, 6);
  EXPECT_FALSE(editor.set_device_count(7).isEmpty());  // more devices than layers
  expect_matches_fresh_simulation(editor);
}

TEST(PlanEditor, APlanWithMoreStagesThanDevicesGrowsTheDevices) {
  PlanEditor editor;
  editor.open_profile(tiny(), two_gpus());
  Plan plan = editor.plan();
  plan.balance = {2, 2, 2};
  EXPECT_TRUE(editor.apply_plan(plan).isEmpty());
  ASSERT_EQ(editor.hardware().devices.size(), 3u);
  EXPECT_EQ(editor.hardware().devices[2].name, "gpu2");  // a copy of gpu1
  EXPECT_DOUBLE_EQ(editor.hardware().devices[2].speed, 1.5);
  expect_matches_fresh_simulation(editor);

  // Stages sharing devices by name need no more devices.
  plan.balance = {1, 1, 1, 3};
  plan.devices = {"gpu0", "gpu1", "gpu0", "gpu1"};
  EXPECT_TRUE(editor.apply_plan(plan).isEmpty());
  EXPECT_EQ(editor.hardware().devices.size(), 3u);
  EXPECT_EQ(editor.result().devices.size(), 2u);
  plan.devices = {"gpu0", "gpu1", "nope", "gpu1"};
  EXPECT_FALSE(editor.apply_plan(plan).isEmpty());
}

// Every split of `layers` layers into `stages` non-empty stages, as layer counts.
std::vector<std::vector<int>> every_balance(int layers, int stages) {
  if (stages == 1) return {{layers}};
  std::vector<std::vector<int>> out;
  for (int first = 1; first <= layers - stages + 1; ++first) {
    for (auto rest : every_balance(layers - first, stages - 1)) {
      rest.insert(rest.begin(), first);
      out.push_back(std::move(rest));
    }
  }
  return out;
}

// The busiest stage's work of `balance` with stage s on device s mod devices (the looped
// schedules' placement), each device's speed from `hardware`.
double busiest_looped_stage(const Profile& p, const Hardware& hardware,
                            const std::vector<int>& balance, int micro_batches) {
  double busiest = 0;
  int first = 0;
  for (std::size_t s = 0; s < balance.size(); ++s) {
    const double speed = hardware.devices[s % hardware.devices.size()].speed;
    busiest = std::max(busiest, stage_work(p, first, first + balance[s], micro_batches) / speed);
    first += balance[s];
  }
  return busiest;
}

TEST(PlanEditor, AnInterleavedScheduleRunsStagesPerDeviceTimesDevicesStages) {
  PlanEditor editor;
  const Profile profile = tiny();
  editor.open_profile(profile, two_gpus());
  ASSERT_EQ(editor.plan().schedule, ScheduleKind::GPipe);
  ASSERT_EQ(editor.plan().chunks, 8);
  EXPECT_TRUE(editor.set_schedule(ScheduleKind::Interleaved1F1B).isEmpty());
  EXPECT_EQ(editor.plan().schedule, ScheduleKind::Interleaved1F1B);
  EXPECT_EQ(editor.plan().stages_per_device, 2);
  ASSERT_EQ(editor.plan().stages(), 4);  // 2 per device on 2 devices
  EXPECT_EQ(editor.hardware().devices.size(), 2u);
  int layers = 0;
  for (int n : editor.plan().balance) layers += n;
  EXPECT_EQ(layers, 6);

  // Re-balanced for the new stages: a best split by brute force, stage s on device s mod 2.
  double best = INFINITY;
  for (const auto& balance : every_balance(6, 4)) {
    best = std::min(best, busiest_looped_stage(profile, editor.hardware(), balance, 8));
  }
  EXPECT_NEAR(busiest_looped_stage(profile, editor.hardware(), editor.plan().balance, 8), best,
              1e-9);
  // The simulator runs stages 0, 2 on the first device and 1, 3 on the second.
  EXPECT_EQ(stage_devices(editor.plan(), editor.hardware()), (std::vector<int>{0, 1, 0, 1}));
  expect_matches_fresh_simulation(editor);

  // Three per device: six stages of one layer each.
  EXPECT_TRUE(editor.set_stages_per_device(3).isEmpty());
  EXPECT_EQ(editor.plan().balance, (std::vector<int>(6, 1)));
  expect_matches_fresh_simulation(editor);
  // Looped BFS keeps the stages per device and the balance.
  EXPECT_TRUE(editor.set_schedule(ScheduleKind::LoopedBFS).isEmpty());
  EXPECT_EQ(editor.plan().stages_per_device, 3);
  EXPECT_EQ(editor.plan().balance, (std::vector<int>(6, 1)));
  expect_matches_fresh_simulation(editor);

  // Back to a single-stage schedule: one stage per device again.
  EXPECT_TRUE(editor.set_schedule(ScheduleKind::OneFOneB).isEmpty());
  EXPECT_EQ(editor.plan().stages_per_device, 1);
  EXPECT_EQ(editor.plan().stages(), 2);
  expect_matches_fresh_simulation(editor);
}

TEST(PlanEditor, ZbvRunsTwoStagesPerDevice) {
  PlanEditor editor;
  editor.open_profile(tiny(), two_gpus());
  ASSERT_TRUE(editor.set_schedule(ScheduleKind::Interleaved1F1B).isEmpty());
  ASSERT_TRUE(editor.set_stages_per_device(3).isEmpty());
  EXPECT_TRUE(editor.set_schedule(ScheduleKind::ZBV).isEmpty());
  EXPECT_EQ(editor.plan().stages_per_device, 2);  // forced, whatever came before
  ASSERT_EQ(editor.plan().stages(), 4);
  // The V: device 0 holds stages 0 and 3, device 1 stages 1 and 2.
  EXPECT_EQ(stage_devices(editor.plan(), editor.hardware()), (std::vector<int>{0, 1, 1, 0}));
  expect_matches_fresh_simulation(editor);

  const Plan before = editor.plan();
  const QString problem = editor.set_stages_per_device(3);
  EXPECT_TRUE(problem.contains(QStringLiteral("expected 2 for zbv"))) << problem.toStdString();
  EXPECT_EQ(editor.plan(), before);
}

TEST(PlanEditor, ARefusedScheduleKeepsThePlanAndSaysWhy) {
  PlanEditor editor;
  editor.open_profile(tiny());  // four devices, six layers
  const Plan before = editor.plan();
  int simulations = 0;
  QObject::connect(&editor, &PlanEditor::simulated, [&] { ++simulations; });

  // Two stages per device on four devices would be eight stages of six layers.
  QString problem = editor.set_schedule(ScheduleKind::Interleaved1F1B);
  EXPECT_TRUE(problem.contains(QStringLiteral("needs 8 stages"))) << problem.toStdString();
  EXPECT_TRUE(problem.contains(QStringLiteral("6 layers"))) << problem.toStdString();
  EXPECT_EQ(editor.plan(), before);
  problem = editor.set_schedule(ScheduleKind::ZBV);
  EXPECT_TRUE(problem.contains(QStringLiteral("zbv"))) << problem.toStdString();
  EXPECT_EQ(editor.plan(), before);
  // GPipe runs one stage per device, and says so.
  problem = editor.set_stages_per_device(2);
  EXPECT_TRUE(problem.contains(QStringLiteral("stages_per_device: expected 1 for gpipe")))
      << problem.toStdString();
  EXPECT_EQ(editor.plan(), before);
  EXPECT_EQ(simulations, 0);

  // On three devices it fits; then a fourth device is refused and the hardware stays.
  ASSERT_TRUE(editor.set_device_count(3).isEmpty());
  ASSERT_TRUE(editor.set_schedule(ScheduleKind::InterleavedZB).isEmpty());
  EXPECT_EQ(editor.plan().stages(), 6);
  const Plan three = editor.plan();
  problem = editor.set_device_count(4);
  EXPECT_TRUE(problem.contains(QStringLiteral("expected 1 to 3 devices (2 stages per device")))
      << problem.toStdString();
  EXPECT_EQ(editor.plan(), three);
  EXPECT_EQ(editor.hardware().devices.size(), 3u);
  expect_matches_fresh_simulation(editor);
}

TEST(PlanEditor, NewHardwareKeepsTheStagesPerDevice) {
  PlanEditor editor;
  const Profile profile = tiny();
  editor.open_profile(profile, two_gpus());
  ASSERT_TRUE(editor.set_schedule(ScheduleKind::Interleaved1F1B).isEmpty());
  const Plan interleaved = editor.plan();
  // Four devices: at most three hold two stages each of six layers; the plan still fits.
  editor.open_hardware(replicate_device(profile.device, 4));
  EXPECT_EQ(editor.hardware().devices.size(), 3u);
  EXPECT_EQ(editor.plan(), interleaved);
  expect_matches_fresh_simulation(editor);
  // One device: both stages of the plan move onto it, re-balanced.
  editor.open_hardware(replicate_device(profile.device, 1));
  EXPECT_EQ(editor.plan().schedule, ScheduleKind::Interleaved1F1B);
  EXPECT_EQ(editor.plan().stages_per_device, 2);
  ASSERT_EQ(editor.plan().stages(), 2);
  EXPECT_EQ(editor.plan().balance[0] + editor.plan().balance[1], 6);
  expect_matches_fresh_simulation(editor);
}

TEST(PlanEditor, LayerCostsAreAtThePlansMicroBatchSize) {
  PlanEditor editor;
  const Profile profile = tiny();
  editor.open_profile(profile, two_gpus());
  editor.set_chunks(4);  // 8 samples in 4 micro-batches of 2: the profile's second size
  const auto ms = editor.layer_ms();
  ASSERT_EQ(ms.size(), profile.layers.size());
  for (std::size_t l = 0; l < ms.size(); ++l) {
    EXPECT_DOUBLE_EQ(ms[l], profile.layers[l].forward_ms[1] + profile.layers[l].backward_ms[1]);
  }
}

}  // namespace
}  // namespace pipetune::gui
