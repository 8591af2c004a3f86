// Peak memory on a model the project has never seen, built here: depthwise convolution,
// GroupNorm, an in-place ReLU, a Sigmoid, a mean pool and a view before the head. Profiled,
// predicted, run on the executor: every device's predicted peak against the counting
// allocator's, and what the prediction would have been without measuring what autograd keeps.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/pooling.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <utility>

#include "executor/optimizer.hpp"
#include "profiler/profiler.hpp"
#include "sim/simulator.hpp"
#include "tests/support/gpu.hpp"
#include "validate/measure.hpp"

namespace pipetune::validate {
namespace {

class MeanPoolImpl : public torch::nn::Module {
 public:
  at::Tensor forward(const at::Tensor& x) { return x.mean({2, 3}, /*keepdim=*/true); }
};
TORCH_MODULE(MeanPool);

models::Model held_out_model() {
  namespace nn = torch::nn;
  models::Model m;
  m.name = "held-out-convnet";
  m.spec = "held-out-convnet";
  auto add = [&](const std::string& name, nn::AnyModule module) {
    m.layer_names.push_back(name);
    m.layers->push_back(name, std::move(module));
  };
  add("conv", nn::AnyModule(nn::Conv2d(nn::Conv2dOptions(3, 16, 3).padding(1))));
  add("relu_", nn::AnyModule(nn::ReLU(nn::ReLUOptions().inplace(true))));
  add("depthwise", nn::AnyModule(nn::Conv2d(nn::Conv2dOptions(16, 16, 3).padding(1).groups(16))));
  add("norm", nn::AnyModule(nn::GroupNorm(nn::GroupNormOptions(4, 16))));
  add("sigmoid", nn::AnyModule(nn::Sigmoid()));
  add("pool", nn::AnyModule(MeanPool()));
  add("flatten", nn::AnyModule(nn::Flatten()));
  add("head", nn::AnyModule(nn::Linear(16, 10)));
  m.loss = [](const at::Tensor& y, const at::Tensor& target) {
    return at::cross_entropy_loss(y, target);
  };
  m.make_batch = [](std::int64_t batch, std::int64_t step, std::uint64_t seed) {
    auto g = at::detail::createCPUGenerator(seed * 1000003 + static_cast<std::uint64_t>(step));
    return std::make_pair(at::randn({batch, 3, 16, 16}, g), at::randint(10, {batch}, g, at::kLong));
  };
  return m;
}

// The held-out model's input, loss and batches, without its layers: tests add their own.
models::Model held_out_input_and_loss(const std::string& name) {
  models::Model m = held_out_model();
  m.name = m.spec = name;
  m.layer_names.clear();
  m.layers = torch::nn::Sequential();
  return m;
}

void add_layer(models::Model& m, const std::string& name, torch::nn::AnyModule module) {
  m.layer_names.push_back(name);
  m.layers->push_back(name, std::move(module));
}

// Each device's measured peak and the simulator's error on it, (predicted - measured) /
// measured, printed one line per device; a run whose device count the prediction does not
// share fails the test and gives no rows.
struct DevicePeak {
  double measured = 0.0, error = 0.0;
};
std::vector<DevicePeak> device_peaks(const Profile& profile, const Hardware& hardware,
                                     const std::vector<MeasuredRun>& runs) {
  std::vector<DevicePeak> out;
  for (const MeasuredRun& run : runs) {
    const SimulationResult predicted = Simulator(profile, hardware).run(run.plan);
    EXPECT_EQ(predicted.devices.size(), run.peak_memory_bytes.size());
    if (predicted.devices.size() != run.peak_memory_bytes.size()) continue;
    for (std::size_t d = 0; d < run.peak_memory_bytes.size(); ++d) {
      const double measured = static_cast<double>(run.peak_memory_bytes[d]);
      const double error =
          static_cast<double>(predicted.devices[d].peak_memory_bytes) / measured - 1.0;
      std::printf("%s device %zu: measured %lld, predicted %lld (%+.2f %%)\n",
                  describe_plan(run.plan).c_str(), d,
                  static_cast<long long>(run.peak_memory_bytes[d]),
                  static_cast<long long>(predicted.devices[d].peak_memory_bytes), 100.0 * error);
      out.push_back({measured, error});
    }
  }
  return out;
}

Plan plan(std::vector<int> balance, int chunks, CheckpointMode mode, ScheduleKind schedule) {
  Plan p;
  p.balance = std::move(balance);
  p.chunks = chunks;
  p.checkpoint = mode;
  p.schedule = schedule;
  return p;
}

// Memory does not depend on timing: a batch of 8, one warm-up step and two measured, one thread.
RunSettings short_run() {
  RunSettings settings;
  settings.batch = 8;
  settings.steps = 2;
  settings.warmup = 1;
  settings.rounds = 1;
  settings.threads = 1;
  return settings;
}

// `model` profiled at `batch` samples as memory needs it: one warm-up, one repetition, a thread.
Profile memory_profile(models::Model& model, std::int64_t batch) {
  profiler::ProfileOptions po;
  po.batch_size = batch;
  po.warmup = 1;
  po.repeats = 1;
  po.threads = 1;
  po.after_idle = false;  // times unused
  return profiler::profile_model(model, po).profile;
}

// Every stage on one device: one worker thread runs the whole programme, so no copy lands at a
// time the threads decide and the peaks are the same every run (on two devices a received
// activation lands before or after a W's peak by timing). Profiles `model` at `batch`, runs
// `plans` (each given every stage on the one device) and returns each run's peak and error.
std::vector<DevicePeak> peaks_on_one_device(models::Model& model, std::int64_t batch,
                                            std::vector<Plan> plans) {
  RunSettings settings = short_run();
  settings.batch = batch;
  const Profile profile = memory_profile(model, batch);
  for (Plan& p : plans) p.stages_per_device = static_cast<int>(p.balance.size());
  const std::vector<MeasuredRun> runs = measure_plans(model, plans, settings, {});
  return device_peaks(profile, replicate_device(profile.device, 1), runs);
}

// `plans` run with Adam (two moments of state per parameter that trains), each with every stage
// on one device as peaks_on_one_device() runs them.
std::vector<MeasuredRun> runs_with_adam_on_one_device(models::Model& model,
                                                      std::vector<Plan> plans) {
  for (Plan& p : plans) {
    p.stages_per_device = static_cast<int>(p.balance.size());
    p.optimizer_state_factor = exec::optimizer_state_factor(exec::OptimizerKind::Adam);
  }
  RunSettings settings = short_run();
  settings.optimizer = "adam";
  return measure_plans(model, plans, settings, {});
}

// The profile's times set the predicted order of arrivals and frees; the run's own times set
// the measured one, and they differ (the same device was seen exact in one run and one Sigmoid
// output over in the next). So the bytes are held to the run's own order (every task's effects
// at its measured times, SimulationOptions::measured_times): the median device within 1 % (in
// 150 runs of this test, 1155 of 1200 devices were within 0.1 %; the rest were a tensor over
// or under where a copy landed at the edge of a backward, whose frees the model puts at the
// task's end and autograd makes during it); every measured peak to the worst order the
// schedule allows; and the prediction from the profile's times is printed, as the record
// reports it (there the median device missed 1 % in about one run in twenty).
TEST(HeldOutMemory, DevicePeaksExactInTheRunsOwnOrder) {
  models::Model model = held_out_model();
  const Profile profile = memory_profile(model, 8);
  // The same profile as if nothing were known of what autograd keeps: every output charged.
  Profile unmeasured = profile;
  for (auto& l : unmeasured.layers) {
    l.keeps_input = true;
    l.keeps_output = false;
    l.output_aliases_input = false;
  }
  const Hardware hardware = replicate_device(profile.device, 2);
  // No stage starts at relu_ here (AStageStartingWithAnInPlaceLayerHoldsTheCopyOfItsInput).
  const std::vector<Plan> plans = {
      plan({3, 5}, 2, CheckpointMode::Never, ScheduleKind::GPipe),
      plan({4, 4}, 4, CheckpointMode::ExceptLast, ScheduleKind::OneFOneB),
      plan({2, 6}, 1, CheckpointMode::Always, ScheduleKind::GPipe),
      plan({5, 3}, 2, CheckpointMode::Never, ScheduleKind::OneFOneB)};
  RunSettings one_step = short_run();
  one_step.steps = 1;  // the measured peak is then the traced step's
  const std::vector<MeasuredRun> runs = measure_plans(model, plans, one_step, {});
  double worst = 0.0, worst_unmeasured = 0.0;
  std::vector<double> errors;
  for (const MeasuredRun& run : runs) {
    SimulationOptions options;
    options.record_tasks = false;
    options.record_memory = false;
    options.worst_order_peaks = true;
    options.measured_times = measured_task_times(run.trace, "the measured step");
    const SimulationResult predicted = Simulator(profile, hardware).run(run.plan, options);
    const SimulationResult before = Simulator(unmeasured, hardware).run(run.plan, options);
    ASSERT_EQ(predicted.devices.size(), run.peak_memory_bytes.size());
    for (std::size_t d = 0; d < run.peak_memory_bytes.size(); ++d) {
      const DeviceReport& device = predicted.devices[d];
      ASSERT_GT(device.measured_order_peak_bytes, 0) << "a task of the plan is not in the trace";
      const double measured = static_cast<double>(run.peak_memory_bytes[d]);
      auto error = [&](std::int64_t bytes) { return static_cast<double>(bytes) / measured - 1.0; };
      const double in_order = error(device.measured_order_peak_bytes);
      const double in_order_before = error(before.devices[d].measured_order_peak_bytes);
      std::printf(
          "%s device %zu: measured %lld; in the run's order %+.2f %% (without the flags %+.2f %%); "
          "from the profile's times %+.2f %%; worst order %+.2f %%\n",
          describe_plan(run.plan).c_str(), d, static_cast<long long>(run.peak_memory_bytes[d]),
          100.0 * in_order, 100.0 * in_order_before, 100.0 * error(device.peak_memory_bytes),
          100.0 * error(device.worst_order_peak_bytes));
      EXPECT_LE(measured, static_cast<double>(device.worst_order_peak_bytes) * 1.01)
          << describe_plan(run.plan) << " device " << d;
      errors.push_back(std::abs(in_order));
      worst = std::max(worst, std::abs(in_order));
      worst_unmeasured = std::max(worst_unmeasured, std::abs(in_order_before));
    }
  }
  std::sort(errors.begin(), errors.end());
  EXPECT_LE(errors[errors.size() / 2], 0.01);
  std::printf("in the run's order: worst |error| %.2f %%, without the flags %.2f %%\n",
              100.0 * worst, 100.0 * worst_unmeasured);
  // What autograd keeps, measured, is what makes the bytes exact: without it they are not.
  EXPECT_GT(worst_unmeasured, 0.05);
}

// A stage that starts with relu_, which changes its input in place: the executor runs it on a
// copy of the received input (the input is the leaf that collects its gradient, which autograd
// does not let change), and relu_ keeps that copy for its backward. Every device within 0.25 %
// with the profile's modifies_input; without it, short by the copies in flight.
TEST(HeldOutMemory, AStageStartingWithAnInPlaceLayerHoldsTheCopyOfItsInput) {
  models::Model model = held_out_model();
  const Profile profile = memory_profile(model, 8);
  ASSERT_TRUE(profile.layers[1].modifies_input);
  Profile unflagged = profile;
  for (auto& l : unflagged.layers) l.modifies_input = false;
  std::vector<Plan> plans = {
      plan({1, 7}, 4, CheckpointMode::Never, ScheduleKind::Interleaved1F1B),
      plan({1, 1, 6}, 4, CheckpointMode::ExceptLast, ScheduleKind::Interleaved1F1B),
      plan({1, 3, 4}, 2, CheckpointMode::Never, ScheduleKind::InterleavedZB),
      plan({1, 7}, 4, CheckpointMode::Always, ScheduleKind::ZBV)};
  for (Plan& p : plans) p.stages_per_device = static_cast<int>(p.balance.size());
  const std::vector<MeasuredRun> runs = measure_plans(model, plans, short_run(), {});
  const Hardware hardware = replicate_device(profile.device, 1);
  const std::vector<DevicePeak> peaks = device_peaks(profile, hardware, runs);
  const std::vector<DevicePeak> before = device_peaks(unflagged, hardware, runs);
  ASSERT_EQ(peaks.size(), plans.size());
  ASSERT_EQ(before.size(), plans.size());
  for (std::size_t i = 0; i < peaks.size(); ++i) {
    EXPECT_LE(std::abs(peaks[i].error), 0.0025) << describe_plan(plans[i]);
    EXPECT_LT(before[i].error, peaks[i].error) << describe_plan(plans[i]);
  }
}

// A split backward (I, then W) runs the stage's forward layer by layer and holds the output of
// every layer with parameters that train until W, which asks each such layer's weight gradients
// of its own output: here the GroupNorm's, which the Sigmoid after it reads but does not keep,
// and the head's logits. Predicted without them (the storages a plain forward keeps), these
// one-device plans were 9-10 % short; now every one is within 0.25 %.
TEST(HeldOutMemory, ASplitBackwardHoldsTheOutputsOfLayersWithParametersUntilW) {
  models::Model model = held_out_model();
  const std::vector<DevicePeak> peaks =
      peaks_on_one_device(model, 8,
                          {plan({2, 6}, 4, CheckpointMode::Never, ScheduleKind::InterleavedZB),
                           plan({2, 6}, 4, CheckpointMode::Never, ScheduleKind::ZBV),
                           plan({3, 5}, 2, CheckpointMode::ExceptLast, ScheduleKind::InterleavedZB),
                           plan({2, 3, 3}, 4, CheckpointMode::Never, ScheduleKind::InterleavedZB)});
  ASSERT_EQ(peaks.size(), 4u);
  for (const DevicePeak& peak : peaks) EXPECT_LE(std::abs(peak.error), 0.0025);
}

// A residual block as ResNet's: relu(x + norm(conv(relu(norm(conv(x)))))). Its last ReLU keeps
// the block's output, which autograd frees, with the gradient fed to the block, as soon as that
// ReLU's backward has run: before the convolutions' backward peaks.
class ResidualImpl : public torch::nn::Module {
 public:
  explicit ResidualImpl(std::int64_t channels) {
    namespace nn = torch::nn;
    conv1 =
        register_module("conv1", nn::Conv2d(nn::Conv2dOptions(channels, channels, 3).padding(1)));
    norm1 = register_module("norm1", nn::GroupNorm(nn::GroupNormOptions(4, channels)));
    conv2 =
        register_module("conv2", nn::Conv2d(nn::Conv2dOptions(channels, channels, 3).padding(1)));
    norm2 = register_module("norm2", nn::GroupNorm(nn::GroupNormOptions(4, channels)));
  }
  at::Tensor forward(const at::Tensor& x) {
    return at::relu(x + norm2(conv2(at::relu(norm1(conv1(x))))));
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::GroupNorm norm1{nullptr}, norm2{nullptr};
};
TORCH_MODULE(Residual);

models::Model residual_model() {
  namespace nn = torch::nn;
  models::Model m = held_out_model();
  m.name = m.spec = "held-out-residual";
  m.layer_names.clear();
  m.layers = nn::Sequential();
  auto add = [&](const std::string& name, nn::AnyModule module) {
    m.layer_names.push_back(name);
    m.layers->push_back(name, std::move(module));
  };
  add("stem", nn::AnyModule(nn::Conv2d(nn::Conv2dOptions(3, 16, 3).padding(1))));
  for (int b = 0; b < 4; ++b) add("block" + std::to_string(b), nn::AnyModule(Residual(16)));
  add("pool", nn::AnyModule(MeanPool()));
  add("flatten", nn::AnyModule(nn::Flatten()));
  add("head", nn::AnyModule(nn::Linear(16, 10)));
  return m;
}

TEST(HeldOutMemory, ResidualBlocksEveryPlanWithinOnePercent) {
  models::Model model = residual_model();
  const Profile profile = memory_profile(model, 8);
  // The same profile without the peaks measured inside a stage: each layer's output and the
  // gradient it receives charged through its whole backward.
  Profile held = profile;
  for (auto& l : held.layers) {
    l.inner_backward_peak_bytes.clear();
    l.inner_backward_accumulate_peak_bytes.clear();
  }
  const Hardware hardware = replicate_device(profile.device, 2);
  const std::vector<Plan> plans = {
      plan({3, 5}, 2, CheckpointMode::Never, ScheduleKind::GPipe),
      plan({4, 4}, 4, CheckpointMode::Never, ScheduleKind::OneFOneB),
      plan({2, 6}, 2, CheckpointMode::ExceptLast, ScheduleKind::OneFOneB),
      plan({5, 3}, 4, CheckpointMode::ExceptLast, ScheduleKind::GPipe),
      plan({3, 5}, 2, CheckpointMode::Always, ScheduleKind::OneFOneB),
      plan({4, 4}, 1, CheckpointMode::Always, ScheduleKind::GPipe)};
  const std::vector<MeasuredRun> runs = measure_plans(model, plans, short_run(), {});
  std::vector<double> errors, errors_held;
  for (const MeasuredRun& run : runs) {
    const SimulationResult predicted = Simulator(profile, hardware).run(run.plan);
    const SimulationResult before = Simulator(held, hardware).run(run.plan);
    ASSERT_EQ(predicted.devices.size(), run.peak_memory_bytes.size());
    for (std::size_t d = 0; d < run.peak_memory_bytes.size(); ++d) {
      const double measured = static_cast<double>(run.peak_memory_bytes[d]);
      const double error =
          static_cast<double>(predicted.devices[d].peak_memory_bytes) / measured - 1.0;
      const double error_held =
          static_cast<double>(before.devices[d].peak_memory_bytes) / measured - 1.0;
      std::printf(
          "%s device %zu: measured %lld, predicted %lld (%+.2f %%), held peaks only %lld (%+.2f "
          "%%)\n",
          describe_plan(run.plan).c_str(), d, static_cast<long long>(run.peak_memory_bytes[d]),
          static_cast<long long>(predicted.devices[d].peak_memory_bytes), 100.0 * error,
          static_cast<long long>(before.devices[d].peak_memory_bytes), 100.0 * error_held);
      errors.push_back(std::abs(error));
      errors_held.push_back(std::abs(error_held));
    }
  }
  std::sort(errors.begin(), errors.end());
  std::sort(errors_held.begin(), errors_held.end());
  std::printf("median |error| %.2f %% (held peaks only %.2f %%), worst %.2f %% (%.2f %%)\n",
              100.0 * errors[errors.size() / 2], 100.0 * errors_held[errors_held.size() / 2],
              100.0 * errors.back(), 100.0 * errors_held.back());
  // As above, a device whose peak depends on the order of a copy and a backward can move with
  // the timings; the median cannot.
  EXPECT_LE(errors[errors.size() / 2], 0.01);
}

// Transfer learning's frozen stem: the stem and the first residual block frozen, trained with
// Adam. Frozen parameters get no gradient and no optimizer state, and the layers up to the first
// that trains build no graph (their input is data), on whichever stage they lie: charged as
// trained, a timm ResNet's first device was 4.5 % over and its second 1.5-4.0 % short (its
// stages asked gradients of their inputs that one device's autograd never makes). Every stage
// boundary here is in the stem, at its end, or after it.
TEST(HeldOutMemory, AFrozenStemHoldsNoGraphNoGradientsAndNoOptimizerState) {
  models::Model model = residual_model();
  for (std::size_t l = 0; l < 2; ++l) {
    for (auto& p : (*model.layers)[l]->parameters()) p.set_requires_grad(false);
  }
  const Profile profile = memory_profile(model, 8);
  // The profile says what trains, and the stem has no backward at all.
  for (std::size_t l = 0; l < 2; ++l) {
    EXPECT_GT(profile.layers[l].param_bytes, 0);
    EXPECT_EQ(profile.layers[l].trainable_param_bytes, 0) << l;
    for (double ms : profile.layers[l].backward_ms) EXPECT_EQ(ms, 0.0) << l;
    for (std::int64_t bytes : profile.layers[l].saved_bytes) EXPECT_EQ(bytes, 0) << l;
  }
  EXPECT_EQ(profile.layers[2].trainable_param_bytes, -1);  // all of it trains: not written
  Profile as_if_trained = profile;
  for (auto& l : as_if_trained.layers) l.trainable_param_bytes = -1;
  const std::vector<Plan> plans = {
      plan({1, 2, 5}, 2, CheckpointMode::Never, ScheduleKind::Interleaved1F1B),
      plan({2, 6}, 4, CheckpointMode::ExceptLast, ScheduleKind::InterleavedZB),
      plan({3, 5}, 2, CheckpointMode::Never, ScheduleKind::ZBV),
      plan({8}, 2, CheckpointMode::Never, ScheduleKind::OneFOneB)};
  const std::vector<MeasuredRun> runs = runs_with_adam_on_one_device(model, plans);
  const Hardware hardware = replicate_device(profile.device, 1);
  const std::vector<DevicePeak> peaks = device_peaks(profile, hardware, runs);
  ASSERT_EQ(peaks.size(), plans.size());
  for (const DevicePeak& peak : peaks) EXPECT_LE(std::abs(peak.error), 0.0025);
  // Charged as trained, every device is over by the stem's gradients and Adam's two moments.
  const std::vector<DevicePeak> charged = device_peaks(as_if_trained, hardware, runs);
  for (const DevicePeak& peak : charged) EXPECT_GT(peak.error, 0.01);
}

// A position table as transformers keep one (GPT-J's sin/cos table, BEiT's relative-position
// index): a buffer, held from step to step with no gradient and no optimizer state, and copied
// for the length of each recompute, which puts it back after (batch norm counts a micro-batch
// once). Each layer holds 64 KiB of table beside 1 KiB of weights: every device within 0.5 %,
// and without the tables' bytes about 93 % short (a checkpointed plan's recomputes twice the
// tables: 812,520 bytes measured against 421,196 for the others).
class TabledImpl : public torch::nn::Module {
 public:
  TabledImpl() {
    table = register_buffer("table", at::randn({16, 1024}));  // 64 KiB of float32
    scale = register_parameter("scale", at::ones({16, 16}));
  }
  at::Tensor forward(const at::Tensor& x) {
    // Reads the table's first column, so the forward uses it; autograd keeps x and the sum.
    return at::matmul(x, scale) + table.select(1, 0);
  }
  at::Tensor table, scale;
};
TORCH_MODULE(Tabled);

TEST(HeldOutMemory, BuffersAreHeldWithoutGradientOrOptimizerState) {
  namespace nn = torch::nn;
  models::Model model = held_out_input_and_loss("tabled");
  model.make_batch = [](std::int64_t batch, std::int64_t step, std::uint64_t seed) {
    auto g = at::detail::createCPUGenerator(seed * 1000003 + static_cast<std::uint64_t>(step));
    return std::make_pair(at::randn({batch, 16}, g), at::randint(16, {batch}, g, at::kLong));
  };
  for (int k = 0; k < 6; ++k)
    add_layer(model, "tabled" + std::to_string(k), nn::AnyModule(Tabled()));
  const Profile profile = memory_profile(model, 8);
  for (const LayerProfile& l : profile.layers) {
    EXPECT_EQ(l.buffer_bytes, 16 * 1024 * 4) << l.name;  // the table, counted once
    EXPECT_EQ(l.param_bytes, 16 * 16 * 4) << l.name;
  }
  Profile without = profile;
  for (auto& l : without.layers) l.buffer_bytes = 0;
  // Every stage on the one device (peaks_on_one_device() says why).
  const std::vector<Plan> plans = {
      plan({6}, 2, CheckpointMode::Never, ScheduleKind::OneFOneB),
      plan({6}, 4, CheckpointMode::ExceptLast, ScheduleKind::GPipe),
      plan({2, 4}, 2, CheckpointMode::Never, ScheduleKind::Interleaved1F1B),
      plan({1, 2, 2, 1}, 2, CheckpointMode::Never, ScheduleKind::InterleavedZB)};
  const std::vector<MeasuredRun> runs = runs_with_adam_on_one_device(model, plans);
  const Hardware hardware = replicate_device(profile.device, 1);
  const std::vector<DevicePeak> peaks = device_peaks(profile, hardware, runs);
  ASSERT_EQ(peaks.size(), plans.size());
  for (const DevicePeak& peak : peaks) EXPECT_LE(std::abs(peak.error), 0.005);
  // Charged with gradients and Adam's moments the tables would be over by twice their bytes;
  // left out, every device is short by them.
  const std::vector<DevicePeak> short_of_tables = device_peaks(without, hardware, runs);
  for (const DevicePeak& peak : short_of_tables) EXPECT_LT(peak.error, -0.2);
}

// Wide linear layers and a small batch: the parameter gradients dominate every device, so how
// the split backward's W creates them (per layer, from each layer's own output gradient: one
// layer's at a time besides .grad) decides the peak. Every device of the zero-bubble schedules
// within 1 %; charging W with the whole stage's gradients at once was 10-20 % over. Two plans
// start with a stage of the parameterless Flatten alone, which has no graph to run backward
// through (its whole backward threw "does not require grad" before).
TEST(HeldOutMemory, WideLayersEverySchedulesDevicesWithinOnePercent) {
  namespace nn = torch::nn;
  models::Model model = held_out_input_and_loss("held-out-wide");
  auto add = [&](const std::string& name, nn::AnyModule module) {
    add_layer(model, name, std::move(module));
  };
  add("flatten", nn::AnyModule(nn::Flatten()));
  add("wide0", nn::AnyModule(nn::Linear(3 * 16 * 16, 256)));
  add("relu", nn::AnyModule(nn::ReLU()));
  add("wide1", nn::AnyModule(nn::Linear(256, 384)));
  add("tanh", nn::AnyModule(nn::Tanh()));
  add("wide2", nn::AnyModule(nn::Linear(384, 256)));
  add("wide3", nn::AnyModule(nn::Linear(256, 256)));
  add("head", nn::AnyModule(nn::Linear(256, 10)));
  const Profile profile = memory_profile(model, 8);
  const Hardware hardware = replicate_device(profile.device, 2);
  auto two_per_device = [](Plan p) {
    p.stages_per_device = 2;
    return p;
  };
  const std::vector<Plan> plans = {
      two_per_device(plan({2, 2, 2, 2}, 4, CheckpointMode::Never, ScheduleKind::InterleavedZB)),
      two_per_device(plan({3, 2, 1, 2}, 2, CheckpointMode::Always, ScheduleKind::InterleavedZB)),
      two_per_device(plan({2, 2, 2, 2}, 4, CheckpointMode::ExceptLast, ScheduleKind::ZBV)),
      two_per_device(plan({1, 3, 2, 2}, 4, CheckpointMode::Never, ScheduleKind::DualPipeV)),
      plan({1, 7}, 2, CheckpointMode::ExceptLast, ScheduleKind::OneFOneB)};
  const std::vector<MeasuredRun> runs = measure_plans(model, plans, short_run(), {});
  double worst = 0.0;
  for (const DevicePeak& peak : device_peaks(profile, hardware, runs)) {
    // The Flatten-only stage holds a few micro-batch inputs of 12 KiB: one more or less in
    // flight, by timing, is 25 % of its peak; that order is not what this test is about.
    if (peak.measured >= 64 * 1024) worst = std::max(worst, std::abs(peak.error));
  }
  EXPECT_LE(worst, 0.01);
}

// Blocks of a Linear and its activation, as the zoo's MLP has them, with activations as large as
// the weights: a block's W runs the activation's backward before the Linear's weights, so it
// holds that gradient (one activation) beside the block's fresh parameter gradients. Charging W
// with the parameters alone was one activation short on the zero-bubble devices (1-3 % on the
// zoo's MLP record; here 2.6-5.3 % under on every plan).
class LinearThenImpl : public torch::nn::Module {
 public:
  LinearThenImpl(std::int64_t in, std::int64_t out, at::Tensor (*activation)(const at::Tensor&))
      : linear(register_module("linear", torch::nn::Linear(in, out))), activation_(activation) {}
  at::Tensor forward(const at::Tensor& x) { return activation_(linear(x)); }
  torch::nn::Linear linear;

 private:
  at::Tensor (*activation_)(const at::Tensor&);
};
TORCH_MODULE(LinearThen);

TEST(HeldOutMemory, SplitBackwardOfCompositeBlocksWithinHalfAPercent) {
  namespace nn = torch::nn;
  models::Model model = held_out_input_and_loss("held-out-blocks");
  auto add = [&](const std::string& name, nn::AnyModule module) {
    add_layer(model, name, std::move(module));
  };
  add("flatten", nn::AnyModule(nn::Flatten()));
  add("block0", nn::AnyModule(LinearThen(3 * 16 * 16, 256, &at::relu)));
  add("block1", nn::AnyModule(LinearThen(256, 256, &at::tanh)));
  add("block2", nn::AnyModule(LinearThen(256, 256, &at::relu)));
  add("block3", nn::AnyModule(LinearThen(256, 256, &at::sigmoid)));
  add("head", nn::AnyModule(nn::Linear(256, 10)));
  const std::vector<DevicePeak> peaks = peaks_on_one_device(
      model, 256,
      {plan({2, 1, 2, 1}, 1, CheckpointMode::Never, ScheduleKind::InterleavedZB),
       plan({2, 2, 1, 1}, 2, CheckpointMode::ExceptLast, ScheduleKind::InterleavedZB),
       plan({3, 3}, 1, CheckpointMode::Never, ScheduleKind::ZBV),
       plan({2, 4}, 2, CheckpointMode::Always, ScheduleKind::DualPipeV)});
  ASSERT_FALSE(peaks.empty());
  for (const DevicePeak& peak : peaks) EXPECT_LE(std::abs(peak.error), 0.005);
}

// Convolution blocks whose activations outweigh their weights, then a wide head: a stage's
// W frees each block's graph once that block's weights are done (autograd does not keep it), so
// by the time the head's gradients are made the blocks' saved tensors are gone. (On a
// torchvision ResNet-18, whose layers are whole stages of blocks, charging W with every
// activation until it ended put a zero-bubble device 22 % over.)
class ConvBlockImpl : public torch::nn::Module {
 public:
  explicit ConvBlockImpl(std::int64_t channels)
      : conv(register_module(
            "conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, channels, 3).padding(1)))),
        norm(register_module("norm",
                             torch::nn::GroupNorm(torch::nn::GroupNormOptions(4, channels)))) {}
  at::Tensor forward(const at::Tensor& x) { return at::relu(norm(conv(x))); }
  torch::nn::Conv2d conv;
  torch::nn::GroupNorm norm;
};
TORCH_MODULE(ConvBlock);

TEST(HeldOutMemory, SplitBackwardFreesEachBlocksActivationsAsItsWeightsAreDone) {
  namespace nn = torch::nn;
  models::Model model = held_out_input_and_loss("held-out-conv-blocks");
  auto add = [&](const std::string& name, nn::AnyModule module) {
    add_layer(model, name, std::move(module));
  };
  add("stem", nn::AnyModule(nn::Conv2d(nn::Conv2dOptions(3, 32, 3).padding(1))));
  add("block1", nn::AnyModule(ConvBlock(32)));
  add("block2", nn::AnyModule(ConvBlock(32)));
  add("block3", nn::AnyModule(ConvBlock(32)));
  add("flatten", nn::AnyModule(nn::Flatten()));
  add("head", nn::AnyModule(nn::Linear(32 * 16 * 16, 48)));
  const std::vector<Plan> plans = {
      plan({3, 3}, 1, CheckpointMode::Never, ScheduleKind::ZBV),
      plan({4, 2}, 2, CheckpointMode::Never, ScheduleKind::InterleavedZB),
      plan({2, 2, 2}, 1, CheckpointMode::Never, ScheduleKind::InterleavedZB),
      plan({2, 4}, 2, CheckpointMode::ExceptLast, ScheduleKind::DualPipeV)};
  const std::vector<DevicePeak> peaks = peaks_on_one_device(model, 16, plans);
  ASSERT_EQ(peaks.size(), plans.size());
  // Within 0.01 % here; W holding every activation to its end was 0.4-0.9 % over on the first
  // three plans (a saved tensor of each block beside the head's gradients).
  for (const DevicePeak& peak : peaks) EXPECT_LE(std::abs(peak.error), 0.0025);
}

// A block of two wide convolutions on a small image, as torchvision's layer4: its weights
// outweigh its activations, and its backward's weight gradients need as much again in
// transients. W's autograd.grad returns the block's weight gradients all at once, where a
// backward's AccumulateGrad adds each into .grad as it is made and frees it. So every W of the
// block peaks as its first backward did, .grad or not: charging the later ones the accumulating
// backward's peak put the device short (on torchvision's layer4, 33.6 MB of weights, a
// zero-bubble device -13 %).
class WideBlockImpl : public torch::nn::Module {
 public:
  WideBlockImpl()
      : first(register_module("first",
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(256, 256, 3).padding(1)))),
        second(register_module(
            "second", torch::nn::Conv2d(torch::nn::Conv2dOptions(256, 256, 3).padding(1)))) {}
  at::Tensor forward(const at::Tensor& x) { return at::relu(second(at::relu(first(x)))); }
  torch::nn::Conv2d first, second;
};
TORCH_MODULE(WideBlock);

TEST(HeldOutMemory, EveryWeightGradientAfterTheFirstHoldsTheLayersFreshGradientsAtOnce) {
  namespace nn = torch::nn;
  models::Model model = held_out_input_and_loss("held-out-wide-block");
  auto add = [&](const std::string& name, nn::AnyModule module) {
    add_layer(model, name, std::move(module));
  };
  add("stem", nn::AnyModule(nn::Conv2d(nn::Conv2dOptions(3, 256, 3).padding(1).stride(4))));
  add("wide", nn::AnyModule(WideBlock()));
  add("pool", nn::AnyModule(MeanPool()));
  add("flatten", nn::AnyModule(nn::Flatten()));
  add("head", nn::AnyModule(nn::Linear(256, 10)));
  const std::vector<DevicePeak> peaks = peaks_on_one_device(
      model, 16,
      {plan({1, 1, 2, 1}, 2, CheckpointMode::Never, ScheduleKind::InterleavedZB),
       plan({2, 3}, 4, CheckpointMode::Never, ScheduleKind::ZBV),
       plan({1, 1, 2, 1}, 4, CheckpointMode::ExceptLast, ScheduleKind::InterleavedZB)});
  ASSERT_EQ(peaks.size(), 3u);
  for (const DevicePeak& peak : peaks) EXPECT_LE(std::abs(peak.error), 0.0025);
}

// One layer of several transformer MLP blocks (x + W2 gelu(W1 x)), as a library's stage of blocks
// is one child: its backward frees each block's saved tensors as it passes it, while the blocks
// before it have yet to make their gradients, so its measured peak is well below its parameters.
// W peaks there too (its walk is the same). Charging W at least the layer's whole parameters on
// top of every saved tensor put these devices 13-26 % over (timm's ConvNeXt-atto, whose third stage
// is such a child, 36 % over on a zero-bubble device). Charged the backward's peak less the
// layer's input gradient, which W does not make, they were up to 1.2 % short: this backward
// peaked before making it. The profile's own W peak: within 0.1 %.
class MlpBlocksImpl : public torch::nn::Module {
 public:
  MlpBlocksImpl(std::int64_t width, int blocks) {
    for (int b = 0; b < blocks; ++b) {
      up.push_back(register_module("up" + std::to_string(b), torch::nn::Linear(width, 4 * width)));
      down.push_back(
          register_module("down" + std::to_string(b), torch::nn::Linear(4 * width, width)));
    }
  }
  at::Tensor forward(at::Tensor x) {
    for (std::size_t b = 0; b < up.size(); ++b) x = x + down[b](at::gelu(up[b](x)));
    return x;
  }
  std::vector<torch::nn::Linear> up, down;
};
TORCH_MODULE(MlpBlocks);

TEST(HeldOutMemory, SplitBackwardOfALayerOfManyBlocksPeaksAsItsBackward) {
  namespace nn = torch::nn;
  models::Model model = held_out_input_and_loss("held-out-mlp-blocks");
  auto add = [&](const std::string& name, nn::AnyModule module) {
    add_layer(model, name, std::move(module));
  };
  add("flatten", nn::AnyModule(nn::Flatten()));
  add("proj", nn::AnyModule(nn::Linear(3 * 16 * 16, 128)));
  add("blocks", nn::AnyModule(MlpBlocks(128, 4)));
  add("head", nn::AnyModule(nn::Linear(128, 10)));
  const std::vector<Plan> plans = {
      plan({2, 1, 1}, 1, CheckpointMode::Never, ScheduleKind::InterleavedZB),
      plan({2, 1, 1}, 2, CheckpointMode::ExceptLast, ScheduleKind::InterleavedZB),
      plan({2, 2}, 1, CheckpointMode::Never, ScheduleKind::ZBV)};
  const std::vector<DevicePeak> peaks = peaks_on_one_device(model, 128, plans);
  ASSERT_EQ(peaks.size(), plans.size());
  for (const DevicePeak& peak : peaks) EXPECT_LE(std::abs(peak.error), 0.0025);
}

// A transformer layer as one child (attention over 16 tokens, then an MLP), as transformers' and
// timm's blocks are: its I keeps the graph, so no saved tensor is freed while the gradients
// inside the layer are made, and the attention's (4 heads x 16 x 16 a sample, several at once)
// pile up. Charging I the input's gradient and the forward's workspace put BERT's zero-bubble
// devices 9.4 % short, and these -3.6, -2.0 and -5.8 %; the profile now measures I's and W's own
// peaks: -0.01, -0.01 and -2.2 %. The ZBV plan's last 50 KB were the output of its first layer,
// held for W though nothing keeps it (ASplitBackwardHoldsTheOutputsOfLayersWithParametersUntilW):
// now -0.01 % as the others.
class TokensImpl : public torch::nn::Module {
 public:
  at::Tensor forward(const at::Tensor& x) { return x.reshape({x.size(0), 16, 48}); }
};
TORCH_MODULE(Tokens);

class AttentionLayerImpl : public torch::nn::Module {
 public:
  explicit AttentionLayerImpl(std::int64_t width)
      : qkv(register_module("qkv", torch::nn::Linear(width, 3 * width))),
        out(register_module("out", torch::nn::Linear(width, width))),
        up(register_module("up", torch::nn::Linear(width, 4 * width))),
        down(register_module("down", torch::nn::Linear(4 * width, width))) {}
  at::Tensor forward(const at::Tensor& x) {
    const std::int64_t n = x.size(0), t = x.size(1), d = x.size(2), heads = 4;
    auto parts = qkv(x).reshape({n, t, 3, heads, d / heads}).permute({2, 0, 3, 1, 4});
    const at::Tensor scores = at::matmul(parts[0], parts[1].transpose(-2, -1)) /
                              std::sqrt(static_cast<double>(d / heads));
    const at::Tensor mixed = at::matmul(at::softmax(scores, -1), parts[2]);
    const at::Tensor h = x + out(mixed.permute({0, 2, 1, 3}).reshape({n, t, d}));
    return h + down(at::gelu(up(h)));
  }
  torch::nn::Linear qkv, out, up, down;
};
TORCH_MODULE(AttentionLayer);

class TokenMeanImpl : public torch::nn::Module {
 public:
  at::Tensor forward(const at::Tensor& x) { return x.mean(1); }
};
TORCH_MODULE(TokenMean);

TEST(HeldOutMemory, SplitBackwardOfATransformerLayerKeepsItsGraphThroughI) {
  namespace nn = torch::nn;
  models::Model model = held_out_input_and_loss("held-out-attention");
  auto add = [&](const std::string& name, nn::AnyModule module) {
    add_layer(model, name, std::move(module));
  };
  add("tokens", nn::AnyModule(Tokens()));
  add("layer1", nn::AnyModule(AttentionLayer(48)));
  add("layer2", nn::AnyModule(AttentionLayer(48)));
  add("pool", nn::AnyModule(TokenMean()));
  add("head", nn::AnyModule(nn::Linear(48, 10)));
  const std::vector<Plan> plans = {
      plan({2, 1, 2}, 1, CheckpointMode::Never, ScheduleKind::InterleavedZB),
      plan({1, 2, 1, 1}, 2, CheckpointMode::Never, ScheduleKind::InterleavedZB),
      plan({2, 3}, 1, CheckpointMode::Never, ScheduleKind::ZBV)};
  const std::vector<DevicePeak> peaks = peaks_on_one_device(model, 16, plans);
  ASSERT_EQ(peaks.size(), plans.size());
  for (const DevicePeak& peak : peaks) EXPECT_LE(std::abs(peak.error), 0.005);
}

// torchvision's stem: a convolution, a batch norm whose output a ReLU(inplace=True) changes, and
// a max pooling. A split backward's boundary for the batch norm is that one storage, so I
// captures the gradient at the ReLU's output, made by the pooling's backward, and holds it
// while the ReLU's and the batch norm's backwards run: the model let it pass through and kept
// the batch norm's own output gradient instead, short by one activation at I's peak: -9.6 to
// -13.8 % on the first four plans here (torchvision's ResNet-18 split after its max pooling:
// -7.8 to -13.6 %). One device, so the order is fixed; every plan within 0.25 % now, the last,
// whose chain reaches the stage's output, too.
TEST(HeldOutMemory, ASplitBackwardCapturesTheGradientAboveAnInPlaceLayer) {
  namespace nn = torch::nn;
  models::Model model = held_out_input_and_loss("stem");
  add_layer(model, "conv", nn::AnyModule(nn::Conv2d(nn::Conv2dOptions(3, 32, 3).padding(1))));
  add_layer(model, "norm", nn::AnyModule(nn::BatchNorm2d(32)));
  add_layer(model, "relu_", nn::AnyModule(nn::ReLU(nn::ReLUOptions().inplace(true))));
  add_layer(model, "maxpool", nn::AnyModule(nn::MaxPool2d(nn::MaxPool2dOptions(2))));
  add_layer(model, "conv2", nn::AnyModule(nn::Conv2d(nn::Conv2dOptions(32, 8, 3).padding(1))));
  add_layer(model, "pool", nn::AnyModule(MeanPool()));
  add_layer(model, "flatten", nn::AnyModule(nn::Flatten()));
  add_layer(model, "head", nn::AnyModule(nn::Linear(8, 10)));
  const std::vector<DevicePeak> peaks =
      peaks_on_one_device(model, 8,
                          {plan({4, 4}, 1, CheckpointMode::Never, ScheduleKind::InterleavedZB),
                           plan({5, 3}, 2, CheckpointMode::Never, ScheduleKind::InterleavedZB),
                           plan({4, 4}, 2, CheckpointMode::Never, ScheduleKind::ZBV),
                           plan({4, 2, 2}, 1, CheckpointMode::Never, ScheduleKind::InterleavedZB),
                           plan({3, 5}, 1, CheckpointMode::Never, ScheduleKind::InterleavedZB)});
  ASSERT_EQ(peaks.size(), 5u);
  for (const DevicePeak& peak : peaks) EXPECT_LE(std::abs(peak.error), 0.0025);
}

// SqueezeNet's and AlexNet's stem: a convolution whose output a ReLU(inplace=True) changes, then
// a max pooling. W asks the convolution's weight gradient of that one storage, whose history is
// the ReLU's, with the gradient I held there: autograd runs the ReLU's backward again, a fresh
// activation's gradient on top of W's own peak, which the profile times from the convolution's
// own output. Where that W is the device's peak the model was one activation short (SqueezeNet's
// first stage under zbv: -8 %).
TEST(HeldOutMemory, AWeightGradientUnderAnInPlaceLayerRunsItsBackwardAgain) {
  namespace nn = torch::nn;
  models::Model model = held_out_input_and_loss("conv-relu-stem");
  add_layer(model, "conv", nn::AnyModule(nn::Conv2d(nn::Conv2dOptions(3, 48, 3).padding(1))));
  add_layer(model, "relu_", nn::AnyModule(nn::ReLU(nn::ReLUOptions().inplace(true))));
  add_layer(model, "maxpool", nn::AnyModule(nn::MaxPool2d(nn::MaxPool2dOptions(2))));
  add_layer(model, "conv2", nn::AnyModule(nn::Conv2d(nn::Conv2dOptions(48, 8, 3).padding(1))));
  add_layer(model, "pool", nn::AnyModule(MeanPool()));
  add_layer(model, "flatten", nn::AnyModule(nn::Flatten()));
  add_layer(model, "head", nn::AnyModule(nn::Linear(8, 10)));
  const std::vector<DevicePeak> peaks =
      peaks_on_one_device(model, 8,
                          {plan({3, 4}, 1, CheckpointMode::Never, ScheduleKind::InterleavedZB),
                           plan({3, 4}, 2, CheckpointMode::Never, ScheduleKind::ZBV),
                           plan({3, 2, 2}, 1, CheckpointMode::Never, ScheduleKind::InterleavedZB),
                           plan({4, 3}, 2, CheckpointMode::Never, ScheduleKind::InterleavedZB)});
  ASSERT_EQ(peaks.size(), 4u);
  for (const DevicePeak& peak : peaks) EXPECT_LE(std::abs(peak.error), 0.0025);
}

// The last stage makes its output's gradient from the loss inside its last layer's I, whose
// measured peak (the profile times the last layer with the loss) holds it already: the walk had
// also counted it as there before that layer ran. And that layer's W starts from the kept
// gradient, where the profile had timed it from the loss, two logits' worth more. Both show
// where the logits outweigh the rest (transformers' OPT, whose vocabulary is wide against its
// width: +11.7 % on the device of its last stage under zbv). A head of 512 classes on a trunk
// of 16, 256 samples: 13-18 % over with either mended alone (checked by reverting each).
TEST(HeldOutMemory, TheLastStagesSplitBackwardRunsTheLossOnce) {
  namespace nn = torch::nn;
  models::Model model = held_out_input_and_loss("wide-head");
  add_layer(model, "flatten", nn::AnyModule(nn::Flatten()));
  add_layer(model, "trunk", nn::AnyModule(nn::Linear(3 * 16 * 16, 16)));
  add_layer(model, "relu", nn::AnyModule(nn::ReLU()));
  add_layer(model, "head", nn::AnyModule(nn::Linear(16, 512)));
  const std::vector<DevicePeak> peaks =
      peaks_on_one_device(model, 256,
                          {plan({2, 2}, 1, CheckpointMode::Never, ScheduleKind::InterleavedZB),
                           plan({3, 1}, 2, CheckpointMode::Never, ScheduleKind::InterleavedZB),
                           plan({2, 2}, 1, CheckpointMode::Never, ScheduleKind::ZBV),
                           plan({1, 2, 1}, 1, CheckpointMode::Never, ScheduleKind::InterleavedZB)});
  ASSERT_EQ(peaks.size(), 4u);
  for (const DevicePeak& peak : peaks) EXPECT_LE(std::abs(peak.error), 0.0025);
}

// What the libraries keep on a GPU (cuBLAS: a workspace per thread and stream) is charged once
// per device from the profile's device.library_bytes. The profile must measure as many as a
// pipeline's device holds: on an H100 a pipeline held 65 MiB (its compute thread's and
// autograd's workspaces on its stream, and cuBLASLt's) where a profile said 33 MiB. Profiled
// first, as a user does, then run: the profile's figure is what the run's device gained beyond
// its tensors.
TEST(HeldOutMemory, CudaLibraryBytesOfAProfileAreAPipelines) {
  PIPETUNE_GPU_TEST_NEEDS(torch::cuda::is_available(), "no CUDA device");
  models::Model model = models::build_model("mlp:layers=4,width=1024");
  profiler::ProfileOptions po;
  po.batch_size = 64;
  po.micro_batch_sizes = {32, 64};
  po.device = "cuda";
  po.warmup = 1;
  po.repeats = 1;
  const Profile profile = profiler::profile_model(model, po).profile;
  RunSettings settings;
  settings.batch = 64;
  settings.steps = 2;
  settings.warmup = 1;
  settings.rounds = 1;
  settings.device = "cuda";
  Plan p = plan({3, 2}, 2, CheckpointMode::Never, ScheduleKind::OneFOneB);
  p.devices = {"cuda:0", "cuda:0"};
  const std::vector<MeasuredRun> runs = measure_plans(model, {p}, settings, {});
  ASSERT_EQ(runs[0].library_memory_bytes.size(), 1u);
  std::printf("profile library bytes %lld, pipeline's %lld\n",
              static_cast<long long>(profile.device.library_bytes),
              static_cast<long long>(runs[0].library_memory_bytes[0]));
  EXPECT_GT(profile.device.library_bytes, 0);
  EXPECT_EQ(profile.device.library_bytes, runs[0].library_memory_bytes[0]);
}

}  // namespace
}  // namespace pipetune::validate
