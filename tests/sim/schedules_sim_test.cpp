// The simulator on the multi-stage and zero-bubble schedules: against a list-scheduling
// reference written here, and against known results (the interleaved bubble, zero bubble's
// gain, its activation memory).

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>

#include "sim/cost_model.hpp"
#include "sim/error.hpp"
#include "sim/plan.hpp"
#include "sim/schedule.hpp"
#include "sim/schedule_csv.hpp"
#include "sim/simulator.hpp"
#include "sim/sweep.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

using testing::LayerSpec;
using testing::make_plan;
using testing::make_profile;

// Random per-layer F, B, I, W (I + W need not equal B: they are measured apart).
Profile random_profile(std::mt19937& rng, int layers, std::int64_t batch) {
  std::uniform_real_distribution<double> ms(0.1, 3.0);
  std::vector<LayerSpec> specs(layers);
  for (auto& spec : specs) {
    spec.forward_ms = ms(rng);
    spec.backward_ms = ms(rng);
    spec.param_bytes = 1024;
  }
  Profile p = make_profile(specs, batch);
  for (auto& layer : p.layers) {
    const double input = ms(rng), weight = ms(rng);
    layer.backward_input_ms.assign(p.micro_batch_sizes.size(), input);
    layer.backward_weight_ms.assign(p.micro_batch_sizes.size(), weight);
  }
  return p;
}

// List scheduling: each device takes its programme's actions in order, each at the later of
// the device being free and its inputs existing (F after the previous stage's F; B or I after
// this stage's F and the next stage's B or I; W after its I). Ideal links, one programme per
// device.
double list_schedule(const Schedule& s, const Profile& p, const std::vector<int>& balance) {
  std::vector<int> first(balance.size() + 1, 0);
  for (std::size_t k = 0; k < balance.size(); ++k) first[k + 1] = first[k] + balance[k];
  auto cost = [&](const Action& a) {
    double sum = 0;
    for (int l = first[a.stage]; l < first[a.stage + 1]; ++l) {
      const auto& layer = p.layers[l];
      switch (a.kind) {
        case ActionKind::Forward:
          sum += layer.forward_ms[0];
          break;
        case ActionKind::Backward:
          sum += layer.backward_ms[0];
          break;
        case ActionKind::InputGrad:
          sum += layer.backward_input_ms[0];
          break;
        case ActionKind::WeightGrad:
          sum += layer.backward_weight_ms[0];
          break;
        case ActionKind::Recompute:
          ADD_FAILURE() << "no recompute here";
      }
    }
    return sum;
  };
  std::map<std::tuple<ActionKind, int, int>, double> done;  // finish times
  auto finished = [&](ActionKind k, int stage, int i) -> std::optional<double> {
    auto it = done.find({k, stage, i});
    if (it != done.end()) return it->second;
    return std::nullopt;
  };
  auto gradient = [&](int stage, int i) {
    auto b = finished(ActionKind::Backward, stage, i);
    return b ? b : finished(ActionKind::InputGrad, stage, i);
  };
  std::vector<std::size_t> next(s.ranks(), 0);
  std::vector<double> free(s.ranks(), 0.0);
  double end = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < s.ranks(); ++r) {
      while (next[r] < s.per_rank[r].size()) {
        const Action a = s.per_rank[r][next[r]];
        std::vector<std::optional<double>> needs;
        if (a.kind == ActionKind::Forward && a.stage > 0) {
          needs.push_back(finished(ActionKind::Forward, a.stage - 1, a.micro_batch));
        }
        if (sends_gradient(a.kind)) {
          needs.push_back(finished(ActionKind::Forward, a.stage, a.micro_batch));
          if (a.stage + 1 < s.stages) needs.push_back(gradient(a.stage + 1, a.micro_batch));
        }
        if (a.kind == ActionKind::WeightGrad) {
          needs.push_back(finished(ActionKind::InputGrad, a.stage, a.micro_batch));
        }
        double start = free[r];
        bool ready = true;
        for (const auto& n : needs) {
          if (!n)
            ready = false;
          else
            start = std::max(start, *n);
        }
        if (!ready) break;
        free[r] = start + cost(a);
        done[{a.kind, a.stage, a.micro_batch}] = free[r];
        end = std::max(end, free[r]);
        ++next[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < s.ranks(); ++r) EXPECT_EQ(next[r], s.per_rank[r].size()) << "stuck";
  return end;
}

TEST(ScheduleSimulation, TorchCsvSchedulesEqualListScheduling) {
  std::mt19937 rng(18);
  int checked = 0;
  for (auto kind : kAllScheduleKinds) {
    for (int ranks : {2, 3, 4}) {
      const int per_rank = fixed_stages_per_device(kind).value_or(2);
      for (int m : {1, 2, 4, 5, 8}) {
        const int stages = ranks * per_rank;
        if (schedule_refusal(kind, ranks, per_rank, m)) continue;
        // The schedule as torch's CSV, read back; random layers, 1 to 3 per stage.
        const Schedule generated = make_schedule(kind, stages, m, CheckpointMode::Never, per_rank);
        const Schedule s = parse_schedule_csv(schedule_csv(generated.per_rank), "torch.csv");
        std::vector<int> balance(stages);
        for (int& b : balance) b = 1 + static_cast<int>(rng() % 3);
        int layers = 0;
        for (int b : balance) layers += b;
        const Profile profile = random_profile(rng, layers, 4L * m);
        const Hardware hw = replicate_device(profile.device, ranks);
        Plan plan = make_plan(balance, m, CheckpointMode::Never);
        for (int st = 0; st < stages; ++st) {
          plan.devices.push_back(hw.devices[s.stage_rank[st]].name);
        }
        check_plan(plan, profile, hw, "plan");
        const auto result = Simulator(profile, hw).run(plan, s);
        EXPECT_NEAR(result.iteration_ms, list_schedule(s, profile, balance), 1e-9)
            << to_string(kind) << " ranks " << ranks << " M " << m;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 60);
}

// Uniform stages: F and B per stage of the whole model's f and b split evenly.
SimulationResult uniform(ScheduleKind kind, int ranks, int per_rank, int m, double weight_share,
                         std::int64_t saved = 0) {
  const int stages = ranks * per_rank;
  LayerSpec spec;
  spec.forward_ms = 1.0 / per_rank;
  spec.backward_ms = 2.0 / per_rank;
  spec.param_bytes = 1 << 20;
  spec.output_per_sample = 16;
  spec.saved_per_sample = saved;
  Profile p = make_profile(std::vector<LayerSpec>(stages, spec), m);
  for (auto& layer : p.layers) {
    layer.backward_weight_ms.assign(p.micro_batch_sizes.size(), weight_share * spec.backward_ms);
    layer.backward_input_ms.assign(p.micro_batch_sizes.size(),
                                   (1 - weight_share) * spec.backward_ms);
  }
  const Hardware hw = replicate_device(p.device, ranks);
  Plan plan = make_plan(std::vector<int>(stages, 1), m, CheckpointMode::Never, kind);
  plan.stages_per_device = per_rank;
  check_plan(plan, p, hw, "plan");
  return Simulator(p, hw).run(plan);
}

TEST(ScheduleSimulation, InterleavingShrinksTheBubbleByStagesPerDevice) {
  // 1F1B on D devices, M micro-batches, F + B = 3 per device: M·3 + (D − 1)·3. Interleaved
  // with v stages per device: the fill and drain take (D − 1)·3 / v.
  for (int ranks : {2, 4}) {
    for (int v : {1, 2, 4}) {
      for (int m : {ranks, 2 * ranks, 4 * ranks}) {
        const double expected = m * 3.0 + (ranks - 1) * 3.0 / v;
        EXPECT_NEAR(uniform(ScheduleKind::Interleaved1F1B, ranks, v, m, 0.5).iteration_ms, expected,
                    1e-9)
            << "D " << ranks << " v " << v << " M " << m;
      }
    }
    EXPECT_NEAR(uniform(ScheduleKind::OneFOneB, ranks, 1, 8, 0.5).iteration_ms,
                8 * 3.0 + (ranks - 1) * 3.0, 1e-9);
  }
}

TEST(ScheduleSimulation, ZeroBubbleBeatsOneFOneBWhenWeightGradientsAreAShare) {
  for (int ranks : {2, 4}) {
    for (int m : {ranks, 2 * ranks, 3 * ranks}) {
      const double one_f_one_b = uniform(ScheduleKind::OneFOneB, ranks, 1, m, 0.5).iteration_ms;
      const double zb = uniform(ScheduleKind::InterleavedZB, ranks, 1, m, 0.5).iteration_ms;
      EXPECT_LT(zb, one_f_one_b - 0.5) << "D " << ranks << " M " << m;
      const double interleaved =
          uniform(ScheduleKind::Interleaved1F1B, ranks, 2, m, 0.5).iteration_ms;
      const double zbv = uniform(ScheduleKind::ZBV, ranks, 2, m, 0.5).iteration_ms;
      EXPECT_LT(zbv, interleaved) << "D " << ranks << " M " << m;
      // Without weight gradients (W = 0) there is nothing to fill the bubble with.
      EXPECT_GE(uniform(ScheduleKind::InterleavedZB, ranks, 1, m, 0.0).iteration_ms + 1e-9,
                one_f_one_b)
          << "D " << ranks << " M " << m;
    }
  }
}

// Micro-batches whose activations a device holds at once: forwards whose backward has not
// ended (B, or W for a split one), at the worst point of its programme.
std::vector<int> most_in_flight(const Schedule& s) {
  std::vector<int> most(s.ranks(), 0);
  for (int r = 0; r < s.ranks(); ++r) {
    int now = 0;
    for (const Action& a : s.per_rank[r]) {
      if (a.kind == ActionKind::Forward) most[r] = std::max(most[r], ++now);
      if (a.kind == ActionKind::Backward || a.kind == ActionKind::WeightGrad) --now;
    }
  }
  return most;
}

TEST(ScheduleSimulation, ZeroBubblePeakMemoryFollowsWhatTheScheduleKeeps) {
  // One layer per stage with parameters: W keeps no output gradient, so a device's activation
  // memory is its micro-batches in flight times what one keeps.
  int compared = 0;
  for (int ranks : {2, 3, 4}) {
    for (int m : {ranks, 2 * ranks}) {
      const auto one = uniform(ScheduleKind::OneFOneB, ranks, 1, m, 0.5, 64);
      const auto zb = uniform(ScheduleKind::InterleavedZB, ranks, 1, m, 0.5, 64);
      const auto held_one =
          most_in_flight(make_schedule(ScheduleKind::OneFOneB, ranks, m, CheckpointMode::Never));
      const auto held_zb = most_in_flight(
          make_schedule(ScheduleKind::InterleavedZB, ranks, m, CheckpointMode::Never, 1));
      for (int d = 0; d < ranks; ++d) {
        if (held_zb[d] > held_one[d]) continue;  // ZB1P delays W: it may hold more here
        EXPECT_LE(zb.devices[d].peak_memory_bytes, one.devices[d].peak_memory_bytes)
            << "D " << ranks << " M " << m << " device " << d;
        ++compared;
      }
    }
  }
  EXPECT_GE(compared, 6);  // device 0 of each at least
}

TEST(BackwardSplit, ProfileFieldsRoundTripAndComeTogether) {
  std::mt19937 rng(7);
  const Profile p = random_profile(rng, 3, 4);
  const Profile q = parse_profile(profile_to_json(p), "again.json");
  EXPECT_EQ(q.layers[2].backward_input_ms, p.layers[2].backward_input_ms);
  EXPECT_EQ(q.layers[2].backward_weight_ms, p.layers[2].backward_weight_ms);
  auto refusal = [&](const std::function<void(Profile&)>& edit) {
    Profile bad = p;
    edit(bad);
    try {
      parse_profile(profile_to_json(bad), "in.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  // Layer 1 without its backward_weight_ms field.
  std::string text = profile_to_json(p);
  std::size_t at = text.find("\"backward_weight_ms\"");
  at = text.find("\"backward_weight_ms\"", at + 1);
  const std::size_t from = text.rfind(',', at), to = text.find(']', at);
  text.erase(from, to + 1 - from);
  try {
    parse_profile(text, "in.json");
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("layers[1]: missing field \"backward_weight_ms\" "
                                         "(backward_input_ms and backward_weight_ms come "
                                         "together)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NE(refusal([](Profile& x) {
              x.layers[2].backward_input_ms.clear();
              x.layers[2].backward_weight_ms.clear();
            }).find("layers[2]: missing field \"backward_input_ms\" (layers[0] has it"),
            std::string::npos);
  // An old profile (no split) still loads.
  EXPECT_EQ(refusal([](Profile& x) {
              for (auto& l : x.layers) l.backward_input_ms.clear(), l.backward_weight_ms.clear();
            }),
            "accepted");
}

TEST(BackwardSplit, UnmeasuredSplitsHalvesWhereThereAreParameters) {
  std::vector<LayerSpec> specs(2);
  specs[0].backward_ms = 3.0;
  specs[0].param_bytes = 4096;
  specs[1].backward_ms = 2.0;  // no parameters: no W
  const Profile p = make_profile(specs, 4);
  const CostModel costs(p);
  const SizeCosts& c = costs.at(2);
  EXPECT_DOUBLE_EQ(c.backward_input_ms[0], 1.5);
  EXPECT_DOUBLE_EQ(c.backward_weight_ms[0], 1.5);
  EXPECT_DOUBLE_EQ(c.backward_input_ms[1], 2.0);
  EXPECT_DOUBLE_EQ(c.backward_weight_ms[1], 0.0);
  EXPECT_DOUBLE_EQ(c.backward_input_ms_sum(0, 2) + c.backward_weight_ms_sum(0, 2),
                   c.backward_ms_sum(0, 2));
}

// I and W free, together, what B frees: after the iteration every device is back at its
// baseline plus the parameter gradients, whichever the schedule.
TEST(BackwardSplit, MemoryReturnsToTheSameLevelAsWithAWholeBackward) {
  LayerSpec spec;
  spec.param_bytes = 1000;
  spec.output_per_sample = 40;
  spec.saved_per_sample = 24;
  spec.workspace_per_sample = 8;
  const Profile p = make_profile(std::vector<LayerSpec>(8, spec), 8, 16);
  const Hardware hw = replicate_device(p.device, 2);
  for (auto mode : kAllCheckpointModes) {
    auto final_levels = [&](ScheduleKind kind) {
      Plan plan = make_plan({2, 2, 2, 2}, 4, mode, kind);
      plan.stages_per_device = 2;
      check_plan(plan, p, hw, "plan");
      const auto r = Simulator(p, hw).run(plan);
      std::vector<std::int64_t> out;
      for (const auto& d : r.devices) out.push_back(d.memory.back().value);
      return out;
    };
    EXPECT_EQ(final_levels(ScheduleKind::InterleavedZB),
              final_levels(ScheduleKind::Interleaved1F1B))
        << to_string(mode);
  }
}

TEST(ScheduleSweep, MultiStagePointsHaveTwoStagesPerDeviceAndSkipWhatTorchRefuses) {
  const Profile p = testing::uniform_profile(8, 1.0, 2.0, 20);
  const Hardware hw = replicate_device(p.device, 2);
  SweepSpec spec;
  spec.device_counts = {2};
  spec.chunks = {4, 5};  // 5 micro-batches on 2 devices: rounds of 2 do not divide them
  spec.checkpoints = {CheckpointMode::Never};
  spec.schedules = {ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B, ScheduleKind::ZBV};
  const auto rows = run_sweep(p, hw, spec);
  std::vector<std::string> seen;
  for (const auto& row : rows) {
    seen.push_back(fmt::format("{} x{}", to_string(row.plan.schedule), row.plan.chunks));
    const int v = is_multi_stage(row.plan.schedule) ? 2 : 1;
    EXPECT_EQ(row.plan.stages_per_device, v);
    EXPECT_EQ(row.plan.stages(), 2 * v);
    // The sweep's numbers are the simulator's for that plan.
    EXPECT_DOUBLE_EQ(row.iteration_ms, Simulator(p, hw).run(row.plan).iteration_ms);
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"1f1b x4", "1f1b x5", "interleaved-1f1b x4", "zbv x4",
                                            "zbv x5"}));
}

}  // namespace
}  // namespace pipetune
