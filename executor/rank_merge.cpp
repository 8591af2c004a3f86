#include "executor/rank_merge.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>
#include <nlohmann/json.hpp>

#include "executor/executor.hpp"
#include "sim/error.hpp"
#include "sim/json_reader.hpp"

namespace pipetune::exec {

namespace {

constexpr std::array kTaskKinds{
    TaskKind::Forward,      TaskKind::Recompute, TaskKind::Backward,  TaskKind::SendActivation,
    TaskKind::SendGradient, TaskKind::InputGrad, TaskKind::WeightGrad};

TaskKind task_kind(const json_reader::Node& node) {
  const std::string name = node.string();
  for (TaskKind kind : kTaskKinds) {
    if (to_string(kind) == name) return kind;
  }
  node.fail("a task kind such as \"forward\" or \"send_activation\"");
}

int int_field(const json_reader::Node& node, std::string_view key) {
  const json_reader::Node field = node.field(key);
  const std::int64_t value = field.integer();
  if (value < -1 || value > std::numeric_limits<int>::max()) {
    field.fail("an index (or -1 for none)");
  }
  return static_cast<int>(value);
}

TraceTask decode_task(const json_reader::Node& node) {
  node.allow_only(
      {"kind", "stage", "micro_batch", "device", "peer", "bytes", "start_ms", "end_ms", "cpu_ms"});
  TraceTask t;
  t.kind = task_kind(node.field("kind"));
  t.stage = int_field(node, "stage");
  t.micro_batch = int_field(node, "micro_batch");
  t.device = int_field(node, "device");
  t.peer = int_field(node, "peer");
  t.bytes = node.field("bytes").non_negative_integer();
  t.start_ms = node.field("start_ms").number();
  t.end_ms = node.field("end_ms").number();
  if (auto cpu = node.optional_field("cpu_ms")) t.cpu_ms = cpu->non_negative_number();
  return t;
}

// Work that began at `from` on rank 0's clock, moved to a clock whose origin is `to`.
double shifted(double ms, double from, double to) {
  return ms + (from - to);
}

}  // namespace

RankPart rank_part(const StepRecord& record, int rank, double origin_ms) {
  RankPart part;
  part.origin_ms = origin_ms;
  part.loss = record.loss;
  part.step_ms = record.step_ms;
  part.peak_memory_bytes = record.peak_memory_bytes.at(static_cast<std::size_t>(rank));
  part.library_memory_bytes = record.library_memory_bytes.at(static_cast<std::size_t>(rank));
  part.tasks = record.tasks;
  if (static_cast<int>(record.memory.size()) > rank) part.memory = record.memory[rank];
  return part;
}

std::string encode_rank_part(const RankPart& part) {
  nlohmann::json out;
  out["origin_ms"] = part.origin_ms;
  out["loss"] = part.loss;
  out["step_ms"] = part.step_ms;
  out["peak_memory_bytes"] = part.peak_memory_bytes;
  out["library_memory_bytes"] = part.library_memory_bytes;
  auto& tasks = out["tasks"] = nlohmann::json::array();
  for (const auto& t : part.tasks) {
    tasks.push_back({{"kind", std::string(to_string(t.kind))},
                     {"stage", t.stage},
                     {"micro_batch", t.micro_batch},
                     {"device", t.device},
                     {"peer", t.peer},
                     {"bytes", t.bytes},
                     {"start_ms", t.start_ms},
                     {"end_ms", t.end_ms}});
    if (t.cpu_ms >= 0) tasks.back()["cpu_ms"] = t.cpu_ms;
  }
  auto& memory = out["memory"] = nlohmann::json::array();
  for (const auto& sample : part.memory) {
    memory.push_back({{"time_ms", sample.time}, {"bytes", sample.value}});
  }
  return out.dump();
}

RankPart decode_rank_part(const std::string& message, int rank) {
  // The parts come from pipetune's own ranks: a malformed one is a failed run, not bad input.
  const std::string source = fmt::format("rank {}'s part of the step", rank);
  try {
    const nlohmann::json document = json_reader::parse_document(message, source);
    const json_reader::Node root(document, source);
    root.allow_only({"origin_ms", "loss", "step_ms", "peak_memory_bytes", "library_memory_bytes",
                     "tasks", "memory"});
    RankPart part;
    part.origin_ms = root.field("origin_ms").number();
    part.loss = root.field("loss").number();
    part.step_ms = root.field("step_ms").non_negative_number();
    part.peak_memory_bytes = root.field("peak_memory_bytes").non_negative_integer();
    part.library_memory_bytes = root.field("library_memory_bytes").integer();
    for (const auto& task : root.field("tasks").elements()) part.tasks.push_back(decode_task(task));
    for (const auto& sample : root.field("memory").elements()) {
      sample.allow_only({"time_ms", "bytes"});
      part.memory.push_back(
          {sample.field("time_ms").number(), sample.field("bytes").non_negative_integer()});
    }
    return part;
  } catch (const InputError& e) {
    throw WorkError(e.what());
  }
}

StepRecord merge_rank_parts(const std::vector<RankPart>& parts, int step, double origin_ms,
                            bool with_memory) {
  StepRecord merged;
  merged.step = step;
  merged.peak_memory_bytes.assign(parts.size(), 0);
  merged.library_memory_bytes.assign(parts.size(), 0);
  if (with_memory) merged.memory.resize(parts.size());
  for (std::size_t r = 0; r < parts.size(); ++r) {
    const RankPart& part = parts[r];
    merged.loss += part.loss;
    merged.step_ms = std::max(merged.step_ms, part.step_ms);
    merged.peak_memory_bytes[r] = part.peak_memory_bytes;
    merged.library_memory_bytes[r] = part.library_memory_bytes;
    // Device d runs on rank d, so a rank's tasks already name the right devices.
    for (TraceTask t : part.tasks) {
      t.start_ms = shifted(t.start_ms, part.origin_ms, origin_ms);
      t.end_ms = shifted(t.end_ms, part.origin_ms, origin_ms);
      t.step = step;
      merged.tasks.push_back(t);
    }
    if (with_memory) {
      for (const auto& sample : part.memory) {
        merged.memory[r].push_back({shifted(sample.time, part.origin_ms, origin_ms), sample.value});
      }
    }
  }
  return merged;
}

}  // namespace pipetune::exec
