// Peak memory per device against timelines worked out by hand (docs/memory-model.md).
//
// The two-layer model used throughout, bytes per sample:
//   layer 0: output 100, saved 50, parameters 1000 bytes
//   layer 1: output  10, saved 20, parameters  500 bytes
//   model input 10; forward 1 ms and backward 2 ms per layer and micro-batch.
// The last layer's output is the model's: it dies once the loss exists, as in the executor.

#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <random>

#include "sim/memory_model.hpp"
#include "sim/simulator.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

using testing::make_plan;

Profile two_layers(std::int64_t batch) {
  testing::LayerSpec a{1.0, 2.0, 1000, 100, 50, 0};
  testing::LayerSpec b{1.0, 2.0, 500, 10, 20, 0};
  return testing::make_profile({a, b}, batch, 10);
}

Profile one_layer(std::int64_t batch) {
  testing::LayerSpec a{1.0, 2.0, 1000, 100, 50, 0};
  return testing::make_profile({a}, batch, 10);
}

std::vector<std::int64_t> peaks(const Profile& profile, const Plan& plan, int devices) {
  const Hardware hw = replicate_device(profile.device, devices);
  check_plan(plan, profile, hw, "test");
  std::vector<std::int64_t> out;
  for (const auto& d : Simulator(profile, hw).run(plan).devices) out.push_back(d.peak_memory_bytes);
  return out;
}

// Three layers, the first and the last holding one tensor of 1000 bytes (the first 500 bytes
// more of its own); `tied` false: the same bytes as two tensors.
Profile tied_layers(bool tied) {
  testing::LayerSpec embed{1.0, 2.0, 1500, 100, 50, 0};
  testing::LayerSpec mid{1.0, 2.0, 0, 100, 50, 0};
  testing::LayerSpec head{1.0, 2.0, 1000, 10, 20, 0};
  Profile p = testing::make_profile({embed, mid, head}, 4, 10);
  if (tied) p.tied.push_back({"0.weight", {0, 2}, 1000});
  return p;
}

TEST(Memory, ATiedTensorSplitOverDevicesIsACopyOnEach) {
  // Split, each device holds the tensor, its gradient and its optimizer state: the two-tensor
  // model's memory, on every device, for every schedule family.
  for (const auto schedule : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
    Plan plan = make_plan({1, 2}, 2, CheckpointMode::Never, schedule);
    plan.optimizer_state_factor = 2.0;
    EXPECT_EQ(peaks(tied_layers(true), plan, 2), peaks(tied_layers(false), plan, 2));
  }
}

TEST(Memory, ATiedTensorOnOneStageIsHeldOnce) {
  // On one stage the tensor, its gradient (made by the head's backward, which runs first) and
  // its optimizer state are there once: the model whose first layer holds only its own 500.
  Profile once = tied_layers(false);
  once.layers[0].param_bytes = 500;
  for (const auto checkpoint : {CheckpointMode::Never, CheckpointMode::Always}) {
    Plan plan = make_plan({3}, 2, checkpoint);
    plan.optimizer_state_factor = 2.0;
    EXPECT_EQ(peaks(tied_layers(true), plan, 1), peaks(once, plan, 1));
    EXPECT_LT(peaks(tied_layers(true), plan, 1)[0], peaks(tied_layers(false), plan, 1)[0]);
  }
}

TEST(Memory, OneStageNoCheckpoint) {
  // Baseline: parameters 1000 + the batch's input 2 x 10 = 1020.
  // F0 +150 (saved 50, output 100), the output dies with the loss -> 1070; F1 likewise -> 1120.
  // B1, the first backward, allocates the parameter gradients: +1000 -> 2120. It frees saved 50
  // -> 2070. B0 computes its parameter gradients afresh and adds them into .grad: +1000 for a
  // moment -> 3070 (peak); then it frees 50 -> 2020 = parameters + gradients + input.
  EXPECT_EQ(peaks(one_layer(2), make_plan({1}, 2, CheckpointMode::Never), 1),
            (std::vector<std::int64_t>{3070}));
}

TEST(Memory, OneStageCheckpointAlways) {
  // F0, F1 under no_grad: +100 output, dropped with the loss at once -> 1020. R1 +150, the
  // output dropped -> 1070, B1 +1000 -> 2070, frees 50 -> 2020; R0 -> 2070 again; B0
  // accumulates: +1000 -> 3070 (peak), then 2020.
  EXPECT_EQ(peaks(one_layer(2), make_plan({1}, 2, CheckpointMode::Always), 1),
            (std::vector<std::int64_t>{3070}));
}

TEST(Memory, OneStageCheckpointExceptLast) {
  // F0 checkpointed (nothing kept), F1 keeps 50 -> 1070, B1 +1000 -> 2070, then R0/B0 as above.
  EXPECT_EQ(peaks(one_layer(2), make_plan({1}, 2, CheckpointMode::ExceptLast), 1),
            (std::vector<std::int64_t>{3070}));
}

TEST(Memory, BuffersAreHeldAndCopiedForEachRecompute) {
  // 300 bytes of buffers (a position table): held all along with no gradient and no optimizer
  // state, so every peak of OneStageNoCheckpoint 300 higher: 3370. Checkpointed, each
  // recompute also copies them for its length (R1 at 1170 + 600, R0 at 2170 + 600), below the
  // backward's peak: 3370 still.
  Profile tabled = one_layer(2);
  tabled.layers[0].buffer_bytes = 300;
  for (const auto checkpoint : {CheckpointMode::Never, CheckpointMode::Always}) {
    Plan plan = make_plan({1}, 2, checkpoint);
    plan.optimizer_state_factor = 2.0;  // charged to the parameters' bytes alone
    EXPECT_EQ(peaks(tabled, plan, 1)[0], peaks(one_layer(2), plan, 1)[0] + 300);
  }
  // A buffer larger than the parameters' gradients: a recompute's copy makes the peak. Always:
  // R0 (after B1, the gradients made) at 2020 + 150 (its forward) + 3000 (held) + 3000 (the
  // copy) = 8170, above B0's 3070 + 3000 = 6070, never checkpointed the peak.
  tabled.layers[0].buffer_bytes = 3000;
  EXPECT_EQ(peaks(tabled, make_plan({1}, 2, CheckpointMode::Always), 1),
            (std::vector<std::int64_t>{8170}));
  EXPECT_EQ(peaks(tabled, make_plan({1}, 2, CheckpointMode::Never), 1),
            (std::vector<std::int64_t>{6070}));
}

TEST(Memory, TwoDevicesNoCheckpoint) {
  // Device 0 (layer 0): 1020 baseline; F0 +150, F1 +150 -> 1320; the gradient of micro-batch 1
  // arrives (+100) -> 1420, B1 allocates parameter gradients +1000 -> 2420, frees 250 -> 2170;
  // micro-batch 0's gradient arrives +100 -> 2270, B0 accumulates +1000 -> 3270 (peak).
  // Device 1 (layer 1): 500 baseline; inputs received +100 each, F keeps saved 20 each (the
  // output 10 dies with the loss) -> 740; B1 allocates the input gradient 100 and parameter
  // gradients 500 -> 1340, then frees saved 20, its input 100 and the sent gradient 100 -> 1120;
  // B0: input gradient 100 and the accumulated 500 -> 1720 (peak).
  EXPECT_EQ(peaks(two_layers(2), make_plan({1, 1}, 2, CheckpointMode::Never), 2),
            (std::vector<std::int64_t>{3270, 1720}));
}

TEST(Memory, TwoDevicesCheckpointAlways) {
  // Device 0: F0 +100 output, freed once copied -> 1020; F1 likewise; R1 +150 -> 1170; the
  // gradient arrives +100 -> 1270, B1 +1000 -> 2270; B1 frees 250 -> 2020; R0 +150, gradient
  // +100 -> 2270, B0 accumulates +1000 -> 3270 (peak). Device 1: input +100, F0 +10 then drops
  // it with the loss; after both forwards 700; R1 keeps 20 -> 720; B1 +600 -> 1320, keeps the
  // 500 of gradients and micro-batch 0's input -> 1100; R0 +20, B0 +100 +500 -> 1720 (peak).
  EXPECT_EQ(peaks(two_layers(2), make_plan({1, 1}, 2, CheckpointMode::Always), 2),
            (std::vector<std::int64_t>{3270, 1720}));
}

std::vector<std::int64_t> torch_peaks(const Profile& profile, const Plan& plan, int devices) {
  Hardware hw = replicate_device(profile.device, devices);
  hw.runtime = Runtime::TorchPipelining;
  std::vector<std::int64_t> out;
  for (const auto& d : Simulator(profile, hw).run(plan).devices) out.push_back(d.peak_memory_bytes);
  return out;
}

TEST(Memory, TorchKeepsItsReceiveBuffersAndTheLastStagesOutputs) {
  // TwoDevicesNoCheckpoint on torch.distributed.pipelining. Device 0: 1020 and a buffer for
  // each micro-batch's gradient, 2 x 100, from the start -> 1220; F0, F1 +150 each -> 1520; a
  // gradient lands in its buffer (+0); B1 +1000 -> 2520 and frees 150 (saved and output; the
  // buffer stays) -> 2370; B0 +1000 -> 3370: the pipetune executor's 3270 and the buffer of
  // micro-batch 1's gradient, which the executor had freed.
  // Device 1: 500 and both inputs' buffers -> 700; each forward keeps saved 20 and its output
  // 10 (torch holds the model's outputs until the step ends) -> 760; B1 +600 -> 1360, frees
  // saved 20 -> 1340, and the gradient it sent stays: ScheduleGPipe waits for its backward
  // sends after its last backward; B0 +600 -> 1940 (the executor's 1840). After it the outputs
  // are joined, +20 on an end level of 700 + 500 + 20: under the peak.
  EXPECT_EQ(torch_peaks(two_layers(2), make_plan({1, 1}, 2, CheckpointMode::Never), 2),
            (std::vector<std::int64_t>{3470, 1940}));
  // One stage: no buffers; the outputs kept, 2 x 100 over the executor's 3070.
  EXPECT_EQ(torch_peaks(one_layer(2), make_plan({1}, 2, CheckpointMode::Never), 1),
            (std::vector<std::int64_t>{3270}));
}

TEST(Memory, TorchsOneFOneBHoldsTheGradientItSentUntilItsNextBackwardIsDone) {
  // Two devices, 1F1B over 3 micro-batches of a sample, torch's runtime. Device 1 (F0 B0 F1 B1
  // F2 B2): 500 and three input buffers -> 800; F0 keeps 30 -> 830; B0 +600 -> 1430, frees
  // saved 20 (its gradient 100 stays: Schedule1F1B's bwd_sends holds it) -> 1410; F1 -> 1440;
  // B1 +600 -> 2040, then frees 20, the transient 500 and B0's gradient -> 1420; F2 -> 1450;
  // B2 +600 -> 2050: one gradient over the executor's 1950, where GPipe's rule (every sent
  // gradient kept to the last send) would make 2150. Device 0 sends none: 1000 of parameters,
  // the batch's 3 x 10 and three gradient buffers -> 1330; F0, F1 +150 each -> 1630; B0 +1000
  // -> 2630, keeps its parameters' gradients, frees 150 -> 2480; F2 -> 2630; B1 +1000 -> 3630.
  Plan plan = make_plan({1, 1}, 3, CheckpointMode::Never);
  plan.schedule = ScheduleKind::OneFOneB;
  EXPECT_EQ(torch_peaks(two_layers(3), plan, 2), (std::vector<std::int64_t>{3630, 2050}));
}

TEST(Memory, TorchsMultiStageRuntimeHoldsEveryTensorItSentUntilTheStepEnds) {
  // The two-layer model twice ([a, b, a, b], a sample), looped BFS on two devices: device 0
  // runs stages 0 and 2, device 1 stages 1 and 3. _PipelineScheduleRuntime keeps every send's
  // work, which holds the tensor sent, until the rank's actions are done.
  // Device 0: parameters 2000, the input 10, buffers for stage 0's received gradient 100 and
  // stage 2's input 10 and gradient 100 -> 2220. F(s0), F(s2) +150 each -> 2520. B(s2) +1000
  // of parameter gradients and its input gradient 10 -> 3530, frees its saved 50; its output
  // 100 (sent) and the gradient 10 (sent) stay -> 3480. B(s0) +1000 -> 4480 (peak); the
  // executor's rule (free each when its copy or backward is done) gives 4370.
  // Device 1: parameters 1000, buffers for stage 1's input 100 and gradient 10, stage 3's input
  // 100 -> 1210. F(s1) keeps 20 and its output 10, F(s3) 20 and the model's output 10 -> 1270.
  // B(s3) +500 and its input gradient 100 -> 1870, frees 20; the gradient it sent stays ->
  // 1850. B(s1) +500 +100 -> 2450 (peak; 2350 with the executor's rule). Once done the rank
  // drops its sends (210) and joins the outputs (+10): 2230.
  testing::LayerSpec a{1.0, 2.0, 1000, 100, 50, 0};
  testing::LayerSpec b{1.0, 2.0, 500, 10, 20, 0};
  const Profile profile = testing::make_profile({a, b, a, b}, 1, 10);
  Plan plan = make_plan({1, 1, 1, 1}, 1, CheckpointMode::Never);
  plan.schedule = ScheduleKind::LoopedBFS;
  plan.stages_per_device = 2;
  EXPECT_EQ(torch_peaks(profile, plan, 2), (std::vector<std::int64_t>{4480, 2450}));
}

TEST(Memory, TorchJoinsTheOutputsOnceTheStepIsDone) {
  // A model whose output dwarfs the rest: parameters 10, input 2 x 10, outputs 1000 a sample.
  // At the end torch holds both micro-batches' outputs and their join: 30 + 10 of gradients +
  // 2 x 1000 + 2000 = 4040, above anything during the step.
  testing::LayerSpec wide{1.0, 2.0, 10, 1000, 0, 0};
  const Profile profile = testing::make_profile({wide}, 2, 10);
  for (const auto checkpoint : {CheckpointMode::Never, CheckpointMode::Always}) {
    EXPECT_EQ(torch_peaks(profile, make_plan({1}, 2, checkpoint), 1),
              (std::vector<std::int64_t>{4040}));
  }
}

TEST(Memory, SharedDeviceCountsOneBufferPerBoundary) {
  // Both stages on one device: the stage boundary is one tensor, not a sent and a received copy.
  // Baseline 1500 + 20. F(0,0) +150, F(0,1) +150, F(1,0) +20, F(1,1) +20 -> 1860; B(1,1) first:
  // input gradient 100 + parameters 500 -> 2460, frees 20 -> 2440 (keeps the input gradient,
  // which is stage 0's received gradient); B(0,1) first: +1000 -> 3440, and frees 250 -> 3190.
  // B(1,0) frees 20 and keeps its input gradient 100 -> 3270; B(0,0) accumulates +1000 -> 4270
  // (peak).
  Plan plan = make_plan({1, 1}, 2, CheckpointMode::Never);
  plan.devices = {"cpu:0", "cpu:0"};
  EXPECT_EQ(peaks(two_layers(2), plan, 1), (std::vector<std::int64_t>{4270}));
}

// The level of a memory counter's history at time t (the last sample at or before t).
std::int64_t level_at(const std::vector<CounterSample>& history, double t) {
  auto it = std::upper_bound(history.begin(), history.end(), t,
                             [](double time, const CounterSample& s) { return time < s.time; });
  return it == history.begin() ? 0 : std::prev(it)->value;
}

// Shares of one GPU (HardwareDevice::share_of) hold their tensors in one memory: each share's
// history is the GPU's, the sum of what the same stages hold as devices of their own less each
// boundary tensor that those count twice, once on each side (a stage on a share receives the
// tensor itself, as on one device): an activation that its sender keeps, from its copy until
// the receiver's backward ends; any other, while it is copied. In half of the pipelines of three
// or more stages the last device is a whole GPU of its own, whose memory is its own.
TEST(Memory, SharesOfOneGpuHoldEachTensorOnce) {
  std::mt19937 rng(1129);
  int compared = 0, lower = 0, with_whole = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int layers = 2 + static_cast<int>(rng() % 7);
    const std::int64_t batch = 1 + static_cast<std::int64_t>(rng() % 6);
    Profile profile = testing::random_profile(rng, layers, batch);
    testing::vary_memory_flags(rng, profile);
    const int stages = 2 + static_cast<int>(rng() % std::min(layers - 1, 3));
    std::vector<int> balance(stages, 1);
    for (int extra = layers - stages; extra > 0; --extra) ++balance[rng() % stages];
    const int chunks = 1 + static_cast<int>(rng() % batch);
    const auto checkpoint = kAllCheckpointModes[rng() % std::size(kAllCheckpointModes)];
    const auto schedule = rng() % 2 ? ScheduleKind::GPipe : ScheduleKind::OneFOneB;
    const Plan plan = testing::make_plan(balance, chunks, checkpoint, schedule);
    Hardware hw = replicate_device(profile.device, stages);
    hw.link.bandwidth_bytes_per_s = 1e5 * static_cast<double>(1 + rng() % 100);
    hw.link.latency_ms = 0.1;
    const SimulationResult apart = Simulator(profile, hw).run(plan);
    const int shares = stages >= 3 && trial % 2 ? stages - 1 : stages;
    with_whole += shares < stages;
    for (int d = 0; d < shares; ++d) hw.devices[d].share_of = "cuda:0";
    const SimulationResult shared = Simulator(profile, hw).run(plan);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": " << describe_plan(plan) << ", "
                                      << shares << " shares");
    ASSERT_DOUBLE_EQ(shared.iteration_ms, apart.iteration_ms);  // no launch times: no turns
    if (shares == stages) {
      // Nothing is posted between shares: they are one process, their copies no receives.
      hw.posted_receives = true;
      const SimulationResult posted = Simulator(profile, hw).run(plan);
      for (int d = 0; d < stages; ++d)
        ASSERT_EQ(posted.devices[d].peak_memory_bytes, shared.devices[d].peak_memory_bytes);
    }

    // Per micro-batch and stage, when its backward ends.
    std::map<std::pair<int, int>, double> backward_end;
    for (const SimTask& t : apart.tasks) {
      if (t.kind == TaskKind::Backward) backward_end[{t.stage, t.micro_batch}] = t.end_ms;
    }
    struct Twice {
      double from, to;
      std::int64_t bytes;
    };
    std::vector<Twice> twice;
    std::vector<double> times;
    for (const SimTask& t : apart.tasks) {
      if (is_compute(t.kind) || t.device >= shares || t.peer >= shares) continue;
      const bool kept = t.kind == TaskKind::SendActivation &&
                        !is_checkpointed(checkpoint, t.micro_batch,
                                         static_cast<int>(apart.micro_batch_sizes.size()));
      twice.push_back(
          {t.start_ms, kept ? backward_end.at({t.stage + 1, t.micro_batch}) : t.end_ms, t.bytes});
    }
    for (const auto* r : {&apart, &shared}) {
      for (const DeviceReport& d : r->devices) {
        for (const CounterSample& s : d.memory) times.push_back(s.time);
      }
    }
    for (const double t : times) {
      std::int64_t gpu = 0;
      for (int d = 0; d < shares; ++d) gpu += level_at(apart.devices[d].memory, t);
      for (const Twice& c : twice) gpu -= c.from <= t && t < c.to ? c.bytes : 0;
      for (int d = 0; d < stages; ++d) {
        ASSERT_EQ(level_at(shared.devices[d].memory, t),
                  d < shares ? gpu : level_at(apart.devices[d].memory, t))
            << "at " << t << " ms, " << shared.devices[d].name;
      }
      ++compared;
    }
    std::int64_t sum_of_peaks = 0;
    for (int d = 0; d < shares; ++d) sum_of_peaks += apart.devices[d].peak_memory_bytes;
    lower += shared.devices[0].peak_memory_bytes < sum_of_peaks;
  }
  EXPECT_GT(compared, 2000);
  EXPECT_GT(with_whole, 30);
  // The GPU's peak is not the sum of the shares' own: they come at different times.
  EXPECT_GT(lower, 100);
}

TEST(Memory, LibraryWorkspacesOncePerDeviceThatComputes) {
  // cuBLAS-style workspaces (here 4096 bytes) stay allocated on every device that runs a stage,
  // once however many stages share it; the third device holds none and is not reported.
  Profile p = two_layers(2);
  p.device.library_bytes = 4096;
  EXPECT_EQ(peaks(p, make_plan({1, 1}, 2, CheckpointMode::Never), 3),
            (std::vector<std::int64_t>{3270 + 4096, 1720 + 4096}));
  Plan shared = make_plan({1, 1}, 2, CheckpointMode::Never);
  shared.devices = {"cpu:0", "cpu:0"};
  EXPECT_EQ(peaks(p, shared, 1), (std::vector<std::int64_t>{4270 + 4096}));
}

TEST(Memory, OneFOneBHoldsAtMostKMicroBatchesOnStageZero) {
  // No parameters: stage 0 holds, per micro-batch, saved 50 + output 100, plus one received
  // gradient (100) when its backward starts, plus the batch input (M x 10).
  testing::LayerSpec a{1.0, 2.0, 0, 100, 50, 0}, b{1.0, 2.0, 0, 10, 20, 0};
  const Profile profile = testing::make_profile({a, b}, 4, 10);
  const auto gpipe = peaks(profile, make_plan({1, 1}, 4, CheckpointMode::Never), 2);
  const auto one_f =
      peaks(profile, make_plan({1, 1}, 4, CheckpointMode::Never, ScheduleKind::OneFOneB), 2);
  EXPECT_EQ(gpipe[0], 4 * 10 + 4 * 150 + 100);  // all M in flight
  EXPECT_EQ(one_f[0], 4 * 10 + 2 * 150 + 100);  // K = 2 in flight
}

TEST(Memory, AFrozenStemHasNoGraphNoGradientsNoStateAndGetsNoGradient) {
  // Layer 0 frozen (transfer learning's stem): its forward on data builds no graph (the
  // profiler measures nothing saved and no backward), and layer 1's input needs no gradient.
  // Adam (two states per parameter that trains).
  Profile p =
      testing::make_profile({{1.0, 0.0, 1000, 100, 0, 0}, {1.0, 2.0, 500, 10, 20, 0}}, 2, 10);
  p.layers[0].trainable_param_bytes = 0;
  Plan plan = make_plan({1, 1}, 2, CheckpointMode::Never);
  plan.optimizer_state_factor = 2.0;
  // Device 0: parameters 1000, no state, the batch's input 2 x 10 -> 1020; F0, F1 hold their
  // outputs (100 each) until their backwards -> 1220 (peak). The gradients "received" are empty
  // and B1, B0 make nothing, freeing the outputs.
  // Device 1: parameters 500 and Adam's 1000 -> 1500; inputs received +100 each, F keeps saved
  // 20 each -> 1740; B1 makes no input gradient, the parameter gradients +500 -> 2240, frees
  // saved 20 and its input 100 -> 2120 (nothing sent); B0 adds into .grad, +500 for a moment ->
  // 2620 (peak).
  EXPECT_EQ(peaks(p, plan, 2), (std::vector<std::int64_t>{1220, 2620}));
  // Nothing crosses back: both gradient copies carry no byte.
  const SimulationResult r = Simulator(p, replicate_device(p.device, 2)).run(plan);
  int gradients = 0;
  for (const auto& t : r.tasks) {
    if (t.kind != TaskKind::SendGradient) continue;
    ++gradients;
    EXPECT_EQ(t.bytes, 0);
  }
  EXPECT_EQ(gradients, 2);
  // One stage holding both, on one device: parameters 1500, Adam's state of the 500 that train
  // 1000, the input 20 -> 2520. Each forward keeps layer 0's output (layer 1 keeps its input)
  // and layer 1's saved 20 -> 2640, 2760. B1 makes no input gradient for layer 1 nor anything
  // for layer 0: the parameter gradients +500 -> 3260, then frees 120 -> 3140; B0 adds into
  // .grad, +500 for a moment -> 3640 (peak), then 3020.
  Plan one = make_plan({2}, 2, CheckpointMode::Never);
  one.optimizer_state_factor = 2.0;
  EXPECT_EQ(peaks(p, one, 1), (std::vector<std::int64_t>{3640}));
}

TEST(Memory, OptimizerStateScalesParameters) {
  Plan plan = make_plan({1}, 2, CheckpointMode::Never);
  plan.optimizer_state_factor = 2.0;  // Adam: two states per parameter
  EXPECT_EQ(peaks(one_layer(2), plan, 1), (std::vector<std::int64_t>{3070 + 2000}));
}

// Three layers: parameters 7, 11, 13; outputs 10, 20, 30; saved 1, 2, 3; workspace 5, 50, 5
// (bytes at size 1); model input 4.
Profile three_layers() {
  return testing::make_profile({{1, 1, 7, 10, 1, 5}, {1, 1, 11, 20, 2, 50}, {1, 1, 13, 30, 3, 5}},
                               1, 4);
}

TEST(StageMemory, WorkspaceAndIntermediates) {
  // Three layers: outputs 10, 20, 30; saved 1, 2, 3; workspace 5, 50, 5 (bytes at size 1).
  Profile p = three_layers();
  const CostModel model(p);
  const StageMemory m = stage_memory(model, model.at(1), 0, 3, false);
  EXPECT_EQ(m.input_bytes, 4);
  EXPECT_EQ(m.output_bytes, 30);
  // Σ saved + outputs = 66, less the model's output 30, which dies once the loss exists.
  EXPECT_EQ(m.kept_bytes, 36);
  // Forward: before layer 1, 11 kept; layer 1 adds 2 + 20 + 50 -> 83; finally 36.
  EXPECT_EQ(m.forward_transient, 83 - 36);
  // A stage that is not the last keeps its output for the backward: 1 + 10 + 2 + 20.
  EXPECT_EQ(stage_memory(model, model.at(1), 0, 2, false).kept_bytes, 33);
  EXPECT_EQ(model.at(1).kept_bytes(0, 2), 33);
  EXPECT_EQ(model.at(1).kept_bytes(0, 3), 36);
  // Checkpointed: layer 1 holds input 10, output 20, workspace 50 -> 80; the output 30 stays.
  EXPECT_EQ(m.checkpointed_forward_transient, 80 - 30);
  // Backward, not the first: each layer's parameter gradients (7, 11, 13) exist while they are
  // added into .grad. Layer 2: gradient of its input 20 + 13 + workspace 5 -> 38; afterwards
  // +20 - 3 - 20 (its input activation) = -3. Layer 1: -3 + 10 + 11 + 50 = 68; afterwards
  // -3 + 10 - 2 - 10 - 20 (its input activation, its output's gradient) = -25. Layer 0:
  // -25 + 4 + 7 + 5 = -9; afterwards -25 + 4 - 1 - 10 (its output's gradient) = -32. Peak 68.
  EXPECT_EQ(m.backward_peak, 68);
  EXPECT_EQ(m.backward_net, -32);
  // The first: the parameter gradients stay, layer by layer: peak at layer 1: -3 + 13 + 10 + 11
  // + 50.
  EXPECT_EQ(m.backward_peak_first, 81);
  EXPECT_EQ(m.backward_net_first, -32 + 31);
}

TEST(Memory, AnArrivalAfterABackwardsPeakStacksOnWhatIsLeft) {
  // Layer 0 on device 0 (forward 7 ms, output 100); layers 1 and 2 on device 1 (forward 1 ms,
  // backward 4 ms each, outputs 10 and 1, nothing saved, no parameters). Measured backward
  // peaks above the level: 150 for layer 1, 500 for layer 2. 1F1B, 2 micro-batches of 1, ideal
  // link. Device 1's backward walk: layer 2 peaks at 0 + 500, allocates its input gradient 10
  // and frees the storage it kept (its input, 10) -> 0; layer 1 peaks at 0 + 150, allocates the
  // stage input's gradient 100 and frees its output's gradient 10 -> net 90. So the peak is
  // over once layer 2 is done, half-way through the task, and the level never again exceeds
  // 150 above the start.
  Profile p =
      testing::make_profile({{7, 1, 0, 100, 0, 0}, {1, 4, 0, 10, 0, 0}, {1, 4, 0, 1, 0, 0}}, 2, 10);
  for (auto& layer : p.layers) layer.backward_peak_bytes = {0, 0};
  p.layers[1].backward_peak_bytes = {150, 150};
  p.layers[2].backward_peak_bytes = {500, 500};
  for (auto& layer : p.layers) layer.backward_accumulate_peak_bytes = layer.backward_peak_bytes;
  const CostModel model(p);
  const StageMemory m = stage_memory(model, model.at(1), 1, 3, false);
  EXPECT_EQ(m.backward_peak, 500);
  EXPECT_EQ(m.backward_after_peak, 150);
  EXPECT_EQ(m.backward_net, 90);
  EXPECT_DOUBLE_EQ(m.backward_peak_end, 0.5);

  // Device 1, hand-worked: t=7 micro-batch 0 arrives (+100) and F0 starts: it keeps layer 1's
  // output 10 (layer 2 keeps its input) and holds the model output 1 for the loss -> 111; at 9
  // F0 ends (-1) and B0 starts (+500) -> 610. At 13 layer 2 is done (-350) -> 260; at 14
  // micro-batch 1 arrives from device 0's second forward (+100) -> 360, where charging B0's
  // peak to its end gave 710. At 17 B0 ends: down to its net (-60) and its input dies (-100)
  // -> 200; the input gradient is sent (-100) and F1 starts -> 111. At 19 B1 -> 610 again (the
  // peak), 23 -> 260, 27 -> 0.
  const Hardware hw = replicate_device(p.device, 2);
  const Plan plan = make_plan({1, 2}, 2, CheckpointMode::Never, ScheduleKind::OneFOneB);
  check_plan(plan, p, hw, "test");
  const SimulationResult r = Simulator(p, hw).run(plan);
  EXPECT_EQ(r.devices[1].peak_memory_bytes, 610);
  std::vector<std::pair<double, std::int64_t>> history;
  for (const auto& sample : r.devices[1].memory) history.emplace_back(sample.time, sample.value);
  const std::vector<std::pair<double, std::int64_t>> expected = {
      {0, 0}, {7, 111}, {9, 610}, {13, 260}, {14, 360}, {17, 111}, {19, 610}, {23, 260}, {27, 0}};
  EXPECT_EQ(history, expected);
}

TEST(Memory, AnArrivalAfterALayersOwnPeakStacksOnWhatIsLeft) {
  // One coarse layer is a whole stage: layer 0 on device 0 (forward 7 ms, output 100), layer 1
  // on device 1 (forward 2 ms, backward 8 ms, output 1, nothing saved, no parameters), whose
  // backward peaks 500 above its start and, as measured, is done with that a quarter of the way
  // through: from then on it stays 450 below. 1F1B, 2 micro-batches of 1, ideal link.
  Profile p = testing::make_profile({{7, 1, 0, 100, 0, 0}, {2, 8, 0, 1, 0, 0}}, 2, 10);
  p.layers[0].backward_peak_bytes = {0, 0};
  p.layers[1].backward_peak_bytes = {500, 500};
  for (auto& layer : p.layers) layer.backward_accumulate_peak_bytes = layer.backward_peak_bytes;
  p.layers[0].backward_peak_end = {1.0, 1.0};
  p.layers[0].backward_peak_drop_bytes = {0, 0};
  p.layers[1].backward_peak_end = {0.25, 0.25};
  p.layers[1].backward_peak_drop_bytes = {450, 450};
  const CostModel model(p);
  // The walk leaves the stage input's gradient (100), above 500 - 450: the level after the
  // peak is the larger.
  const StageMemory m = stage_memory(model, model.at(1), 1, 2, false);
  EXPECT_EQ(m.backward_peak, 500);
  EXPECT_EQ(m.backward_after_peak, 100);
  EXPECT_EQ(m.backward_net, 100);
  EXPECT_DOUBLE_EQ(m.backward_peak_end, 0.25);

  // Device 1, hand-worked: t=7 micro-batch 0 arrives (+100) and F0 holds the model output for
  // the loss (+1); at 9 F0 ends (-1) and B0 starts (+500) -> 600; at 11 its peak is over
  // (-400) -> 200; at 14 micro-batch 1 arrives (+100) -> 300, where holding the peak to B0's end
  // gave 700. At 17 B0 ends, its input dies (-100), the input gradient is sent (-100) and F1
  // starts (+1) -> 101; B1 from 19 -> 600, 21 -> 200, 27 -> 0.
  const Hardware hw = replicate_device(p.device, 2);
  const Plan plan = make_plan({1, 1}, 2, CheckpointMode::Never, ScheduleKind::OneFOneB);
  check_plan(plan, p, hw, "test");
  const SimulationResult r = Simulator(p, hw).run(plan);
  EXPECT_EQ(r.devices[1].peak_memory_bytes, 600);
  std::vector<std::pair<double, std::int64_t>> history;
  for (const auto& sample : r.devices[1].memory) history.emplace_back(sample.time, sample.value);
  const std::vector<std::pair<double, std::int64_t>> expected = {
      {0, 0}, {7, 101}, {9, 600}, {11, 200}, {14, 300}, {17, 101}, {19, 600}, {21, 200}, {27, 0}};
  EXPECT_EQ(history, expected);
  // Without the record the peak lasts to the end of the layer: 700.
  for (auto& layer : p.layers) {
    layer.backward_peak_end.clear();
    layer.backward_peak_drop_bytes.clear();
  }
  EXPECT_EQ(Simulator(p, hw).run(plan).devices[1].peak_memory_bytes, 700);
}

TEST(StageMemory, ALayersOwnReleaseThenItsEnd) {
  // A stage of two layers walked last first: layer 1 peaks at 500 (backward 4 ms), layer 0 at 50
  // (4 ms), and nothing else is left above the start. Layer 1 is done with its own peak a
  // quarter of the way through (1 ms of the walk's 8), `drop` below it; once it has ended
  // (4 ms) only layer 0's 50 counts.
  Profile p = testing::make_profile({{1, 4, 0, 10, 0, 0}, {1, 4, 0, 1, 0, 0}}, 1);
  p.layers[0].backward_peak_bytes = {50};
  p.layers[1].backward_peak_bytes = {500};
  for (auto& layer : p.layers) layer.backward_accumulate_peak_bytes = layer.backward_peak_bytes;
  p.layers[0].backward_peak_end = {1.0};
  p.layers[0].backward_peak_drop_bytes = {0};
  p.layers[1].backward_peak_end = {0.25};
  auto effect_with = [&](std::int64_t drop) {
    p.layers[1].backward_peak_drop_bytes = {drop};
    const CostModel model(p);
    const StageMemory m = stage_memory(model, model.at(1), 0, 2, true);
    EXPECT_EQ(m.backward_peak, 500);
    return backward_effect(m, false, 0);
  };
  // 10 below from 1/8 on, then down to 50 from 1/2 on: two steps.
  const MemoryEffect small = effect_with(10);
  EXPECT_EQ(small.allocated, 500);
  EXPECT_EQ(small.freed_after_peak, 10);
  EXPECT_DOUBLE_EQ(small.peak_end, 0.125);
  EXPECT_EQ(small.freed_after_layer, 490 - 50);
  EXPECT_DOUBLE_EQ(small.layer_end, 0.5);
  // 450 below (down to layer 0's 50) from 1/8 on: the layer's end frees nothing more.
  const MemoryEffect large = effect_with(450);
  EXPECT_EQ(large.freed_after_peak, 450);
  EXPECT_DOUBLE_EQ(large.peak_end, 0.125);
  EXPECT_EQ(large.freed_after_layer, 0);
  // Both end at the walk's net: -10, layer 0's output gradient freed.
  EXPECT_EQ(small.allocated - small.freed_after_peak - small.freed_after_layer - small.freed, -10);
  EXPECT_EQ(large.allocated - large.freed_after_peak - large.freed_after_layer - large.freed, -10);
  // Without the record, one step at the peak layer's end: 450 freed at 1/2.
  for (auto& layer : p.layers) {
    layer.backward_peak_end.clear();
    layer.backward_peak_drop_bytes.clear();
  }
  const CostModel model(p);
  const MemoryEffect one = backward_effect(stage_memory(model, model.at(1), 0, 2, true), false, 0);
  EXPECT_EQ(one.freed_after_peak, 450);
  EXPECT_DOUBLE_EQ(one.peak_end, 0.5);
  EXPECT_EQ(one.freed_after_layer, 0);
}

// The three layers of WorkspaceAndIntermediates with the profiler's measured peaks above each
// backward's start: first backward 40, 30, 20 and accumulating 25, 60, 15 (layers 0, 1, 2).
Profile three_layers_with_measured_peaks() {
  Profile p = three_layers();
  p.layers[0].backward_peak_bytes = {40};
  p.layers[1].backward_peak_bytes = {30};
  p.layers[2].backward_peak_bytes = {20};
  p.layers[0].backward_accumulate_peak_bytes = {25};
  p.layers[1].backward_accumulate_peak_bytes = {60};
  p.layers[2].backward_accumulate_peak_bytes = {15};
  return p;
}

TEST(StageMemory, MeasuredBackwardPeaksReplaceTheEstimate) {
  // The same three layers, with the profiler's measured peaks above each backward's start:
  // first backward 40, 30, 20 and accumulating 25, 60, 15 (layers 0, 1, 2).
  Profile p = three_layers_with_measured_peaks();
  const CostModel model(p);
  const StageMemory m = stage_memory(model, model.at(1), 0, 3, false);
  // Net changes as in WorkspaceAndIntermediates: after layer 2 -3, after layer 1 -25 (not the
  // first); first: after layer 2 -3 + 13 = 10, after layer 1 10 + 10 + 11 - 2 - 10 - 20 = -1.
  // Accumulating: max(0 + 15, -3 + 60, -25 + 25) = 57.
  EXPECT_EQ(m.backward_peak, 57);
  // First: max(0 + 20, 10 + 30, -1 + 40) = 40.
  EXPECT_EQ(m.backward_peak_first, 40);
  // The nets are what is allocated and freed, not peaks: unchanged.
  EXPECT_EQ(m.backward_net, -32);
  EXPECT_EQ(m.backward_net_first, -1);
}

TEST(StageMemory, SplitBackwardWHoldsWhatEachLayersBackwardMakesOnTheWayToItsWeights) {
  // The same three layers and measured peaks. W runs layer by layer, first layer first, and
  // does not compute a layer's input gradient (10 for layer 1, 20 for layer 2; the model's
  // first layer has none), so a layer's W peaks at its measured peak less that gradient: 40,
  // 30 - 10 = 20, 20 - 20 = 0 (not its 13 bytes of parameters: a layer of many blocks frees each
  // block's saved tensors before the blocks ahead make their gradients). The same when
  // accumulating (the fixture's accumulating peaks, 25 and 60, are not read): W's autograd.grad
  // returns the layer's fresh gradients all at once, as the first backward made them, and adds
  // them into .grad only then. Once a layer's W is done, autograd frees its saved
  // tensors (1, 2, 3); the storages the layers keep are the boundaries W holds (each layer's
  // output is a layer with parameters'), so nothing more goes before W ends.
  Profile p = three_layers_with_measured_peaks();
  const CostModel model(p);
  const StageMemory m = stage_memory(model, model.at(1), 0, 3, true);
  // Accumulating: max(0 + 40, -1 + 20, -3 + 0) = 40 (.grad is there already, below W's start).
  EXPECT_EQ(m.weight_backward[0].peak, 40);
  // The first W keeps each layer's gradients as .grad: max(0 + 40, 7 - 1 + 20, 18 - 3 + 0).
  EXPECT_EQ(m.weight_backward[1].peak, 40);
  const MemoryEffect first = weight_backward_effect(m, 31, true, true, 0);  // the last stage
  EXPECT_EQ(first.allocated, 40);
  // After layer 0 (the peak) the walk never exceeds 26; it leaves 31 - 6 = 25.
  EXPECT_EQ(m.weight_backward[1].after_layer, 26);
  // Everything else goes when W ends: what it allocated less what it leaves, 31 of .grad, less
  // what the split forward kept (the activations' 36 and the logits, 30: the executor holds the
  // output of every layer with parameters until W, the last one's too) and the gradients I kept
  // (10 + 20 + 30).
  EXPECT_EQ(m.split_kept_bytes, 36 + 30);
  // The same peak (the middle layer's, 83) above more held.
  EXPECT_EQ(m.split_kept_bytes + m.split_forward_transient, m.kept_bytes + m.forward_transient);
  EXPECT_EQ(first.freed_after_layer + first.freed_after_peak + first.freed,
            40 - (31 - 36 - 30 - 60));
  // A stage from layer 1: accumulating max(0 + 20, -2 + 0) = 20; the first time
  // max(0 + 20, 11 - 2 + 0) = 20, below its 24 bytes of parameters (layer 1's saved 2 went).
  const StageMemory later = stage_memory(model, model.at(1), 1, 3, false);
  EXPECT_EQ(later.weight_backward[0].peak, 20);
  EXPECT_EQ(later.weight_backward[1].peak, 20);
  // Without measured peaks a layer's W is its parameters: max(7, -1 + 11, -3 + 13) = 10, and
  // the first time max(7, 6 + 11, 15 + 13) = 28.
  const Profile bare = three_layers();
  const CostModel unmeasured(bare);
  EXPECT_EQ(stage_memory(unmeasured, unmeasured.at(1), 0, 3, true).weight_backward[0].peak, 10);
  EXPECT_EQ(stage_memory(unmeasured, unmeasured.at(1), 0, 3, true).weight_backward[1].peak, 28);
}

// A normalisation (parameters), a Sigmoid (keeps only its own output) and a head (parameters,
// keeps its input), outputs 100, 100, 2. A plain forward keeps the Sigmoid's output; the
// normalisation's dies once the Sigmoid has made its own. A forward whose backward is split
// holds the output of each layer with parameters for W: the normalisation's too, and the logits.
TEST(StageMemory, ASplitForwardHoldsTheOutputOfEveryLayerThatTrains) {
  Profile p =
      testing::make_profile({{1, 1, 8, 100, 0, 0}, {1, 1, 0, 100, 0, 0}, {1, 1, 4, 2, 0, 0}}, 1, 4);
  p.layers[1].keeps_input = false;
  p.layers[1].keeps_output = true;
  const CostModel model(p);
  const StageMemory m = stage_memory(model, model.at(1), 0, 3, true);
  EXPECT_EQ(m.kept_bytes, 100);
  EXPECT_EQ(m.forward_transient, 200 - 100);  // the Sigmoid's output beside its loose input
  EXPECT_EQ(m.split_kept_bytes, 100 + 100 + 2);
  EXPECT_EQ(m.split_forward_transient, 0);
  // Not the last stage: the Sigmoid's output is the held stage output either way.
  const StageMemory within = stage_memory(model, model.at(1), 0, 2, true);
  EXPECT_EQ(within.kept_bytes, 100);
  EXPECT_EQ(within.split_kept_bytes, 200);
  // A frozen normalisation has no W: nothing holds its output.
  Profile frozen = p;
  frozen.layers[0].trainable_param_bytes = 0;
  const CostModel frozen_model(frozen);
  EXPECT_EQ(stage_memory(frozen_model, frozen_model.at(1), 0, 3, true).split_kept_bytes, 100 + 2);
  // The forward effects: split or not; W frees what the split forward kept.
  EXPECT_EQ(forward_effect(m, false, true, true).allocated, 202);
  EXPECT_EQ(forward_effect(m, false, true, false).allocated, 200);
  EXPECT_EQ(recompute_effect(m, true).allocated, 202);
}

TEST(StageMemory, WFreesAStorageWithTheLastLayerKeepingItUnlessABoundaryHoldsIt) {
  // Layer 0 (parameters) makes 10; layer 1, parameterless, keeps its output (a ReLU's 20);
  // layer 2 (parameters) keeps its input, that 20, and makes 30. Saved 1, 2, 3.
  Profile p = three_layers();
  p.layers[1].param_bytes = 0;
  p.layers[1].keeps_output = true;
  p.layers[1].keeps_input = false;
  const CostModel model(p);
  // The 20 is kept by layers 1 and 2, and layer 1 has no W: its graph (and the 20) stays until
  // W ends. Layer 0's 10 is no one's. So W frees 1 after layer 0, 3 after layer 2:
  // max(0 + 7, 7 - 1 + 0 [layer 1], 6 + 13) = 19.
  EXPECT_EQ(stage_memory(model, model.at(1), 0, 3, true).weight_backward[1].peak, 19);
  // Layer 1 with no saved output: the 20 is layer 2's input alone, made by a parameterless
  // layer, so layer 2's W frees it with its saved 3: the level it leaves is 7 - 1 + 13 - 3 - 20.
  p.layers[1].keeps_output = false;
  const CostModel alone(p);
  const StageMemory m = stage_memory(alone, alone.at(1), 0, 3, true);
  EXPECT_EQ(m.weight_backward[1].peak, 19);
  const MemoryEffect first = weight_backward_effect(m, 20, true, true, 0);
  EXPECT_EQ(first.allocated - first.freed_after_peak - first.freed_after_layer,
            7 - 1 + 13 - 3 - 20);
}

TEST(StageMemory, TheLastStagesIKeepsTheGradientItMadeFromTheLossForW) {
  // Outputs 10, 20, 30; every layer has parameters. I keeps each layer's output gradient for W:
  // inside the stage 10 and 20, and on the model's last stage also the 30 its loss made (on any
  // other stage that gradient is received, and counted as such).
  const Profile p = three_layers();
  const CostModel model(p);
  EXPECT_EQ(stage_memory(model, model.at(1), 0, 3, true).input_backward.kept_for_weights,
            10 + 20 + 30);
  EXPECT_EQ(stage_memory(model, model.at(1), 0, 2, true).input_backward.kept_for_weights, 10);
  // I's walk starts from it; its peak is at layer 1: the 30, the 20 layer 2 made (kept), then
  // layer 1's input gradient 10 and its workspace 50. Without the 30 it would be 80.
  EXPECT_EQ(stage_memory(model, model.at(1), 0, 3, true).input_backward.peak, 30 + 20 + 10 + 50);
}

TEST(StageMemory, InsideAStageTheInnerPeaksApply) {
  // The same, with the peaks measured for a layer inside a stage (its output and the gradient
  // it receives die early): first 35, 12, 99 and accumulating 22, 50, 99. A stage's last layer
  // keeps the peaks above: the executor holds its output and the gradient it received.
  Profile p = three_layers_with_measured_peaks();
  p.layers[0].inner_backward_peak_bytes = {35};
  p.layers[1].inner_backward_peak_bytes = {12};
  p.layers[2].inner_backward_peak_bytes = {99};
  p.layers[0].inner_backward_accumulate_peak_bytes = {22};
  p.layers[1].inner_backward_accumulate_peak_bytes = {50};
  p.layers[2].inner_backward_accumulate_peak_bytes = {99};
  const CostModel model(p);
  const StageMemory m = stage_memory(model, model.at(1), 0, 3, false);
  // The walk's levels as above. Accumulating: max(0 + 15, -3 + 50, -25 + 22) = 47; first:
  // max(0 + 20, 10 + 12, -1 + 35) = 34.
  EXPECT_EQ(m.backward_peak, 47);
  EXPECT_EQ(m.backward_peak_first, 34);
  EXPECT_EQ(m.backward_net, -32);
  // A stage ending at layer 1: its measured peak is the held one. Layer 1 allocates its
  // input's gradient 10 (and, the first time, its parameters' 11) and frees its saved 2 and its
  // input's storage 10: level -2 for layer 0 (9 the first time). Accumulating:
  // max(0 + 60, -2 + 22) = 60; first: max(0 + 30, 9 + 35) = 44.
  const StageMemory ending = stage_memory(model, model.at(1), 0, 2, false);
  EXPECT_EQ(ending.backward_peak, 60);
  EXPECT_EQ(ending.backward_peak_first, 44);
}

// A convolutional head, as autograd keeps it (bytes at size 1, no parameters):
//   0 conv      output 100, keeps its input (the stage input)
//   1 relu_     in place: its output is its input's storage, which it keeps (for its backward)
//   2 pool      output 10, keeps nothing of its input (only its shape)
//   3 flatten   a view of the pooled output, keeps nothing
//   4 head      output 2, saved 1, keeps its input: the view, so the pooled storage
Profile convolutional_head() {
  Profile p = testing::make_profile({{1, 1, 0, 100, 0, 0},
                                     {1, 1, 0, 100, 0, 0},
                                     {1, 1, 0, 10, 0, 0},
                                     {1, 1, 0, 10, 0, 0},
                                     {1, 1, 0, 2, 1, 0}},
                                    1, 4);
  p.layers[1].output_aliases_input = true;
  p.layers[2].keeps_input = false;
  p.layers[3].output_aliases_input = true;
  p.layers[3].keeps_input = false;
  return p;
}

TEST(StageMemory, StoragesKeptByLayersThatKeepThemOnly) {
  const Profile p = convolutional_head();
  const CostModel model(p);
  const SizeCosts& c = model.at(1);
  const StageMemory m = stage_memory(model, c, 0, 5, true);
  // Kept: the conv's storage (100, kept by relu_), the pooled storage (10, kept by the head
  // through the view) and the head's saved 1; the logits die with the loss. Charging every
  // output, as profiles without these fields do, would give 1 + 100 + 100 + 10 + 10 = 221.
  EXPECT_EQ(m.kept_bytes, 111);
  EXPECT_EQ(c.kept_bytes(0, 5), 111);
  // Peak while the head runs: 100 kept, the pooled storage, saved 1, logits 2.
  EXPECT_EQ(m.forward_transient, 113 - 111);
  // Checkpointed: the peak is the pool's (its input 100 and its output 10); the logits stay.
  EXPECT_EQ(m.checkpointed_forward_transient, 110 - 2);
  // Backward: head +10 -1 -10 (the pooled storage) = -1; flatten +10 -10 = -1; pool
  // +100 -10 = 89, where relu_'s input gradient takes it to 189 (peak); relu_ frees the conv's
  // storage and its output's gradient: -11; conv frees its output's gradient: -111, all kept.
  EXPECT_EQ(m.backward_peak, 189);
  EXPECT_EQ(m.backward_net, -111);
  // Stages that are not the last hold their output: the pooled storage (pool ends the stage),
  // the conv's storage (kept by relu_ and held, counted once).
  EXPECT_EQ(stage_memory(model, c, 0, 3, true).kept_bytes, 110);
  EXPECT_EQ(c.kept_bytes(0, 3), 110);
  EXPECT_EQ(stage_memory(model, c, 0, 2, true).kept_bytes, 100);
  EXPECT_EQ(c.kept_bytes(0, 2), 100);
  // Its walk frees nothing of it: the held output is freed when the backward ends.
  EXPECT_EQ(stage_memory(model, c, 0, 2, true).backward_net, 0);
  // A stage starting at the pool: its input is the stage's, counted elsewhere.
  EXPECT_EQ(stage_memory(model, c, 2, 5, false).kept_bytes, 11);
  EXPECT_EQ(c.kept_bytes(2, 5), 11);
}

// The same head with relu_ working in place on its input (as torchvision's ReLU(inplace=True)
// does): a stage that starts there runs its layers on a copy of the input (autograd does not let
// the stage's input, the leaf its gradient collects in, change), one stage input per
// micro-batch, which relu_ keeps.
TEST(StageMemory, AStageThatChangesItsInputInPlaceKeepsItsCopy) {
  Profile p = convolutional_head();
  p.layers[1].modifies_input = true;
  const CostModel model(p);
  const SizeCosts& c = model.at(1);
  EXPECT_TRUE(c.copies_input(1, 5));
  EXPECT_TRUE(c.copies_input(1, 2));
  EXPECT_FALSE(c.copies_input(0, 5));  // relu_ changes the conv's output, the stage's own
  EXPECT_FALSE(c.copies_input(2, 5));
  EXPECT_FALSE(c.copies_input(3, 5));  // a view first, then the head makes its own storage
  // From relu_ to the end: the copy (100, kept by relu_), the pooled storage (10, kept by the
  // head through the view), the head's saved 1. Without the copy relu_ keeps the stage input,
  // counted elsewhere: 11.
  const StageMemory m = stage_memory(model, c, 1, 5, false);
  EXPECT_EQ(m.kept_bytes, 111);
  EXPECT_EQ(c.kept_bytes(1, 5), 111);
  // Peak while the head runs: 100 + 10 kept or in use, saved 1, logits 2.
  EXPECT_EQ(m.forward_transient, 113 - 111);
  // Checkpointed: the copy and the pooled output while the pool runs; the logits stay.
  EXPECT_EQ(m.checkpointed_forward_transient, 110 - 2);
  // relu_ alone, not the last stage: the copy is its output, held by the executor.
  EXPECT_EQ(stage_memory(model, c, 1, 2, false).kept_bytes, 100);
  EXPECT_EQ(c.kept_bytes(1, 2), 100);
  // The planner's nested bound leaves the copy out (it must not fall as a stage grows).
  EXPECT_EQ(c.kept_bytes_within(1, 5), 11);
  // Nothing changes for the stages that do not copy.
  const Profile plain = convolutional_head();
  const CostModel before(plain);
  for (const auto& [a, b] : {std::pair{0, 5}, std::pair{2, 5}, std::pair{3, 5}, std::pair{0, 2}}) {
    EXPECT_EQ(stage_memory(model, c, a, b, a == 0).kept_bytes,
              stage_memory(before, before.at(1), a, b, a == 0).kept_bytes);
  }
  EXPECT_EQ(stage_memory(before, before.at(1), 1, 5, false).kept_bytes, 11);
}

TEST(StageMemory, KeptBytesAgreesWithTheWalkOnEveryStageOfEveryFlagMix) {
  // Four layers, every combination of the three flags on each (8^4 profiles), every stage; with
  // no layer changing its input in place, with every view doing so, and with every layer that
  // makes its own output doing so (an in-place change, then a new tensor).
  for (int mask = 0; mask < 3 * 8 * 8 * 8 * 8; ++mask) {
    const int modifying = mask / (8 * 8 * 8 * 8);
    Profile p = testing::make_profile(
        {{1, 1, 0, 100, 1, 0}, {1, 1, 0, 30, 2, 0}, {1, 1, 0, 7, 4, 0}, {1, 1, 0, 5, 8, 0}}, 1, 4);
    for (int l = 0; l < 4; ++l) {
      const int flags = (mask >> (3 * l)) & 7;
      p.layers[l].keeps_input = flags & 1;
      p.layers[l].keeps_output = flags & 2;
      p.layers[l].output_aliases_input = flags & 4;
      p.layers[l].modifies_input =
          modifying == 1 ? (flags & 4) != 0 : modifying == 2 && !(flags & 4);
    }
    const CostModel model(p);
    for (int a = 0; a < 4; ++a) {
      for (int b = a + 1; b <= 4; ++b) {
        const StageMemory m = stage_memory(model, model.at(1), a, b, a == 0);
        ASSERT_EQ(model.at(1).kept_bytes(a, b), m.kept_bytes)
            << "mask " << mask << " stage " << a << ".." << b;
        // Everything kept is freed: by the walk, or (a held output) when the backward ends.
        const std::int64_t held = b < 4 ? m.output_bytes : 0;
        const std::int64_t input_gradient = a == 0 ? 0 : m.input_bytes;
        if (!p.layers[b - 1].output_aliases_input) {
          ASSERT_EQ(m.backward_net, input_gradient - m.kept_bytes + held)
              << "mask " << mask << " stage " << a << ".." << b;
        }
      }
    }
  }
}

// The planner's memory bound (stage_peak_bound) against the simulator: on random plans (GPipe
// and 1F1B, every checkpoint mode, uneven micro-batches, every flag mix, measured backward
// peaks, library workspaces, optimizer state) neither variant exceeds the simulated peak of
// the stage's device, and the nested one never falls as a stage grows at either end.
TEST(StagePeakBound, NeverAboveTheSimulatedPeakOnRandomPlans) {
  std::mt19937 rng(20);
  int checked = 0, binding = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int layers = 1 + static_cast<int>(rng() % 8);
    const std::int64_t batch = 1 + static_cast<std::int64_t>(rng() % 9);
    Profile profile = testing::random_profile(rng, layers, batch);
    testing::vary_memory_flags(rng, profile);
    std::mt19937 tie_rng(static_cast<unsigned>(trial));
    testing::maybe_tie_layers(tie_rng, profile);
    testing::maybe_freeze_layers(tie_rng, profile);
    profile.device.library_bytes = rng() % 2 ? static_cast<std::int64_t>(rng() % 5000) : 0;
    const int stages = 1 + static_cast<int>(rng() % std::min(layers, 4));
    std::vector<int> balance(stages, 1);
    for (int extra = layers - stages; extra > 0; --extra) ++balance[rng() % stages];
    const int chunks = 1 + static_cast<int>(rng() % batch);
    const auto checkpoint = kAllCheckpointModes[rng() % std::size(kAllCheckpointModes)];
    const auto schedule = rng() % 2 ? ScheduleKind::GPipe : ScheduleKind::OneFOneB;
    Plan plan = testing::make_plan(balance, chunks, checkpoint, schedule);
    plan.optimizer_state_factor = static_cast<double>(rng() % 3);
    Hardware hw = replicate_device(profile.device, stages);
    const SimulationResult r = Simulator(profile, hw).run(plan);
    // On shares of one GPU every stage's device holds the GPU's memory: at least its own.
    for (auto& d : hw.devices) d.share_of = "cuda:0";
    const SimulationResult on_shares = Simulator(profile, hw).run(plan);

    const CostModel model(profile);
    const StagePeakShape shape = stage_peak_shape(model, plan, stages);
    const auto sizes = split_batch(batch, chunks);
    const SizeCosts& common = model.at(sizes.front());
    const SizeCosts& last = model.at(sizes.back());
    for (int j = 0, a = 0; j < stages; a += balance[j++]) {
      const int b = a + balance[j];
      const std::int64_t peak = r.devices[j].peak_memory_bytes;
      const std::int64_t full = stage_peak_bound(model, common, last, shape, j, a, b, false);
      const std::int64_t nested = stage_peak_bound(model, common, last, shape, j, a, b, true);
      SCOPED_TRACE(::testing::Message()
                   << "trial " << trial << ": " << describe_plan(plan) << ", stage " << j);
      ASSERT_LE(full, peak);
      ASSERT_LE(nested, peak);
      StagePeakShape shares_shape = shape;
      shares_shape.receives_senders_tensor.assign(static_cast<std::size_t>(stages), true);
      ASSERT_LE(stage_peak_bound(model, common, last, shares_shape, j, a, b, false),
                on_shares.devices[j].peak_memory_bytes);
      ASSERT_LE(nested, on_shares.devices[j].peak_memory_bytes);
      ++checked;
      binding += full == peak ? 1 : 0;
      // Nested: only grows with the stage, whichever end moves (for any stage index).
      for (int a2 = 0; a2 <= a; ++a2) {
        for (int b2 = b; b2 <= layers; ++b2) {
          ASSERT_LE(nested, stage_peak_bound(model, common, last, shape, j, a2, b2, true))
              << "[" << a << ", " << b << ") in [" << a2 << ", " << b2 << ")";
        }
      }
    }
  }
  EXPECT_GT(checked, 5000);
  // Not vacuous: the bound is often the simulated peak itself.
  EXPECT_GT(binding, checked / 10);
}

// torch.distributed.pipelining's I (`stage_backward_input`) keeps a gradient for W per operation
// with weights, and frees, when it detaches the stage's output, what was saved above the last
// one (LayerProfile::torch_weight_gradient_bytes, torch_freed_by_input_bytes). Stage [1, 3) of
// four layers: layer 1 has weights (two operations: 30 bytes of gradients kept besides its
// output's, which it keeps too; 2 saved bytes die), layer 2 has none (its 3 saved bytes die).
TEST(StageMemory, TorchsInputBackwardKeepsAGradientPerOperationWithWeights) {
  Profile p = testing::make_profile(
      {{1, 1, 4, 10, 0, 0}, {1, 1, 4, 10, 5, 0}, {1, 1, 0, 10, 3, 0}, {1, 1, 4, 2, 1, 0}}, 1);
  const StageMemory executor = stage_memory(CostModel(p), CostModel(p).at(1), 1, 3, false);
  const std::vector<std::int64_t> kept{0, 30, 0, 2}, freed{0, 2, 3, 0};
  for (std::size_t l = 0; l < p.layers.size(); ++l) {
    p.layers[l].torch_weight_gradient_bytes = {kept[l]};
    p.layers[l].torch_freed_by_input_bytes = {freed[l]};
  }
  p.layers[1].torch_keeps_output_gradient = true;
  // torch's W of each layer alone: layer 1 peaks 7 bytes above its start the first time, 3
  // later; the others have no W.
  for (std::size_t l = 0; l < p.layers.size(); ++l) {
    p.layers[l].torch_weight_peak_bytes = {l == 1 ? 7 : 0};
    p.layers[l].torch_weight_accumulate_peak_bytes = {l == 1 ? 3 : 0};
  }
  const CostModel model(p);
  const StageMemory m = stage_memory(model, model.at(1), 1, 3, false);
  // Layer 2: its input gradient (10). Layer 1: its input gradient (10) and the 30 kept, with
  // its output's gradient (10) kept too: 50 at the peak; 5 saved bytes die at the end.
  EXPECT_EQ(m.torch_input.peak, 50);
  EXPECT_EQ(m.torch_input.net, 45);
  EXPECT_EQ(m.torch_input.kept_for_weights, 40);
  EXPECT_EQ(m.torch_input.freed_saved, 5);
  // The executor's I keeps one gradient per layer with weights (layer 1's output's, 10).
  EXPECT_EQ(m.input_backward.kept_for_weights, 10);
  EXPECT_EQ(m.input_backward.net, executor.input_backward.net);
  // Over the forward, I and W, what torch kept comes back: what is left is the input gradient
  // (its copy frees it) and the held output (dies with the backward, here 0).
  const auto net = [](const MemoryEffect& e) {
    return e.allocated - e.freed_after_peak - e.freed_after_layer - e.freed;
  };
  const MemoryEffect forward = forward_effect(m, false, false);
  const MemoryEffect input = input_backward_effect(m, true);
  const MemoryEffect weight = weight_backward_effect(m, 8, false, false, 0, true);
  EXPECT_EQ(net(input), 45);
  EXPECT_EQ(net(forward) + net(input) + net(weight), m.input_gradient_bytes + m.output_bytes);
  EXPECT_GE(input.allocated, net(input));
  // W peaks as layer 1's measured W (layer 2, without weights, adds nothing); the first W also
  // leaves the stage's 4 bytes of weight gradients as .grad.
  EXPECT_EQ(weight.allocated, 3);
  const MemoryEffect first_weight = weight_backward_effect(m, 4, true, false, 0, true);
  EXPECT_EQ(first_weight.allocated, 7);
  EXPECT_EQ(net(forward) + net(input) + net(first_weight),
            m.input_gradient_bytes + m.output_bytes + 4);
  // The executor's W (no torch record) peaks otherwise: at its own walk of the layer.
  EXPECT_EQ(weight_backward_effect(m, 4, true, false, 0, false).allocated,
            m.weight_backward[1].peak);
  // Without torch's counts, torch's I is the executor's.
  EXPECT_EQ(executor.torch_input.kept_for_weights, executor.input_backward.kept_for_weights);
  EXPECT_EQ(executor.torch_input.net, executor.input_backward.net);
  EXPECT_EQ(executor.torch_input.freed_saved, 0);
}

// The model's last layer, a head timed with the loss: its measured I peak (1,024 bytes above
// the start at one sample, the loss's gradient of its 512-byte output and the log-probabilities'
// gradient) already holds the loss's gradient, and torch's I peaks there (GPT-2's head measured
// so on torch's runtime, docs/validation.md). Adding the loss's gradient again was 512 over.
TEST(StageMemory, TorchsInputBackwardOfTheLastLayerPeaksAtItsMeasuredPeakWithTheLoss) {
  Profile p = testing::make_profile({{1, 1, 64, 16, 8, 0}, {1, 1, 64, 512, 520, 0}}, 1);
  p.layers[0].torch_weight_gradient_bytes = {16};
  p.layers[1].torch_weight_gradient_bytes = {528};  // the gradients into its two weight operations
  for (LayerProfile& l : p.layers) {
    l.torch_freed_by_input_bytes = {0};
    l.torch_weight_peak_bytes = {0};
    l.torch_weight_accumulate_peak_bytes = {0};
  }
  p.layers[1].backward_input_peak_bytes = {1024};
  p.layers[0].backward_input_peak_bytes = {16};
  for (LayerProfile& l : p.layers) l.backward_weight_peak_bytes = {64};
  const CostModel model(p);
  const StageMemory m = stage_memory(model, model.at(1), 1, 2, false);
  // Its input gradient (16) and the 528 kept are under the measured 1,024.
  EXPECT_EQ(m.torch_input.peak, 1024);
  p.layers[1].backward_input_peak_bytes = {500};
  const CostModel lower(p);
  EXPECT_EQ(stage_memory(lower, lower.at(1), 1, 2, false).torch_input.peak, 16 + 528);
}

TEST(StageMemory, TorchsWeightBackwardFreesWhatOnlyItsOperationsWithWeightsSavedAsItGoes) {
  // A middle stage of layers 1 to 3 (parameters 8, 20, 16; outputs 10). torch's I keeps 12, 14
  // and 6 bytes for W; each layer's W alone peaks 9, 25 and 40 above its start the first time;
  // W frees as it goes 4, 3 and 2 bytes that only the layer's operations with weights saved,
  // and the input of every layer, which only they saved.
  Profile p = testing::make_profile({{1, 1, 4, 10, 0, 0},
                                     {1, 1, 8, 10, 6, 0},
                                     {1, 1, 20, 10, 5, 0},
                                     {1, 1, 16, 10, 4, 0},
                                     {1, 1, 4, 2, 1, 0}},
                                    1);
  const std::vector<std::int64_t> kept{0, 12, 14, 6, 0}, peak{0, 9, 25, 40, 0},
      freed{0, 4, 3, 2, 0};
  for (std::size_t l = 0; l < p.layers.size(); ++l) {
    p.layers[l].torch_weight_gradient_bytes = {kept[l]};
    p.layers[l].torch_freed_by_input_bytes = {0};
    p.layers[l].torch_weight_peak_bytes = {peak[l]};
    p.layers[l].torch_weight_accumulate_peak_bytes = {peak[l]};
    p.layers[l].torch_weight_freed_bytes = {freed[l]};
    p.layers[l].torch_weight_frees_input = true;
  }
  const auto first_weight_peak = [](const Profile& profile) {
    const CostModel model(profile);
    const StageMemory m = stage_memory(model, model.at(1), 1, 4, false);
    return weight_backward_effect(m, 44, true, false, 0, true).allocated;
  };
  // Layer 1: peaks 9; leaves +8 of gradients, -12 kept, -4 freed: -8 (its input is the stage's,
  // torch's buffer). Layer 2: peaks -8 + 25 = 17; leaves +20 - 14 - 3 and its input, layer 1's
  // output, 10: -15. Layer 3: peaks -15 + 40 = 25.
  EXPECT_EQ(first_weight_peak(p), 25);
  // Layer 1 keeps its output itself (a ReLU's): it goes only with the graph, at W's end, and
  // layer 3 peaks 10 higher; the same where layer 1's output is a view of its input.
  Profile keeps = p;
  keeps.layers[1].keeps_output = true;
  EXPECT_EQ(first_weight_peak(keeps), 35);
  Profile view = p;
  view.layers[1].output_aliases_input = true;
  EXPECT_EQ(first_weight_peak(view), 35);
  // A profile without the count frees nothing before W's end: layer 3 peaks at
  // (8 - 12) + (20 - 14) + 40 = 42.
  Profile without = p;
  for (auto& l : without.layers) {
    l.torch_weight_freed_bytes.clear();
    l.torch_weight_frees_input = false;
  }
  EXPECT_EQ(first_weight_peak(without), 42);
  // What W frees early it no longer frees at its end: forward, I and W leave the same.
  const auto net = [](const MemoryEffect& e) {
    return e.allocated - e.freed_after_peak - e.freed_after_layer - e.freed;
  };
  for (const Profile& profile : {p, without}) {
    const CostModel model(profile);
    const StageMemory m = stage_memory(model, model.at(1), 1, 4, false);
    EXPECT_EQ(net(forward_effect(m, false, false)) + net(input_backward_effect(m, true)) +
                  net(weight_backward_effect(m, 44, true, false, 0, true)),
              m.input_gradient_bytes + m.output_bytes + 44);
  }
}

}  // namespace
}  // namespace pipetune
