// Predicted traces: valid Chrome trace JSON that round-trips through our reader.

#include "sim/trace.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "sim/error.hpp"
#include "tests/sim/fixtures.hpp"

namespace pipetune {
namespace {

Trace predicted(bool worst_order_peaks = false) {
  static const Profile profile = [] {
    testing::LayerSpec a{1.0, 2.0, 1000, 100, 50, 0};
    return testing::make_profile({a, a, a}, 4, 10);
  }();
  Hardware hw = replicate_device(profile.device, 3);
  hw.link.bandwidth_bytes_per_s = 1e5;
  SimulationOptions options;
  options.worst_order_peaks = worst_order_peaks;
  const auto r = Simulator(profile, hw)
                     .run(testing::make_plan({1, 1, 1}, 4, CheckpointMode::ExceptLast), options);
  return trace_from_simulation(r, profile.model);
}

TEST(Trace, IsChromeTraceJsonWithNamedProcessesAndThreads) {
  const auto doc = nlohmann::json::parse(trace_to_json(predicted()));
  ASSERT_TRUE(doc["traceEvents"].is_array());
  EXPECT_EQ(doc["displayTimeUnit"], "ms");
  EXPECT_EQ(doc["pipetune"]["kind"], "predicted");
  std::map<std::string, int> phases;
  int flows_out = 0, flows_in = 0;
  for (const auto& e : doc["traceEvents"]) {
    phases[e["ph"]]++;
    if (e.value("flow_out", false)) ++flows_out;
    if (e.value("flow_in", false)) ++flows_in;
    if (e["ph"] == "X") {
      EXPECT_TRUE(e["args"].contains("stage"));
      EXPECT_GE(e["dur"].get<double>(), 0.0);
    }
  }
  // 3 devices: process name and sort index each; compute thread each; copy threads 0->1, 1->0,
  // 1->2, 2->1.
  EXPECT_EQ(phases["M"], 3 * 3 + 4);
  // 3 stages x 4 micro-batches x (F, B) + 3 recomputes per stage + 2 x 2 x 4 copies.
  EXPECT_EQ(phases["X"], 24 + 9 + 16);
  EXPECT_GT(phases["C"], 0);
  EXPECT_EQ(flows_out, 16);
  EXPECT_EQ(flows_in, 16);
}

TEST(Trace, EventsOnOneThreadNeverOverlap) {
  const Trace t = predicted();
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> threads;
  for (const auto& task : t.tasks)
    threads[{task.device, task.stream()}].push_back({task.start_ms, task.end_ms});
  for (auto& [key, spans] : threads) {
    std::sort(spans.begin(), spans.end());
    for (std::size_t k = 1; k < spans.size(); ++k)
      EXPECT_LE(spans[k - 1].second, spans[k].first + 1e-9);
  }
}

TEST(Trace, RoundTrips) {
  const Trace t = predicted();
  const Trace again = parse_trace(trace_to_json(t), "trace.json");
  EXPECT_EQ(again.kind, "predicted");
  EXPECT_EQ(again.model, t.model);
  ASSERT_TRUE(again.plan);
  EXPECT_EQ(*again.plan, *t.plan);
  EXPECT_NEAR(again.iteration_ms, t.iteration_ms, 1e-9);
  ASSERT_EQ(again.tasks.size(), t.tasks.size());
  for (std::size_t k = 0; k < t.tasks.size(); ++k) {
    EXPECT_EQ(again.tasks[k].label(), t.tasks[k].label());
    EXPECT_EQ(again.tasks[k].kind, t.tasks[k].kind);
    EXPECT_EQ(again.tasks[k].device, t.tasks[k].device);
    EXPECT_EQ(again.tasks[k].peer, t.tasks[k].peer);
    EXPECT_NEAR(again.tasks[k].start_ms, t.tasks[k].start_ms, 1e-6);  // written in ns
    EXPECT_NEAR(again.tasks[k].end_ms, t.tasks[k].end_ms, 2e-6);
  }
  ASSERT_EQ(again.devices.size(), 3u);
  EXPECT_EQ(again.devices[1].peak_memory_bytes, t.devices[1].peak_memory_bytes);
  EXPECT_EQ(again.devices[1].memory.size(), t.devices[1].memory.size());
  EXPECT_EQ(again.devices[1].worst_order_peak_bytes, 0);  // not asked for: not written
}

TEST(Trace, KeepsTheWorstOrdersPeakWhenItIsKnown) {
  const Trace t = predicted(true);
  const Trace again = parse_trace(trace_to_json(t), "trace.json");
  ASSERT_EQ(again.devices.size(), 3u);
  for (std::size_t d = 0; d < 3; ++d) {
    EXPECT_GE(t.devices[d].worst_order_peak_bytes, t.devices[d].peak_memory_bytes);
    EXPECT_EQ(again.devices[d].worst_order_peak_bytes, t.devices[d].worst_order_peak_bytes);
  }
}

// A profile with launch times: each compute task carries its launch's span, which round-trips;
// a device task never starts before its launch did nor ends before it ended. One stage whose
// backwards the host launches slower than the device runs them (simulator_test.cpp has the same
// case timed by hand): GPipe runs the backwards last micro-batch first, so backward 0 is
// launched over [13, 16] and runs over [13, 16].
TEST(Trace, CarriesEachTasksLaunchWhereTheProfileHasLaunchTimes) {
  Profile profile = testing::make_profile({{2.0, 1.0, 0, 0, 0, 0}}, 4);
  for (auto& l : profile.layers) {
    l.forward_launch_ms.assign(profile.micro_batch_sizes.size(), 1.0);
    l.backward_launch_ms.assign(profile.micro_batch_sizes.size(), 3.0);
  }
  const auto r = Simulator(profile, replicate_device(profile.device, 1))
                     .run(testing::make_plan({1}, 4, CheckpointMode::Never));
  const Trace t = trace_from_simulation(r, profile.model);
  const Trace again = parse_trace(trace_to_json(t), "trace.json");
  ASSERT_EQ(again.tasks.size(), t.tasks.size());
  for (std::size_t k = 0; k < t.tasks.size(); ++k) {
    const TraceTask& task = again.tasks[k];
    EXPECT_NEAR(task.launch_start_ms, t.tasks[k].launch_start_ms, 1e-6);
    EXPECT_NEAR(task.launch_end_ms, t.tasks[k].launch_end_ms, 1e-6);
    EXPECT_GE(task.start_ms, task.launch_start_ms - 1e-6) << task.label();
    EXPECT_GE(task.end_ms, task.launch_end_ms - 1e-6) << task.label();
    if (task.label() == "0B0") {
      EXPECT_NEAR(task.launch_start_ms, 13.0, 1e-6);
      EXPECT_NEAR(task.end_ms, 16.0, 1e-6);
    }
  }
  // Without launch times there is none.
  for (const TraceTask& task : predicted().tasks) EXPECT_EQ(task.launch_start_ms, -1.0);
}

TEST(Trace, BadInput) {
  auto error = [](const std::string& text) -> std::string {
    try {
      parse_trace(text, "t.json");
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error(R"({"traceEvents": []})"), "t.json: missing field \"pipetune\"");
  const std::string head =
      R"({"pipetune": {"format": "pipetune.trace/1", "kind": "measured", "model": "m",
      "summary": {"iteration_ms": 1, "throughput_samples_per_s": 1, "bubble_fraction": 0,
      "devices": [{"name": "d", "stages": [0], "busy_ms": 1, "peak_memory_bytes": 0,
      "memory_capacity_bytes": 0}]}}, "traceEvents": [)";
  EXPECT_EQ(error(head + R"({"ph": "X", "cat": "forward", "pid": 3, "tid": 0, "ts": 0, "dur": 1,
      "args": {"stage": 0, "micro_batch": 0}}]})"),
            "t.json: traceEvents[0].pid: expected a device pid below 1 (the summary lists 1 "
            "devices), got 3");
  EXPECT_EQ(error(head + R"({"ph": "X", "cat": "forward", "pid": 0, "tid": 0, "ts": 0, "dur": -1,
      "args": {"stage": 0, "micro_batch": 0}}]})"),
            "t.json: traceEvents[0].dur: expected a non-negative number, got -1");
  EXPECT_EQ(
      error(head + R"({"ph": "X", "cat": "forward", "pid": 0, "tid": 0, "ts": 0, "dur": 1,
      "args": {"stage": 0, "micro_batch": 0, "launch_start_ms": 0.5, "launch_end_ms": 0.25}}]})"),
      "t.json: traceEvents[0]: expected launch_end_ms 0.25 to be at least launch_start_ms 0.5");
  EXPECT_EQ(error(head + R"({"ph": "X", "cat": "user", "pid": 9}]})"), "");  // not ours: ignored
}

}  // namespace
}  // namespace pipetune

#include "sim/replay.hpp"

namespace pipetune {
namespace {

// Replaying a prediction's own task durations reproduces its iteration time: the replay runs
// the same programme on the same engine.
TEST(Replay, OfAPredictionReproducesIt) {
  for (auto kind : kSingleStageScheduleKinds) {
    for (auto mode : kAllCheckpointModes) {
      testing::LayerSpec a{1.0, 2.0, 1000, 100, 50, 0}, b{0.5, 3.0, 0, 300, 10, 0};
      const Profile profile = testing::make_profile({a, b, a, b}, 8, 10);
      Hardware hw = replicate_device(profile.device, 2);
      hw.link.bandwidth_bytes_per_s = 1e5;
      Plan plan = testing::make_plan({1, 2, 1}, 3, mode, kind);
      plan.devices = {"cpu:0", "cpu:1", "cpu:0"};
      const auto r = Simulator(profile, hw).run(plan);
      const Trace trace = parse_trace(trace_to_json(trace_from_simulation(r, "m")), "t.json");
      const ReplayResult replay = replay_trace(trace, "t.json");
      EXPECT_NEAR(replay.iteration_ms, r.iteration_ms, 1e-5) << describe_plan(plan);
      EXPECT_EQ(replay.tasks, r.tasks.size());
    }
  }
}

// A task's CPU time survives the file, and only the tasks that have one carry it.
TEST(Trace, CpuTimesRoundTripWhereMeasured) {
  Trace t = predicted();
  int carried = 0;
  for (TraceTask& task : t.tasks) {
    if (is_compute(task.kind) && task.stage == 1) {
      task.cpu_ms = 0.25 * task.duration_ms();
      ++carried;
    }
  }
  ASSERT_GT(carried, 0);
  const Trace back = parse_trace(trace_to_json(t), "t.json");
  ASSERT_EQ(back.tasks.size(), t.tasks.size());
  std::map<std::string, double> cpu;
  for (const TraceTask& task : t.tasks) cpu[task.label()] = task.cpu_ms;
  for (const TraceTask& task : back.tasks) {
    if (cpu.at(task.label()) < 0) {
      EXPECT_EQ(task.cpu_ms, -1.0) << task.label();
    } else {
      EXPECT_NEAR(task.cpu_ms, cpu.at(task.label()), 1e-6) << task.label();
    }
  }
  std::string json = trace_to_json(t);
  const std::string field = "\"cpu_ms\":";
  json.replace(json.find(field), field.size(), field + "-");
  try {
    parse_trace(json, "t.json");
    FAIL() << "a negative CPU time was read";
  } catch (const InputError& e) {
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("cpu_ms: expected a non-negative"));
  }
}

TEST(Trace, CpuShareIsTheCpuTimeOverTheDurationsOfTheTasksThatHaveOne) {
  std::vector<TraceTask> tasks(3);
  tasks[0].end_ms = 2.0;
  tasks[0].cpu_ms = 1.0;
  tasks[1].start_ms = 2.0;
  tasks[1].end_ms = 8.0;
  tasks[1].cpu_ms = 5.0;
  tasks[2].end_ms = 100.0;  // none: left out
  EXPECT_DOUBLE_EQ(cpu_share(tasks), 6.0 / 8.0);
  tasks[0].cpu_ms = tasks[1].cpu_ms = -1.0;
  EXPECT_EQ(cpu_share(tasks), -1.0);
}

// On one device the step is its tasks one after another: replayed at CPU times it takes their
// sum, the tasks without one at their whole duration.
TEST(Replay, AtCpuTimesOnOneDeviceIsTheirSum) {
  testing::LayerSpec a{1.0, 2.0, 1000, 100, 50, 0};
  const Profile profile = testing::make_profile({a, a}, 4, 10);
  const Plan plan = testing::make_plan({2}, 4, CheckpointMode::Never);
  const auto r = Simulator(profile, replicate_device(profile.device, 1)).run(plan);
  Trace t = trace_from_simulation(r, "m");
  EXPECT_EQ(replay_on_cpu_ms(t, "t.json"), -1.0);
  double expected = 0.0, wall = 0.0;
  for (const TraceTask& task : t.tasks) wall += task.duration_ms();
  EXPECT_NEAR(r.iteration_ms, wall, 1e-6);  // one device: no gaps
  for (std::size_t k = 0; k < t.tasks.size(); ++k) {
    TraceTask& task = t.tasks[k];
    if (k % 2 == 0) task.cpu_ms = 0.5 * task.duration_ms();
    if (k == 2) task.cpu_ms = 10.0 * task.duration_ms();  // above its wall time: its wall time
    expected += k == 2 || k % 2 != 0 ? task.duration_ms() : task.cpu_ms;
  }
  EXPECT_NEAR(replay_on_cpu_ms(t, "t.json"), expected, 1e-6);
}

TEST(Replay, MissingTaskIsReported) {
  Trace t = predicted();
  t.tasks.erase(t.tasks.begin());
  try {
    replay_trace(t, "m.json");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("m.json: the trace has no 0F0 task"));
  }
}

// Replay is of one step: a trace of two steps used to replay a mix of them (each task's last
// copy), a task twice in a step the second copy.
TEST(Replay, TwoStepsOrATaskTwiceAreRefused) {
  Trace two_steps = predicted();
  for (TraceTask t : predicted().tasks) {
    t.step = 1;
    two_steps.tasks.push_back(t);
  }
  try {
    replay_trace(two_steps, "m.json");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("m.json: holds 2 training steps"));
  }
  Trace twice = predicted();
  twice.tasks.push_back(twice.tasks.front());
  try {
    replay_trace(twice, "m.json");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("appears twice in step"));
  }
}

}  // namespace
}  // namespace pipetune
