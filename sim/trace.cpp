#include "sim/trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "sim/error.hpp"
#include "sim/file_io.hpp"
#include "sim/json_reader.hpp"
#include "sim/limits.hpp"

namespace pipetune {

namespace {

using json_reader::Node;
using nlohmann::json;
using nlohmann::ordered_json;

std::string json_quoted(std::string_view s) {
  return json(s).dump();
}

std::string_view category(TaskKind kind) {
  switch (kind) {
    case TaskKind::Forward:
      return "forward";
    case TaskKind::Recompute:
      return "recompute";
    case TaskKind::Backward:
      return "backward";
    case TaskKind::InputGrad:
      return "backward_input";
    case TaskKind::WeightGrad:
      return "backward_weight";
    case TaskKind::SendActivation:
    case TaskKind::SendGradient:
      break;
  }
  return "copy";
}

// The compute task that consumes a copy: the next stage's forward, or the previous stage's
// backward (B or I, both keyed as B). Keyed by (kind, stage, micro-batch, step).
using StepTaskKey = std::tuple<TaskKind, int, int, int>;
StepTaskKey consumer_of(const TraceTask& copy) {
  if (copy.kind == TaskKind::SendActivation) {
    return {TaskKind::Forward, copy.stage + 1, copy.micro_batch, copy.step};
  }
  return {TaskKind::Backward, copy.stage - 1, copy.micro_batch, copy.step};
}

// Stages, micro-batches and steps are ints. The bound rejects values that would wrap in the
// cast and keeps stage + 1 (the consumer of a copy) defined.
int count_field(const Node& node) {
  const auto v = node.non_negative_integer();
  if (v > 1'000'000'000) node.fail("a non-negative integer up to 1000000000");
  return static_cast<int>(v);
}

// A step runs each task once: `event_of_task` keeps the path of each task's event so far.
void refuse_repeated_task(std::map<StepTaskKey, std::string>& event_of_task, const TraceTask& task,
                          const Node& event) {
  const auto [first, inserted] = event_of_task.emplace(
      StepTaskKey{task.kind, task.stage, task.micro_batch, task.step}, event.path());
  if (!inserted) {
    event.fail_message(
        fmt::format("expected each task once a step, got {} of step {} again (first at {})",
                    task.label(), task.step, first->second));
  }
}

ordered_json summary_json(const Trace& t) {
  ordered_json devices = ordered_json::array();
  for (const auto& d : t.devices) {
    ordered_json device = {{"name", d.name},
                           {"stages", d.stages},
                           {"busy_ms", d.busy_ms},
                           {"peak_memory_bytes", d.peak_memory_bytes},
                           {"memory_capacity_bytes", d.memory_capacity_bytes}};
    if (d.worst_order_peak_bytes > 0) device["worst_order_peak_bytes"] = d.worst_order_peak_bytes;
    devices.push_back(std::move(device));
  }
  return {{"iteration_ms", t.iteration_ms},
          {"throughput_samples_per_s", t.throughput_samples_per_s},
          {"bubble_fraction", t.bubble_fraction},
          {"devices", std::move(devices)}};
}

}  // namespace

std::string TraceTask::label() const {
  return task_label(kind, stage, micro_batch);
}

double cpu_share(const std::vector<TraceTask>& tasks) {
  double cpu = 0.0, wall = 0.0;
  bool any = false;
  for (const TraceTask& t : tasks) {
    if (t.cpu_ms < 0) continue;
    any = true;
    cpu += t.cpu_ms;
    wall += t.duration_ms();
  }
  if (!any) return -1.0;
  return wall > 0 ? cpu / wall : 1.0;
}

TaskSpan task_span(const std::vector<TraceTask>& tasks) {
  if (tasks.empty()) return {};
  TaskSpan span{tasks.front().start_ms, tasks.front().end_ms};
  for (const auto& t : tasks) {
    span.start_ms = std::min(span.start_ms, t.start_ms);
    span.end_ms = std::max(span.end_ms, t.end_ms);
  }
  return span;
}

std::vector<int> trace_steps(const Trace& trace) {
  std::set<int> steps;
  for (const auto& t : trace.tasks) steps.insert(t.step);
  return {steps.begin(), steps.end()};
}

namespace {

// Stages and micro-batches are at most 10^9 (the loader's bound): 32 bits each; the kind in 4.
std::uint64_t packed(const TaskKey& key) {
  return (static_cast<std::uint64_t>(key.stage) << 36) |
         (static_cast<std::uint64_t>(key.micro_batch) << 4) | static_cast<std::uint64_t>(key.kind);
}

}  // namespace

StepTasks::StepTasks(const std::vector<TraceTask>& tasks, int step, const std::string& source) {
  for (std::size_t k = 0; k < tasks.size(); ++k) {
    const TraceTask& t = tasks[k];
    if (t.step != step) continue;
    const auto [it, inserted] =
        position_of_.emplace(packed(TaskKey::of(t)), static_cast<int>(indices_.size()));
    if (!inserted) {
      throw InputError(
          fmt::format("{}: task {} appears twice in step {}; a step runs each task once", source,
                      t.label(), step));
    }
    const double start = indices_.empty() ? t.start_ms : std::min(span_.start_ms, t.start_ms);
    const double end = indices_.empty() ? t.end_ms : std::max(span_.end_ms, t.end_ms);
    span_ = {start, end};
    indices_.push_back(static_cast<int>(k));
  }
}

int StepTasks::find(const TaskKey& key) const {
  const auto it = position_of_.find(packed(key));
  return it == position_of_.end() ? -1 : it->second;
}

StepTasks only_step(const Trace& trace, const std::string& source) {
  const std::vector<int> steps = trace_steps(trace);
  if (steps.size() > 1) {
    throw InputError(
        fmt::format("{}: holds {} training steps ({} to {}); expected a trace of one step", source,
                    steps.size(), steps.front(), steps.back()));
  }
  return StepTasks(trace.tasks, steps.empty() ? 0 : steps.front(), source);
}

std::function<std::optional<std::pair<double, double>>(const SimTask&)> measured_task_times(
    const Trace& measured, const std::string& source) {
  return [&measured, step = only_step(measured, source)](
             const SimTask& t) -> std::optional<std::pair<double, double>> {
    const int k = step.find(TaskKey::of(t));
    if (k < 0) return std::nullopt;
    const TraceTask& task = measured.tasks[static_cast<std::size_t>(step.indices()[k])];
    return std::make_pair(task.start_ms, task.end_ms);
  };
}

TaskMatching match_tasks(const Trace& predicted, const Trace& measured,
                         const std::string& measured_source) {
  const StepTasks predicted_step = only_step(predicted, "the prediction");
  const StepTasks measured_step = only_step(measured, measured_source);
  TaskMatching matching;
  std::size_t matched = 0;
  for (int p : predicted_step.indices()) {
    const int m = measured_step.find(TaskKey::of(predicted.tasks[p]));
    if (m < 0) continue;
    matching.pairs.emplace_back(p, measured_step.indices()[m]);
    ++matched;
  }
  matching.unmatched =
      predicted_step.indices().size() + measured_step.indices().size() - 2 * matched;
  return matching;
}

Trace trace_from_simulation(const SimulationResult& result, const std::string& model) {
  Trace trace;
  trace.kind = "predicted";
  trace.model = model;
  trace.plan = result.plan;
  trace.micro_batch_sizes = result.micro_batch_sizes;
  trace.iteration_ms = result.iteration_ms;
  trace.throughput_samples_per_s = result.throughput_samples_per_s;
  trace.bubble_fraction = result.bubble_fraction;
  // Trace pids count only the devices that hold stages.
  std::map<int, int> pid_of;
  for (const auto& d : result.devices) {
    pid_of[d.index] = static_cast<int>(trace.devices.size());
    trace.devices.push_back({d.name, d.stages, d.busy_ms, d.peak_memory_bytes,
                             d.memory_capacity_bytes, d.memory, d.worst_order_peak_bytes});
  }
  for (const auto& t : result.tasks) {
    TraceTask task;
    task.kind = t.kind;
    task.stage = t.stage;
    task.micro_batch = t.micro_batch;
    task.device = pid_of.at(t.device);
    task.peer = t.peer >= 0 ? pid_of.at(t.peer) : -1;
    task.start_ms = t.start_ms;
    task.end_ms = t.end_ms;
    task.bytes = t.bytes;
    task.launch_start_ms = t.launch_start_ms;
    task.launch_end_ms = t.launch_end_ms;
    trace.tasks.push_back(task);
  }
  return trace;
}

namespace {

// Appends trace events to a JSON array's text, a comma between each.
class EventList {
 public:
  explicit EventList(std::string& out) : out_(out) {}
  void operator()(const std::string& e) {
    if (!first_) out_ += ",\n";
    out_ += e;
    first_ = false;
  }

 private:
  std::string& out_;
  bool first_ = true;
};

// Each device's process and its threads' names: compute, and a copy stream per receiver.
void name_devices_and_streams(const Trace& trace, EventList& event) {
  // Which copy streams each device has, to name them.
  std::vector<std::vector<int>> copy_targets(trace.devices.size());
  for (const auto& t : trace.tasks) {
    if (!is_compute(t.kind)) {
      auto& v = copy_targets[t.device];
      if (std::find(v.begin(), v.end(), t.peer) == v.end()) v.push_back(t.peer);
    }
  }
  for (std::size_t p = 0; p < trace.devices.size(); ++p) {
    event(fmt::format(R"({{"ph":"M","pid":{},"name":"process_name","args":{{"name":{}}}}})", p,
                      json_quoted(trace.devices[p].name)));
    event(fmt::format(
        R"({{"ph":"M","pid":{},"name":"process_sort_index","args":{{"sort_index":{}}}}})", p, p));
    event(fmt::format(
        R"({{"ph":"M","pid":{},"tid":0,"name":"thread_name","args":{{"name":"compute"}}}})", p));
    auto targets = copy_targets[p];
    std::sort(targets.begin(), targets.end());
    for (int peer : targets) {
      event(
          fmt::format(R"({{"ph":"M","pid":{},"tid":{},"name":"thread_name","args":{{"name":{}}}}})",
                      p, 1 + peer, json_quoted("copy to " + trace.devices[peer].name)));
    }
  }
}

// Task k's span, its args and its flow arrow (a copy's out, its consumer's in).
std::string task_event(const Trace& trace, std::size_t k,
                       const std::map<StepTaskKey, std::size_t>& flow_into) {
  const TraceTask& t = trace.tasks[k];
  std::string args = fmt::format(R"("stage":{},"micro_batch":{})", t.stage, t.micro_batch);
  if (t.step != 0) args += fmt::format(R"(,"step":{})", t.step);
  if (t.launch_start_ms >= 0) {
    args += fmt::format(R"(,"launch_start_ms":{:.6f},"launch_end_ms":{:.6f})", t.launch_start_ms,
                        t.launch_end_ms);
  }
  if (t.cpu_ms >= 0) args += fmt::format(R"(,"cpu_ms":{:.6f})", t.cpu_ms);
  std::string flow;
  if (!is_compute(t.kind)) {
    args += fmt::format(R"(,"direction":"{}","to":{},"bytes":{})",
                        t.kind == TaskKind::SendActivation ? "activation" : "gradient", t.peer,
                        t.bytes);
    flow = fmt::format(R"(,"bind_id":"0x{:x}","flow_out":true)", k + 1);
  } else if (auto it = flow_into.find({t.kind == TaskKind::InputGrad ? TaskKind::Backward : t.kind,
                                       t.stage, t.micro_batch, t.step});
             it != flow_into.end()) {
    flow = fmt::format(R"(,"bind_id":"0x{:x}","flow_in":true)", it->second);
  }
  return fmt::format(
      R"({{"ph":"X","pid":{},"tid":{},"name":{},"cat":"{}","ts":{:.3f},"dur":{:.3f},"args":{{{}}}{}}})",
      t.device, t.stream(), json_quoted(t.label()), category(t.kind), t.start_ms * 1e3,
      t.duration_ms() * 1e3, args, flow);
}

}  // namespace

std::string trace_to_json(const Trace& trace) {
  ordered_json meta = ordered_json::object();
  meta["format"] = kTraceFormat;
  meta["kind"] = trace.kind;
  meta["model"] = trace.model;
  if (trace.plan) meta["plan"] = ordered_json::parse(plan_to_json(*trace.plan));
  meta["micro_batch_sizes"] = trace.micro_batch_sizes;
  meta["summary"] = summary_json(trace);

  std::string out;
  out.reserve(256 + trace.tasks.size() * 160);
  out += "{\"displayTimeUnit\":\"ms\",\n\"pipetune\":";
  out += meta.dump();
  out += ",\n\"traceEvents\":[\n";
  EventList event(out);

  name_devices_and_streams(trace, event);

  // Flow arrows join each copy to the task that consumes it.
  std::map<StepTaskKey, std::size_t> flow_into;
  for (std::size_t k = 0; k < trace.tasks.size(); ++k) {
    if (!is_compute(trace.tasks[k].kind)) flow_into[consumer_of(trace.tasks[k])] = k + 1;
  }
  for (std::size_t k = 0; k < trace.tasks.size(); ++k) {
    event(task_event(trace, k, flow_into));
  }
  for (std::size_t p = 0; p < trace.devices.size(); ++p) {
    for (const auto& sample : trace.devices[p].memory) {
      event(fmt::format(
          R"({{"ph":"C","pid":{},"name":"memory","ts":{:.3f},"args":{{"allocated":{}}}}})", p,
          sample.time * 1e3, sample.value));
    }
  }
  out += "\n]}\n";
  return out;
}

namespace {

// The "pipetune" object's format, kind, model, plan and sizes.
void read_trace_meta(const Node& meta, const std::string& source, Trace& trace) {
  json_reader::check_format(meta, kTraceFormat);
  const Node kind = meta.field("kind");
  trace.kind = kind.value().is_string() ? kind.string() : "";
  if (trace.kind != "predicted" && trace.kind != "measured") {
    kind.fail("\"predicted\" or \"measured\"");
  }
  trace.model = meta.field("model").string();
  if (auto plan = meta.optional_field("plan")) {
    trace.plan = parse_plan(plan->value().dump(), source + ": " + plan->path());
  }
  if (auto sizes = meta.optional_field("micro_batch_sizes")) {
    for (const Node& s : sizes->elements()) trace.micro_batch_sizes.push_back(s.positive_integer());
  }
}

// The summary: the step's figures and each device's.
void read_trace_summary(const Node& summary, Trace& trace) {
  trace.iteration_ms = summary.field("iteration_ms").non_negative_number();
  trace.throughput_samples_per_s = summary.field("throughput_samples_per_s").non_negative_number();
  trace.bubble_fraction = summary.field("bubble_fraction").number();
  const Node summary_devices = summary.field("devices");
  if (summary_devices.value().is_array() &&
      summary_devices.value().size() > static_cast<std::size_t>(limits::kMaxDevices)) {
    summary_devices.fail("at most 1024 devices");
  }
  for (const Node& d : summary_devices.elements()) {
    TraceDevice device;
    device.name = d.field("name").string();
    for (const Node& s : d.field("stages").elements()) {
      device.stages.push_back(count_field(s));
    }
    device.busy_ms = d.field("busy_ms").non_negative_number();
    device.peak_memory_bytes = d.field("peak_memory_bytes").non_negative_integer();
    device.memory_capacity_bytes = d.field("memory_capacity_bytes").bytes();
    if (auto worst = d.optional_field("worst_order_peak_bytes")) {
      device.worst_order_peak_bytes = worst->non_negative_integer();
    }
    trace.devices.push_back(std::move(device));
  }
}

// An event's pid: one of the summary's devices.
int device_pid(const Node& e, int device_count) {
  const Node pid = e.field("pid");
  const auto p = pid.non_negative_integer();
  if (p >= device_count) {
    pid.fail(fmt::format("a device pid below {} (the summary lists {} devices)", device_count,
                         device_count));
  }
  return static_cast<int>(p);
}

// A span's task kind by its category ("copy": a send, its direction read later); none for
// someone else's event.
std::optional<TaskKind> task_kind_of_category(const std::string& cat) {
  if (cat == "forward") return TaskKind::Forward;
  if (cat == "recompute") return TaskKind::Recompute;
  if (cat == "backward") return TaskKind::Backward;
  if (cat == "backward_input") return TaskKind::InputGrad;
  if (cat == "backward_weight") return TaskKind::WeightGrad;
  if (cat == "copy") return TaskKind::SendActivation;
  return std::nullopt;
}

// A copy's direction, receiver and bytes.
void read_copy_args(const Node& args, int device_count, TraceTask& task) {
  const Node direction = args.field("direction");
  const std::string d = direction.string();
  if (d == "gradient") {
    task.kind = TaskKind::SendGradient;
  } else if (d != "activation") {
    direction.fail("\"activation\" or \"gradient\"");
  }
  const Node to = args.field("to");
  const auto peer = to.non_negative_integer();  // compared before the cast can wrap it
  if (peer >= device_count) to.fail(fmt::format("a device pid below {}", device_count));
  task.peer = static_cast<int>(peer);
  task.bytes = args.field("bytes").bytes();
}

// A task's span ("ph": "X") and its args.
TraceTask read_task_span(const Node& e, TaskKind kind, int device_count) {
  TraceTask task;
  task.kind = kind;
  task.device = device_pid(e, device_count);
  const double ts = e.field("ts").non_negative_number();
  const double dur = e.field("dur").non_negative_number();
  // Each is finite, their sum need not be; an infinite end would be written as "inf".
  if (!std::isfinite(ts + dur)) {
    e.fail_message(fmt::format("expected ts + dur to be a finite time, got {} + {}", ts, dur));
  }
  task.start_ms = ts / 1e3;
  task.end_ms = (ts + dur) / 1e3;
  const Node args = e.field("args");
  task.stage = count_field(args.field("stage"));
  task.micro_batch = count_field(args.field("micro_batch"));
  if (auto step = args.optional_field("step")) task.step = count_field(*step);
  if (auto launch = args.optional_field("launch_start_ms")) {
    task.launch_start_ms = launch->non_negative_number();
    task.launch_end_ms = args.field("launch_end_ms").non_negative_number();
    if (task.launch_end_ms < task.launch_start_ms) {
      e.fail_message(fmt::format("expected launch_end_ms {} to be at least launch_start_ms {}",
                                 task.launch_end_ms, task.launch_start_ms));
    }
  }
  if (auto cpu = args.optional_field("cpu_ms")) task.cpu_ms = cpu->non_negative_number();
  if (task.kind == TaskKind::SendActivation) read_copy_args(args, device_count, task);
  return task;
}

}  // namespace

Trace parse_trace(std::string_view text, const std::string& source) {
  const json document = json_reader::parse_document(text, source);
  const Node root(document, source);
  if (!document.is_object()) root.fail("a JSON object with \"traceEvents\"");

  Trace trace;
  const Node meta = root.field("pipetune");
  read_trace_meta(meta, source, trace);
  read_trace_summary(meta.field("summary"), trace);
  const int device_count = static_cast<int>(trace.devices.size());
  std::map<StepTaskKey, std::string> event_of_task;
  for (const Node& e : root.field("traceEvents").elements()) {
    const std::string phase = e.field("ph").string();
    if (phase == "X") {
      const auto kind = task_kind_of_category(e.field("cat").string());
      if (!kind) continue;  // someone else's event: keep the trace readable, ignore it
      const TraceTask task = read_task_span(e, *kind, device_count);
      refuse_repeated_task(event_of_task, task, e);
      trace.tasks.push_back(task);
    } else if (phase == "C") {
      if (e.field("name").string() != "memory") continue;
      const int p = device_pid(e, device_count);
      const double ts = e.field("ts").non_negative_number();
      const auto bytes = e.field("args").field("allocated").non_negative_integer();
      trace.devices[p].memory.push_back({ts / 1e3, bytes});
    }
  }
  for (auto& d : trace.devices) {
    std::stable_sort(
        d.memory.begin(), d.memory.end(),
        [](const CounterSample& a, const CounterSample& b) { return a.time < b.time; });
  }
  return trace;
}

Trace load_trace(const std::string& path) {
  return parse_trace(read_text_file(path), path);
}

void save_trace(const Trace& trace, const std::string& path) {
  write_text_file_atomically(path, trace_to_json(trace));
}

}  // namespace pipetune
