// The executor against an unpipelined reference run (float64), and its behaviour when stages
// fail, plans are bad, or the schedule asks for an order.

#include "executor/executor.hpp"

#include <ATen/ATen.h>
#include <dirent.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/optim/sgd.h>
#if PIPETUNE_WITH_CUDA
#include <ATen/cuda/Sleep.h>
#endif

#include <chrono>
#include <condition_variable>
#include <ctime>
#include <fstream>
#include <mutex>
#include <thread>

#include "executor/counting_allocator.hpp"
#include "executor/device_runtime.hpp"
#include "executor/models/layers.hpp"
#include "executor/transport.hpp"
#include "sim/error.hpp"
#include "sim/replay.hpp"
#include "sim/schedule.hpp"
#include "tests/executor/reference.hpp"
#include "tests/support/gpu.hpp"

namespace pipetune {
namespace {

using exec::CountingAllocator;
using exec::ExecutorOptions;
using exec::OptimizerKind;
using exec::Pipeline;
using models::ModelOptions;

constexpr std::int64_t kBatch = 6;

ModelOptions double_precision(bool deferred = false) {
  ModelOptions o;
  o.dtype = at::kDouble;
  o.seed = 7;
  o.deferred_batch_norm = deferred;
  return o;
}

std::pair<at::Tensor, at::Tensor> batch_for(models::Model& m, std::int64_t batch = kBatch) {
  auto [x, y] = m.make_batch(batch, 3, 0);
  if (at::isFloatingType(x.scalar_type())) x = x.to(at::kDouble);
  return {x, y};
}

Plan plan_of(std::vector<int> balance, int chunks, CheckpointMode mode, ScheduleKind kind,
             std::vector<std::string> devices = {}) {
  Plan p;
  p.balance = std::move(balance);
  p.chunks = chunks;
  p.checkpoint = mode;
  p.schedule = kind;
  p.devices = std::move(devices);
  return p;
}

ExecutorOptions cpu_devices(int n, OptimizerKind optimizer = OptimizerKind::None) {
  ExecutorOptions o;
  for (int d = 0; d < n; ++d) o.devices.push_back("cpu:" + std::to_string(d));
  o.threads_per_cpu_device = 1;
  o.optimizer = optimizer;
  o.seed = 11;
  return o;
}

void expect_same(const std::map<std::string, at::Tensor>& a,
                 const std::map<std::string, at::Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, tensor] : a) {
    ASSERT_TRUE(b.count(name)) << what << ": " << name;
    EXPECT_TRUE(at::allclose(tensor.cpu(), b.at(name).cpu(), 1e-9, 1e-11)) << what << ": " << name;
  }
}

struct Transparency {
  std::string spec;
  std::vector<int> balance;
  int chunks;
  std::vector<std::string> devices;  // empty: one per stage
};

class TransparencyTest : public ::testing::TestWithParam<Transparency> {};

// Loss and every parameter gradient equal the unpipelined run, whatever the balance, chunk
// count, checkpoint mode or schedule.
TEST_P(TransparencyTest, LossAndGradientsEqualTheUnpipelinedRun) {
  const Transparency& t = GetParam();
  models::Model reference = models::build_model(t.spec, double_precision());
  auto [input, target] = batch_for(reference);
  const double expected_loss = testing::reference_step(reference, input, target, t.chunks);
  const auto expected = testing::gradients(reference);
  for (auto kind : kSingleStageScheduleKinds) {
    for (auto mode : kAllCheckpointModes) {
      models::Model model = models::build_model(t.spec, double_precision());
      const int devices = t.devices.empty() ? static_cast<int>(t.balance.size()) : 2;
      Pipeline pipeline(model, plan_of(t.balance, t.chunks, mode, kind, t.devices), kBatch,
                        cpu_devices(devices));
      const auto step = pipeline.step(input, target);
      const std::string what = t.spec + " " + describe_plan(pipeline.plan());
      EXPECT_NEAR(step.loss, expected_loss, 1e-10 * std::abs(expected_loss)) << what;
      expect_same(testing::gradients(model), expected, what);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, TransparencyTest,
    ::testing::Values(
        Transparency{"mlp:layers=4,width=16,classes=5", {2, 3}, 3, {}},
        Transparency{"mlp:layers=4,width=16,classes=5", {1, 1, 3}, 6, {}},
        Transparency{"mlp:layers=4,width=16,classes=5", {4, 1}, 1, {}},
        Transparency{"mlp:layers=4,width=16,classes=5", {1, 2, 2}, 4, {"cpu:0", "cpu:1", "cpu:0"}},
        Transparency{"gpt:layers=2,width=16,heads=2,seq=8,vocab=32", {2, 2}, 3, {}},
        Transparency{"resnet:blocks=2,channels=4,image=8,classes=3", {1, 2, 1}, 2, {}}));

TEST(Executor, ParametersMatchAfterOptimizerSteps) {
  const std::string spec = "mlp:layers=3,width=12,classes=4";
  models::Model reference = models::build_model(spec, double_precision());
  models::Model model = models::build_model(spec, double_precision());
  ExecutorOptions options = cpu_devices(2, OptimizerKind::Momentum);
  options.learning_rate = 0.1;
  Pipeline pipeline(model, plan_of({2, 2}, 3, CheckpointMode::ExceptLast, ScheduleKind::OneFOneB),
                    kBatch, options);
  torch::optim::SGD optimizer(reference.layers->parameters(),
                              torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 3; ++step) {
    auto [input, target] = reference.make_batch(kBatch, 100 + step, 0);
    input = input.to(at::kDouble);
    testing::reference_step(reference, input, target, 3);
    optimizer.step();
    pipeline.step(input, target);
  }
  expect_same(testing::parameters(model), testing::parameters(reference), "after 3 steps");
}

TEST(Executor, DropoutRecomputesIdentically) {
  // Checkpointed stages recompute with the forward's seed: the same masks, the same gradients.
  const std::string spec = "mlp:layers=4,width=16,classes=5,dropout=0.5";
  auto run = [&](CheckpointMode mode) {
    models::Model model = models::build_model(spec, double_precision());
    auto [input, target] = batch_for(model);
    Pipeline pipeline(model, plan_of({2, 3}, 3, mode, ScheduleKind::GPipe), kBatch, cpu_devices(2));
    const double loss = pipeline.step(input, target).loss;
    return std::make_pair(loss, testing::gradients(model));
  };
  const auto [loss_always, grads_always] = run(CheckpointMode::Always);
  const auto [loss_never, grads_never] = run(CheckpointMode::Never);
  EXPECT_DOUBLE_EQ(loss_always, loss_never);
  expect_same(grads_always, grads_never, "always vs never");
  // And dropout is really on: without it the loss differs.
  models::Model plain = models::build_model("mlp:layers=4,width=16,classes=5", double_precision());
  auto [input, target] = batch_for(plain);
  EXPECT_NE(testing::reference_step(plain, input, target, 3), loss_never);
}

TEST(Executor, DeferredBatchNormKeepsFullBatchRunningStatistics) {
  // The stem's batch norm sees conv(x), which does not depend on how the batch is split: its
  // running statistics after a pipelined step equal a full-batch BatchNorm2d's after one pass.
  const std::string spec = "resnet:blocks=1,channels=4,image=8,classes=3";
  models::Model model = models::build_model(spec, double_precision(/*deferred=*/true));
  models::Model full = models::build_model(spec, double_precision(/*deferred=*/false));
  auto [input, target] = batch_for(model);
  Pipeline pipeline(model, plan_of({1, 2}, 3, CheckpointMode::Always, ScheduleKind::GPipe), kBatch,
                    cpu_devices(2));
  pipeline.step(input, target);
  full.layers->forward(input);  // training mode: one update from the whole batch
  auto running = [](models::Model& m, const std::string& name) {
    for (const auto& b : m.layers->named_buffers()) {
      if (b.key() == name) return b.value().detach().cpu().clone();
    }
    return at::Tensor();
  };
  for (const char* name : {"stem.bn.running_mean", "stem.bn.running_var"}) {
    const at::Tensor expected = running(full, name), actual = running(model, name);
    ASSERT_TRUE(expected.defined() && actual.defined()) << name;
    EXPECT_TRUE(at::allclose(actual, expected, 1e-9, 1e-12)) << name << "\n"
                                                             << actual << "\n"
                                                             << expected;
  }
  // A plain BatchNorm2d updated once per micro-batch would not match (3 updates, not 1).
  models::Model eager = models::build_model(spec, double_precision(false));
  Pipeline eager_pipeline(eager, plan_of({1, 2}, 3, CheckpointMode::Never, ScheduleKind::GPipe),
                          kBatch, cpu_devices(2));
  eager_pipeline.step(input, target);
  EXPECT_FALSE(at::allclose(running(eager, "stem.bn.running_mean"),
                            running(full, "stem.bn.running_mean"), 1e-9, 1e-12));
}

TEST(Executor, MeasuredOrderIsTheSchedules) {
  for (auto kind : kSingleStageScheduleKinds) {
    models::Model model = models::build_model("mlp:layers=5,width=8", double_precision());
    auto [input, target] = batch_for(model);
    const Plan plan =
        plan_of({2, 1, 3}, 4, CheckpointMode::ExceptLast, kind, {"cpu:0", "cpu:1", "cpu:0"});
    Pipeline pipeline(model, plan, kBatch, cpu_devices(2));
    const auto step = pipeline.step(input, target);
    const int micro_batches =
        static_cast<int>(pipeline.micro_batch_sizes().size());  // 6 in 4 chunks: 3
    ASSERT_EQ(micro_batches, 3);
    const Schedule schedule = make_schedule(kind, 3, micro_batches, CheckpointMode::ExceptLast);
    const auto programs = device_programs(schedule, pipeline.stage_device(), 2);
    for (int d = 0; d < 2; ++d) {
      std::vector<TraceTask> mine;
      for (const auto& t : step.tasks) {
        if (t.device == d && is_compute(t.kind)) mine.push_back(t);
      }
      std::stable_sort(mine.begin(), mine.end(), [](const TraceTask& a, const TraceTask& b) {
        return a.start_ms < b.start_ms;
      });
      std::vector<std::string> ran, expected;
      for (const auto& t : mine) ran.push_back(t.label());
      for (const auto& a : programs[d]) expected.push_back(to_string(a));
      EXPECT_EQ(ran, expected) << to_string(kind) << " device " << d;
      for (std::size_t k = 1; k < mine.size(); ++k)
        EXPECT_LE(mine[k - 1].end_ms, mine[k].start_ms + 1e-6);
    }
    // Copies between the two devices, one per boundary crossing and direction.
    int copies = 0;
    for (const auto& t : step.tasks) copies += is_compute(t.kind) ? 0 : 1;
    EXPECT_EQ(copies, 2 * 2 * micro_batches);
    EXPECT_GT(step.peak_memory_bytes[0], 0);
  }
}

// --- schedules of several stages per device, I and W -----------------------------------------

Plan two_devices_plan(ScheduleKind kind, CheckpointMode mode, int chunks) {
  const bool multi = is_multi_stage(kind);
  Plan plan =
      plan_of(multi ? std::vector<int>{2, 1, 2, 1} : std::vector<int>{3, 3}, chunks, mode, kind);
  plan.stages_per_device = multi ? 2 : 1;
  return plan;
}

// Training step `step` (the reference's batch 100 + step, of 8 samples in `chunks`
// micro-batches) of the pipeline and of the unpipelined reference, whose `optimizer` steps it:
// the same loss. Returns the pipeline's record.
exec::StepRecord step_beside_reference(Pipeline& pipeline, models::Model& reference,
                                       torch::optim::Optimizer& optimizer, int step, int chunks,
                                       const std::string& what) {
  auto [input, target] = reference.make_batch(8, 100 + step, 0);
  input = input.to(at::kDouble);
  const double expected_loss = testing::reference_step(reference, input, target, chunks);
  optimizer.step();
  exec::StepRecord record = pipeline.step(input, target);
  EXPECT_NEAR(record.loss, expected_loss, 1e-10 * std::abs(expected_loss)) << what;
  return record;
}

// Every schedule the simulator knows, on two CPU devices (two stages each where the schedule
// holds several), trains three steps to the losses and parameters of the same model trained
// unpipelined; each stage runs on its programme's device, and each action once.
TEST(Executor, EveryScheduleTrainsAsTheUnpipelinedModel) {
  const std::string spec = "mlp:layers=5,width=12,classes=4";  // 6 layers
  constexpr int kChunks = 4;
  constexpr std::int64_t kEight = 8;
  for (auto kind : kAllScheduleKinds) {
    for (auto mode : {CheckpointMode::Never, CheckpointMode::Always}) {
      models::Model reference = models::build_model(spec, double_precision());
      models::Model model = models::build_model(spec, double_precision());
      ExecutorOptions options = cpu_devices(2, OptimizerKind::Momentum);
      options.learning_rate = 0.1;
      const Plan plan = two_devices_plan(kind, mode, kChunks);
      Pipeline pipeline(model, plan, kEight, options);
      const std::string what = describe_plan(plan);
      ASSERT_EQ(pipeline.device_names().size(), 2u) << what;
      for (int s = 0; s < plan.stages(); ++s) {
        EXPECT_EQ(pipeline.stage_device()[s],
                  stage_rank(kind, s, plan.stages(), plan.stages_per_device))
            << what;
      }
      torch::optim::SGD optimizer(reference.layers->parameters(),
                                  torch::optim::SGDOptions(0.1).momentum(0.9));
      for (int step = 0; step < 3; ++step) {
        const auto record = step_beside_reference(pipeline, reference, optimizer, step, kChunks,
                                                  what + " step " + std::to_string(step));
        std::map<TaskKind, int> ran;
        for (const auto& t : record.tasks) ++ran[t.kind];
        // Every (stage, micro-batch) once forward and once backward, whole or split as the
        // schedule says (DualPipeV splits some and not others).
        const int actions = plan.stages() * kChunks;
        std::map<ActionKind, int> planned;
        for (const auto& programme :
             make_schedule(kind, plan.stages(), kChunks, mode, plan.stages_per_device).per_rank) {
          for (const Action& a : programme) ++planned[a.kind];
        }
        EXPECT_EQ(ran[TaskKind::Forward], actions) << what;
        EXPECT_EQ(ran[TaskKind::Backward] + ran[TaskKind::InputGrad], actions) << what;
        EXPECT_EQ(ran[TaskKind::Backward], planned[ActionKind::Backward]) << what;
        EXPECT_EQ(ran[TaskKind::InputGrad], planned[ActionKind::InputGrad]) << what;
        EXPECT_EQ(ran[TaskKind::WeightGrad], ran[TaskKind::InputGrad]) << what;
        if (!splits_backward(kind)) {
          EXPECT_EQ(ran[TaskKind::InputGrad], 0) << what;
        }
        EXPECT_EQ(ran[TaskKind::Recompute], mode == CheckpointMode::Always ? actions : 0) << what;
      }
      expect_same(testing::parameters(model), testing::parameters(reference),
                  what + " after 3 steps");
    }
  }
}

// Transfer learning's frozen stem: the first three layers' parameters frozen. One device's
// autograd records nothing there (their input is data), so no stage asks a gradient of its
// input up to the first layer that trains, and the gradients "sent" into the frozen stages are
// empty: every schedule trains the unpipelined model's losses and parameters, the frozen ones
// untouched, and no gradient copy into the stem carries a byte.
TEST(Executor, AFrozenStemTrainsAsTheUnpipelinedModelAndSendsItNoGradient) {
  const std::string spec = "mlp:layers=5,width=12,classes=4";  // 6 layers
  constexpr int kChunks = 4, kFrozen = 3;
  constexpr std::int64_t kEight = 8;
  auto freeze_stem = [](models::Model& m) {
    for (int l = 0; l < kFrozen; ++l) {
      for (auto& p : (*m.layers)[static_cast<std::size_t>(l)]->parameters())
        p.set_requires_grad(false);
    }
  };
  for (auto kind : kAllScheduleKinds) {
    for (auto mode : {CheckpointMode::Never, CheckpointMode::Always}) {
      models::Model reference = models::build_model(spec, double_precision());
      models::Model model = models::build_model(spec, double_precision());
      freeze_stem(reference);
      freeze_stem(model);
      const auto before = testing::parameters(model);
      ExecutorOptions options = cpu_devices(2, OptimizerKind::Momentum);
      options.learning_rate = 0.1;
      // Stage 0 (and, with two stages a device, stage 1) lies wholly in the stem.
      const Plan plan = two_devices_plan(kind, mode, kChunks);
      const int frozen_stages = is_multi_stage(kind) ? 2 : 1;
      Pipeline pipeline(model, plan, kEight, options);
      const std::string what = describe_plan(plan);
      std::vector<at::Tensor> trained;
      for (auto& p : reference.layers->parameters()) {
        if (p.requires_grad()) trained.push_back(p);
      }
      torch::optim::SGD optimizer(trained, torch::optim::SGDOptions(0.1).momentum(0.9));
      for (int step = 0; step < 3; ++step) {
        const auto record = step_beside_reference(pipeline, reference, optimizer, step, kChunks,
                                                  what + " step " + std::to_string(step));
        int into_stem = 0;
        for (const auto& t : record.tasks) {
          // A gradient copy is named by the stage that sends it.
          if (t.kind != TaskKind::SendGradient || t.stage > frozen_stages) continue;
          ++into_stem;
          EXPECT_EQ(t.bytes, 0) << what << ": the gradient into stage " << t.stage - 1;
        }
        if (kind == ScheduleKind::GPipe) EXPECT_EQ(into_stem, kChunks) << what;
      }
      const auto after = testing::parameters(model);
      expect_same(after, testing::parameters(reference), what + " after 3 steps");
      int frozen = 0;
      for (const auto& p : model.layers->named_parameters()) {
        if (p.value().requires_grad()) continue;
        ++frozen;
        EXPECT_TRUE(at::equal(before.at(p.key()), after.at(p.key())))
            << what << ": frozen " << p.key();
      }
      EXPECT_GT(frozen, 0) << what;
    }
  }
}

// A zero-bubble step's measured trace holds each stage's I and W of every micro-batch exactly
// once, W after its I on the same device; copies only where neighbouring stages are on two
// devices (ZBV's V keeps stages 1 and 2 on one device: the tensor is handed over).
TEST(Executor, ZeroBubbleTracesHoldEveryIAndWOnceWAfterItsI) {
  constexpr int kChunks = 4;
  for (auto kind : {ScheduleKind::InterleavedZB, ScheduleKind::ZBV}) {
    models::Model model =
        models::build_model("mlp:layers=5,width=12,classes=4", double_precision());
    auto [input, target] = batch_for(model, 8);
    const Plan plan = two_devices_plan(kind, CheckpointMode::ExceptLast, kChunks);
    Pipeline pipeline(model, plan, 8, cpu_devices(2));
    const Trace trace = exec::measured_trace(pipeline, pipeline.step(input, target), model.name);
    std::map<std::pair<int, int>, std::vector<TraceTask>> inputs, weights;
    int activation_copies = 0, gradient_copies = 0;
    for (const auto& t : trace.tasks) {
      if (t.kind == TaskKind::InputGrad) inputs[{t.stage, t.micro_batch}].push_back(t);
      if (t.kind == TaskKind::WeightGrad) weights[{t.stage, t.micro_batch}].push_back(t);
      activation_copies += t.kind == TaskKind::SendActivation ? 1 : 0;
      gradient_copies += t.kind == TaskKind::SendGradient ? 1 : 0;
      EXPECT_NE(t.kind, TaskKind::Backward) << to_string(kind);
    }
    for (int s = 0; s < plan.stages(); ++s) {
      for (int i = 0; i < kChunks; ++i) {
        const std::string what = fmt::format("{} stage {} micro-batch {}", to_string(kind), s, i);
        const std::pair<int, int> key{s, i};
        ASSERT_EQ(inputs[key].size(), 1u) << what;
        ASSERT_EQ(weights[key].size(), 1u) << what;
        const TraceTask& in = inputs[key][0];
        const TraceTask& w = weights[key][0];
        EXPECT_EQ(in.device, stage_rank(kind, s, plan.stages(), 2)) << what;
        EXPECT_EQ(w.device, in.device) << what;
        EXPECT_GE(w.start_ms, in.end_ms - 1e-9) << what;
      }
    }
    int crossings = 0;
    for (int s = 0; s + 1 < plan.stages(); ++s) {
      crossings += pipeline.stage_device()[s] != pipeline.stage_device()[s + 1] ? 1 : 0;
    }
    EXPECT_EQ(crossings, kind == ScheduleKind::ZBV ? 2 : 3);
    EXPECT_EQ(activation_copies, crossings * kChunks) << to_string(kind);
    EXPECT_EQ(gradient_copies, crossings * kChunks) << to_string(kind);
  }
}

// --- failures ---------------------------------------------------------------------------------

// The executor's own threads (named "pt-..."): LibTorch and CUDA start threads of their own
// on first use (the autograd engine's device threads on a machine with a GPU), which are not
// the executor's to stop.
int thread_count() {
  int n = 0;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (auto* entry = readdir(dir)) {
      if (entry->d_name[0] == '.') continue;
      std::ifstream comm(std::string("/proc/self/task/") + entry->d_name + "/comm");
      std::string name;
      std::getline(comm, name);
      n += name.rfind("pt-", 0) == 0 ? 1 : 0;
    }
    closedir(dir);
  }
  return n;
}

// A joined thread can linger in /proc for a moment after pthread_join returns (the kernel
// clears its tid before it leaves the thread group), so counts are read once they settle.
int settled_thread_count(int expected = -1) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  int last = thread_count();
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const int now = thread_count();
    if (now == last && (expected < 0 || now == expected)) return now;
    last = now;
  }
  return last;
}

enum class FailIn { Forward, Backward, Recompute };

// Passes its input through, and fails on micro-batch number `when` (counting forwards) in the
// chosen phase.
class FailingLayerImpl : public torch::nn::Module {
 public:
  FailingLayerImpl(FailIn where, int when) : where_(where), when_(when) {}
  at::Tensor forward(const at::Tensor& x) {
    const bool recomputing = models::ScopedRecompute::active();
    if (where_ == FailIn::Recompute && recomputing) throw std::runtime_error("boom in recompute");
    const int call = recomputing ? -1 : calls_++;
    if (where_ == FailIn::Forward && call == when_) throw std::runtime_error("boom in forward");
    if (where_ == FailIn::Backward && call == when_ && x.requires_grad()) {
      at::Tensor y = x * 1.0;
      y.register_hook(
          [](const at::Tensor&) -> at::Tensor { throw std::runtime_error("boom in backward"); });
      return y;
    }
    return x;
  }

 private:
  FailIn where_;
  int when_;
  int calls_ = 0;
};
TORCH_MODULE(FailingLayer);

// A layer to put into a model: its name, and the index of the model's layer it goes before.
struct Inserted {
  std::size_t before;
  std::string name;
  torch::nn::AnyModule layer;
};

// `model`'s layers (the same modules), its loss and batches, with `inserted` put in.
models::Model with_layers(models::Model& model, const std::string& name,
                          const std::vector<Inserted>& inserted) {
  models::Model out;
  out.name = name;
  out.loss = model.loss;
  out.make_batch = model.make_batch;
  auto it = model.layers->begin();
  for (std::size_t k = 0; k < model.layer_names.size(); ++k, ++it) {
    for (const Inserted& extra : inserted) {
      if (extra.before != k) continue;
      out.layer_names.push_back(extra.name);
      out.layers->push_back(extra.name, extra.layer);
    }
    out.layer_names.push_back(model.layer_names[k]);
    out.layers->push_back(std::string(model.layer_names[k]), *it);
  }
  return out;
}

TEST(Executor, AFailingStageReachesTheCallerNamingStageAndMicroBatch) {
  struct Case {
    FailIn where;
    CheckpointMode mode;
    const char* message;
  };
  for (const Case& c : {Case{FailIn::Forward, CheckpointMode::Never, "boom in forward"},
                        Case{FailIn::Backward, CheckpointMode::Never, "boom in backward"},
                        Case{FailIn::Recompute, CheckpointMode::Always, "boom in recompute"}}) {
    const int threads_before = settled_thread_count();
    {
      models::Model model = models::build_model("mlp:layers=3,width=8", double_precision());
      // Insert the failing layer as stage 1's first layer.
      models::Model broken = with_layers(
          model, "broken", {{2, "fail", torch::nn::AnyModule(FailingLayer(c.where, 2))}});
      auto [input, target] = batch_for(model);
      Pipeline pipeline(broken, plan_of({2, 3}, 3, c.mode, ScheduleKind::GPipe), kBatch,
                        cpu_devices(2));
      // Two compute workers and two copy channels, each named (else this test could not fail).
      EXPECT_EQ(settled_thread_count(threads_before + 4), threads_before + 4);
      const auto started = std::chrono::steady_clock::now();
      try {
        pipeline.step(input, target);
        ADD_FAILURE() << "no error for " << c.message;
      } catch (const exec::ExecutorError& e) {
        EXPECT_EQ(e.stage, 1) << e.what();
        EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr(c.message));
        EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("stage 1, micro-batch"));
      }
      EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(1)) << c.message;
      EXPECT_THROW(pipeline.step(input, target), std::logic_error);  // it does not run again
    }
    EXPECT_EQ(settled_thread_count(threads_before), threads_before)
        << "threads left behind after " << c.message;
  }
}

// Passes its input through after `ms` of forward: asleep (no CPU time) or spinning on the
// thread's own CPU clock (`ms` of it, whatever the machine's load).
class PacedLayerImpl : public torch::nn::Module {
 public:
  PacedLayerImpl(bool asleep, double ms) : asleep_(asleep), ms_(ms) {}
  at::Tensor forward(const at::Tensor& x) {
    if (models::ScopedRecompute::active()) return x;
    if (asleep_) {
      std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int>(ms_ * 1e3)));
    } else {
      const double start = cpu_ms();
      while (cpu_ms() - start < ms_) {
      }
    }
    return x;
  }

 private:
  static double cpu_ms() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
  }
  bool asleep_;
  double ms_;
};
TORCH_MODULE(PacedLayer);

// A CPU device's compute tasks carry the CPU time their thread ran in them: a forward that
// sleeps 15 ms has almost none of it, one that spins 15 ms all of it, and the step replayed at
// those times leaves the sleeps out. With two intra-op threads a device's worker no longer does
// all of its work, and no task carries one.
TEST(Executor, ComputeTasksCarryTheirThreadsCpuTime) {
  constexpr double kPace = 15.0;
  models::Model model = models::build_model("mlp:layers=3,width=8", double_precision());
  // Stage 0 ([sleep, 2 layers]) sleeps, stage 1 ([spin, 2 layers]) spins.
  models::Model paced = with_layers(model, "paced",
                                    {{0, "sleep", torch::nn::AnyModule(PacedLayer(true, kPace))},
                                     {2, "spin", torch::nn::AnyModule(PacedLayer(false, kPace))}});
  auto [input, target] = batch_for(model);
  const Plan plan = plan_of({3, 3}, 2, CheckpointMode::Never, ScheduleKind::GPipe);
  {
    Pipeline pipeline(paced, plan, kBatch, cpu_devices(2));
    const exec::StepRecord step = pipeline.step(input, target);
    int forwards = 0;
    for (const TraceTask& t : step.tasks) {
      if (!is_compute(t.kind)) {
        EXPECT_EQ(t.cpu_ms, -1.0) << t.label();
        continue;
      }
      EXPECT_GE(t.cpu_ms, 0.0) << t.label();
      EXPECT_LE(t.cpu_ms, t.duration_ms() + 0.05) << t.label();
      if (t.kind != TaskKind::Forward) continue;
      ++forwards;
      if (t.stage == 0) {
        EXPECT_GE(t.duration_ms(), kPace) << t.label();
        EXPECT_LT(t.cpu_ms, t.duration_ms() - 0.6 * kPace) << t.label();
      } else {
        EXPECT_GE(t.cpu_ms, kPace) << t.label();
      }
    }
    EXPECT_EQ(forwards, 4);
    const Trace trace = exec::measured_trace(pipeline, step, paced.name);
    const double on_cpu = replay_on_cpu_ms(trace, "measured");
    // Stage 0's first forward slept on the step's critical path (its second, beside stage 1's
    // first spin, need not have).
    EXPECT_LT(on_cpu, step.pipeline_ms - 0.6 * kPace);
    EXPECT_GE(on_cpu, 2 * kPace);  // stage 1's spins stay
    EXPECT_GT(cpu_share(step.tasks), 0.0);
    EXPECT_LT(cpu_share(step.tasks), 0.8);
  }
  ExecutorOptions two_threads = cpu_devices(2);
  two_threads.threads_per_cpu_device = 2;
  Pipeline pipeline(paced, plan, kBatch, two_threads);
  const exec::StepRecord step = pipeline.step(input, target);
  for (const TraceTask& t : step.tasks) EXPECT_EQ(t.cpu_ms, -1.0) << t.label();
  EXPECT_EQ(cpu_share(step.tasks), -1.0);
}

// Rank 0 of two whose every send is refused at once, as gloo refuses one to a peer that died;
// its receives wait until cancelled, as a dead peer's never come.
class RefusingTransport final : public exec::Transport {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  double timeout_s() const override { return 10.0; }
  double clock_ms() const override { return 0.0; }
  double clock_offset_ms() const override { return 0.0; }
  double clock_round_trip_ms() const override { return 0.0; }
  void send(const at::Tensor&, int, int, double) override {
    throw std::runtime_error("Connection closed by peer");
  }
  exec::Received recv(int, int) override {
    std::unique_lock<std::mutex> lock(mutex_);
    woken_.wait(lock, [&] { return cancelled_; });
    throw WorkError("cancelled");
  }
  void cancel_receives() override {
    std::lock_guard<std::mutex> lock(mutex_);
    cancelled_ = true;
    woken_.notify_all();
  }
  void flush_sends() override {}
  void barrier(const std::string&) override {}
  void leave_after_failure() override {}
  std::vector<std::string> gather(const std::string&, const std::string& blob) override {
    return {blob};
  }

 private:
  std::mutex mutex_;
  std::condition_variable woken_;
  bool cancelled_ = false;
};

// A send that fails names the step, the peer and what was being sent: a dead rank is often
// noticed by a send first (on 16 cores it was, where a receive had always been first on 2).
TEST(Executor, ARefusedSendNamesTheStepAndThePeer) {
  models::Model model = models::build_model("mlp:layers=3,width=8", double_precision());
  auto [input, target] = batch_for(model);
  ExecutorOptions options = cpu_devices(2);
  options.transport = std::make_shared<RefusingTransport>();
  Pipeline pipeline(model, plan_of({2, 2}, 2, CheckpointMode::Never, ScheduleKind::GPipe), kBatch,
                    options);
  const auto started = std::chrono::steady_clock::now();
  try {
    pipeline.step(input, target);
    ADD_FAILURE() << "no error";
  } catch (const WorkError& e) {
    EXPECT_THAT(std::string(e.what()),
                ::testing::HasSubstr("step 1: sending the activation of stage 1 to rank 1: "
                                     "Connection closed by peer"));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
}

TEST(Executor, AnOutOfMemoryMidStepReachesTheCallerAndNothingHangs) {
  // A CPU device given less memory than a step needs fails as a full GPU does: the allocator
  // throws mid-step, in a stage's compute or in the copy that feeds it.
  struct Capacity {  // removed again whatever happens
    int device;
    ~Capacity() { CountingAllocator::install().set_capacity(device, 0); }
  };
  models::Model model = models::build_model("mlp:layers=3,width=64", double_precision());
  auto [input, target] = batch_for(model);
  const Plan plan = plan_of({2, 2}, 3, CheckpointMode::Never, ScheduleKind::GPipe);
  std::int64_t need = 0;
  {
    Pipeline pipeline(model, plan, kBatch, cpu_devices(2));
    need = pipeline.step(input, target).peak_memory_bytes[1];
  }
  const int threads_before = settled_thread_count();
  {
    Capacity limit{1};
    Pipeline pipeline(model, plan, kBatch, cpu_devices(2));
    CountingAllocator& allocator = CountingAllocator::install();
    allocator.set_capacity(1, allocator.allocated(1) + (need - allocator.allocated(1)) / 2);
    const auto started = std::chrono::steady_clock::now();
    try {
      pipeline.step(input, target);
      ADD_FAILURE() << "no out-of-memory with half of the " << need << " bytes device 1 needs";
    } catch (const exec::ExecutorError& e) {
      EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("out of memory"));
      EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("micro-batch"));
    }
    // A hang, not a speed: the step takes milliseconds, but a loaded machine can stall it for
    // a second (seen with ctest -j2 beside a benchmark on two cores).
    EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
  }
  EXPECT_EQ(settled_thread_count(threads_before), threads_before) << "threads left behind";
  // With the memory back, the same model trains again.
  Pipeline pipeline(model, plan, kBatch, cpu_devices(2));
  EXPECT_NO_THROW(pipeline.step(input, target));
}

TEST(Executor, BadPlansAreRefusedBeforeAnyWork) {
  models::Model model = models::build_model("mlp:layers=3,width=8", double_precision());
  auto refused = [&](const Plan& plan, int devices, const std::string& message) {
    try {
      Pipeline pipeline(model, plan, kBatch, cpu_devices(devices));
      ADD_FAILURE() << "accepted: " << message;
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
  };
  refused(plan_of({2, 3}, 2, CheckpointMode::Never, ScheduleKind::GPipe), 2,
          "plan: balance: expected layer counts summing to 4 (the layers of mlp-3x8), got 5");
  refused(
      plan_of({1, 1, 2}, 2, CheckpointMode::Never, ScheduleKind::GPipe), 2,
      "plan: 3 stages but 2 devices (name the plan's devices to put several stages on one device)");
  refused(plan_of({2, 2}, 7, CheckpointMode::Never, ScheduleKind::GPipe), 2,
          "plan: chunks: expected 1 to 6 (the batch size), got 7");
  refused(plan_of({2, 2}, 2, CheckpointMode::Never, ScheduleKind::GPipe, {"cpu:0", "gpu:1"}), 2,
          "plan: devices[1]: \"gpu:1\" is not one of the devices given (cpu:0, cpu:1)");
}

// A device's memory counts from what the pipeline holds as a step starts, found by walking its
// tensors (parameters, buffers, optimizer state, micro-batches), because a GPU's allocator also
// holds what is not the plan's. On the CPU the counting allocator sees this pipeline's threads
// only, so the walk must find exactly what the allocator counts: nothing left over, every
// optimizer and several stages per device included.
TEST(Executor, HeldBytesAreWhatTheAllocatorCountsAsAStepStarts) {
  for (auto optimizer : {OptimizerKind::Sgd, OptimizerKind::Momentum, OptimizerKind::Adam}) {
    for (const Plan& plan :
         {plan_of({2, 1, 2}, 3, CheckpointMode::Never, ScheduleKind::OneFOneB),
          plan_of({1, 2, 1, 1}, 2, CheckpointMode::ExceptLast, ScheduleKind::InterleavedZB,
                  {"cpu:0", "cpu:1", "cpu:0", "cpu:1"})}) {
      models::Model model =
          models::build_model("mlp:layers=4,width=16,classes=5", double_precision());
      auto [input, target] = batch_for(model);
      ExecutorOptions options = cpu_devices(plan.devices.empty() ? 3 : 2);
      options.optimizer = optimizer;
      Pipeline pipeline(model, plan, kBatch, options);
      for (int step = 0; step < 3; ++step) {  // the optimizer's state exists from the first step on
        const exec::StepRecord record = pipeline.step(input, target);
        ASSERT_EQ(record.library_memory_bytes.size(), record.peak_memory_bytes.size());
        for (std::size_t d = 0; d < record.library_memory_bytes.size(); ++d) {
          EXPECT_EQ(record.library_memory_bytes[d], 0)
              << describe_plan(plan) << " optimizer " << static_cast<int>(optimizer) << " step "
              << step << " device " << d;
        }
      }
    }
  }
}

// On a GPU the caching allocator serves the whole process: what was there before a pipeline
// (an earlier pipeline's cuBLAS workspaces, a user's tensors) is not the plan's. Two pipelines
// in a row on one GPU see the same peak however much was left behind between them.
TEST(Executor, CudaPeakIsThePipelinesOwnWhateverElseTheGpuHolds) {
  PIPETUNE_GPU_TEST_NEEDS(torch::cuda::is_available(), "no CUDA device");
  const std::string spec = "mlp:layers=4,width=512,classes=5";
  std::vector<std::int64_t> peaks;
  std::vector<at::Tensor> left_behind;
  models::Model model = models::build_model(spec);
  std::int64_t parameter_bytes = 0;
  for (const auto& p : model.layers->parameters()) parameter_bytes += p.numel() * 4;
  for (int round = 0; round < 2; ++round) {
    // Something else on the GPU, as a user's own tensors or another library's workspace.
    left_behind.push_back(at::empty({16 << 20}, at::TensorOptions(at::kCUDA).dtype(at::kByte)));
    // The same model object for both, as validate runs its plans: the first pipeline leaves its
    // parameters on the GPU, and the second must still count them as its own.
    auto [input, target] = model.make_batch(kBatch, 0, 0);
    ExecutorOptions options;
    options.devices = {"cuda:0"};
    Pipeline pipeline(
        model, plan_of({3, 2}, 2, CheckpointMode::Never, ScheduleKind::GPipe, {"cuda:0", "cuda:0"}),
        kBatch, options);
    std::int64_t peak = 0;
    for (int step = 0; step < 3; ++step) {
      const exec::StepRecord record = pipeline.step(input, target);
      EXPECT_GE(record.library_memory_bytes[0], 0);
      EXPECT_GE(record.peak_memory_bytes[0], parameter_bytes);
      if (step > 0) peak = std::max(peak, record.peak_memory_bytes[0]);
    }
    peaks.push_back(peak);
  }
  EXPECT_NEAR(static_cast<double>(peaks[1]), static_cast<double>(peaks[0]),
              0.01 * static_cast<double>(peaks[0]));
}

// What `run`'s fit check takes as a GPU's room (exec::cuda_free_bytes()): less a tensor this
// process keeps, and the same again once the tensor is gone (the caching allocator's kept blocks
// handed back). Without CUDA it is 0, which the check reads as unknown.
TEST(Executor, CudaFreeBytesFollowWhatThisProcessHolds) {
  if (!exec::cuda_built() || exec::cuda_device_count() == 0) {
    EXPECT_EQ(exec::cuda_free_bytes(0), 0);
  }
  PIPETUNE_GPU_TEST_NEEDS(torch::cuda::is_available(), "no CUDA device");
  const std::int64_t before = exec::cuda_free_bytes(0);
  EXPECT_GT(before, 0);
  EXPECT_EQ(exec::cuda_free_bytes(exec::cuda_device_count()), 0);  // no such device
  constexpr std::int64_t kHeld = 1LL << 30;
  {
    const at::Tensor held = at::empty({kHeld}, at::TensorOptions(at::kCUDA).dtype(at::kByte));
    EXPECT_LE(exec::cuda_free_bytes(0), before - kHeld);
  }
  EXPECT_NEAR(static_cast<double>(exec::cuda_free_bytes(0)), static_cast<double>(before),
              64.0 * (1 << 20));
}

TEST(Executor, CudaDevicesTheSameWay) {
  PIPETUNE_GPU_TEST_NEEDS(torch::cuda::is_available(), "no CUDA device");
  const std::string spec = "mlp:layers=4,width=16,classes=5";
  models::Model reference = models::build_model(spec, double_precision());
  auto [input, target] = batch_for(reference);
  const double expected_loss = testing::reference_step(reference, input, target, 3);
  const auto expected = testing::gradients(reference);
  for (auto kind : kSingleStageScheduleKinds) {
    for (auto mode : kAllCheckpointModes) {
      models::Model model = models::build_model(spec, double_precision());
      ExecutorOptions options;
      options.devices = {"cuda:0"};
      options.optimizer = OptimizerKind::None;
      Pipeline pipeline(model, plan_of({2, 1, 2}, 3, mode, kind, {"cuda:0", "cuda:0", "cuda:0"}),
                        kBatch, options);
      const auto step = pipeline.step(input, target);
      EXPECT_NEAR(step.loss, expected_loss, 1e-10 * std::abs(expected_loss));
      expect_same(testing::gradients(model), expected, "cuda " + describe_plan(pipeline.plan()));
      EXPECT_GT(step.peak_memory_bytes[0], 0);
    }
  }
}

// Doubles its input; on a GPU only after the device has spun for about 50 ms, so that a stage
// after it that does not wait for its output reads memory not yet written.
struct LateDoublingImpl : torch::nn::Module {
  at::Tensor forward(const at::Tensor& x) {
#if PIPETUNE_WITH_CUDA
    if (x.is_cuda()) at::cuda::sleep(100'000'000);
#endif
    return x * 2.0;
  }
};
TORCH_MODULE(LateDoubling);

// An MLP with a LateDoubling after its first layer.
models::Model with_late_doubling(const std::string& spec) {
  models::Model m = models::build_model(spec, double_precision());
  torch::nn::Sequential layers;
  std::vector<std::string> names;
  std::size_t k = 0;
  for (auto it = m.layers->begin(); it != m.layers->end(); ++it, ++k) {
    layers->push_back(m.layer_names[k], *it);
    names.push_back(m.layer_names[k]);
    if (k == 0) {
      layers->push_back("late", LateDoubling());
      names.push_back("late");
    }
  }
  m.layers = layers;
  m.layer_names = names;
  return m;
}

// SM partitions: the stages on devices cuda:0 and cuda:1, two shares of one GPU's SMs, compute
// what one device does, though the first stage's output comes late; every device's memory is
// the whole GPU's.
TEST(Executor, CudaSmPartitionsTheSameWay) {
  PIPETUNE_GPU_TEST_NEEDS(torch::cuda::is_available(), "no CUDA device");
  const std::string spec = "mlp:layers=4,width=16,classes=5";
  models::Model reference = with_late_doubling(spec);
  auto [input, target] = batch_for(reference);
  const double expected_loss = testing::reference_step(reference, input, target, 3);
  const auto expected = testing::gradients(reference);
  for (auto kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
    models::Model model = with_late_doubling(spec);
    ExecutorOptions options;
    options.devices = {"cuda:0", "cuda:1"};
    options.sm_partitions = 2;
    options.optimizer = OptimizerKind::None;
    Pipeline pipeline(model, plan_of({2, 4}, 3, CheckpointMode::ExceptLast, kind), kBatch, options);
    const auto step = pipeline.step(input, target);
    EXPECT_NEAR(step.loss, expected_loss, 1e-10 * std::abs(expected_loss));
    expect_same(testing::gradients(model), expected, "shares " + describe_plan(pipeline.plan()));
    ASSERT_EQ(step.peak_memory_bytes.size(), 2u);
    EXPECT_GT(step.peak_memory_bytes[0], 0);
    EXPECT_EQ(step.peak_memory_bytes[0], step.peak_memory_bytes[1]);
  }
}

// The CPU twin's refusal: SM partitions are of a GPU.
TEST(Executor, SmPartitionsOfCpuDevicesAreRefused) {
  models::Model model = models::build_model("mlp:layers=4,width=16,classes=5", double_precision());
  ExecutorOptions options;
  options.devices = {"cpu:0", "cpu:1"};
  options.sm_partitions = 2;
  try {
    Pipeline pipeline(model, plan_of({2, 3}, 2, CheckpointMode::Never, ScheduleKind::GPipe), kBatch,
                      options);
    FAIL() << "SM partitions of CPU devices were accepted";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "device: SM partitions need CUDA devices");
  }
}

}  // namespace
}  // namespace pipetune
