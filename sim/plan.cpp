#include "sim/plan.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "sim/error.hpp"
#include "sim/file_io.hpp"
#include "sim/json_reader.hpp"
#include "sim/limits.hpp"
#include "sim/schedule.hpp"

namespace pipetune {

namespace {
using json_reader::Node;
using nlohmann::json;
using nlohmann::ordered_json;
}  // namespace

std::string_view to_string(CheckpointMode mode) {
  switch (mode) {
    case CheckpointMode::Always:
      return "always";
    case CheckpointMode::ExceptLast:
      return "except_last";
    case CheckpointMode::Never:
      return "never";
  }
  return "?";
}

std::string_view to_string(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe:
      return "gpipe";
    case ScheduleKind::OneFOneB:
      return "1f1b";
    case ScheduleKind::Interleaved1F1B:
      return "interleaved-1f1b";
    case ScheduleKind::InterleavedZB:
      return "interleaved-zb";
    case ScheduleKind::ZBV:
      return "zbv";
    case ScheduleKind::LoopedBFS:
      return "looped-bfs";
    case ScheduleKind::DualPipeV:
      return "dualpipev";
  }
  return "?";
}

bool is_multi_stage(ScheduleKind kind) {
  return kind != ScheduleKind::GPipe && kind != ScheduleKind::OneFOneB;
}

bool splits_backward(ScheduleKind kind) {
  return kind == ScheduleKind::InterleavedZB || kind == ScheduleKind::ZBV ||
         kind == ScheduleKind::DualPipeV;
}

std::optional<int> fixed_stages_per_device(ScheduleKind kind) {
  if (!is_multi_stage(kind)) return 1;
  if (kind == ScheduleKind::ZBV || kind == ScheduleKind::DualPipeV) return 2;
  return std::nullopt;
}

int stage_rank(ScheduleKind kind, int stage, int stages, int stages_per_device) {
  const int ranks = stages / std::max(1, stages_per_device);
  if (!is_multi_stage(kind) || ranks < 1) return stage;
  if (kind == ScheduleKind::ZBV || kind == ScheduleKind::DualPipeV) {
    return stage < ranks ? stage : stages - 1 - stage;
  }
  return stage % ranks;
}

std::optional<CheckpointMode> parse_checkpoint_mode(std::string_view text) {
  for (auto mode : kAllCheckpointModes) {
    if (to_string(mode) == text) return mode;
  }
  return std::nullopt;
}

std::optional<ScheduleKind> parse_schedule_kind(std::string_view text) {
  for (auto kind : kAllScheduleKinds) {
    if (to_string(kind) == text) return kind;
  }
  return std::nullopt;
}

Plan parse_plan(std::string_view text, const std::string& source) {
  const json document = json_reader::parse_document(text, source);
  const Node root(document, source);
  if (!document.is_object()) root.fail("a JSON object");
  root.allow_only({"format", "balance", "chunks", "checkpoint", "schedule", "stages_per_device",
                   "devices", "optimizer_state_factor", "tied_parameters"});
  if (auto tied = root.optional_field("tied_parameters")) {
    if (!tied->value().is_array()) tied->fail("an array (written by pipetune for the reader)");
  }
  json_reader::check_format(root, kPlanFormat);
  Plan plan;
  const Node balance = root.field("balance");
  const auto stages = balance.elements();
  if (stages.empty()) balance.fail("a non-empty array of layer counts, one per stage");
  if (stages.size() > static_cast<std::size_t>(limits::kMaxStages))
    balance.fail("at most 1024 stages");
  for (const Node& s : stages) {
    if (!s.value().is_number() || s.integer() < 1) {
      s.fail("a positive integer (every stage needs at least one layer)");
    }
    // Bounded like chunks, so the cast to int cannot wrap (4294967297 must not read as 1).
    if (s.integer() > 1'000'000'000) s.fail("at most 1000000000 layers per stage");
    plan.balance.push_back(static_cast<int>(s.integer()));
  }
  const Node chunks = root.field("chunks");
  const auto c = chunks.positive_integer();
  if (c > limits::kMaxChunks) chunks.fail("at most 4096 micro-batches");
  plan.chunks = static_cast<int>(c);

  const Node checkpoint = root.field("checkpoint");
  const auto mode =
      parse_checkpoint_mode(checkpoint.value().is_string() ? checkpoint.string() : "");
  if (!mode) checkpoint.fail("one of \"always\", \"except_last\", \"never\"");
  plan.checkpoint = *mode;

  const Node schedule = root.field("schedule");
  const auto kind = parse_schedule_kind(schedule.value().is_string() ? schedule.string() : "");
  if (!kind) {
    schedule.fail(
        "one of \"gpipe\", \"1f1b\", \"interleaved-1f1b\", \"interleaved-zb\", \"zbv\", "
        "\"looped-bfs\", \"dualpipev\"");
  }
  plan.schedule = *kind;
  if (auto per_device = root.optional_field("stages_per_device")) {
    const auto v = per_device->positive_integer();
    if (v > 1'000'000) per_device->fail("at most 1000000 stages per device");
    plan.stages_per_device = static_cast<int>(v);
  }

  if (auto devices = root.optional_field("devices")) {
    const auto names = devices->elements(plan.balance.size(), "device names, one per stage");
    for (const Node& n : names) plan.devices.push_back(n.non_empty_string());
  }
  if (auto factor = root.optional_field("optimizer_state_factor")) {
    plan.optimizer_state_factor = factor->non_negative_number();
    // Adam keeps 2 (a few more with master weights); a huge factor overflows the byte counts.
    if (plan.optimizer_state_factor > 1000) factor->fail("a number from 0 to 1000");
  }
  return plan;
}

Plan load_plan(const std::string& path) {
  return parse_plan(read_text_file(path), path);
}

namespace {

// Written by hand so the balance stays on one line, as a person would write it. `last`, when
// given, is one more field written after the others ("\"key\": value").
std::string plan_file_text(const Plan& plan, const std::string& last) {
  std::string out = "{\n";
  out += fmt::format("  \"format\": \"{}\",\n", kPlanFormat);
  out += fmt::format("  \"balance\": [{}],\n", fmt::join(plan.balance, ", "));
  out += fmt::format("  \"chunks\": {},\n", plan.chunks);
  out += fmt::format("  \"checkpoint\": \"{}\",\n", to_string(plan.checkpoint));
  out += fmt::format("  \"schedule\": \"{}\",\n", to_string(plan.schedule));
  if (plan.stages_per_device != 1) {
    out += fmt::format("  \"stages_per_device\": {},\n", plan.stages_per_device);
  }
  if (!plan.devices.empty()) {
    std::vector<std::string> names;
    for (const auto& d : plan.devices) names.push_back(json(d).dump());
    out += fmt::format("  \"devices\": [{}],\n", fmt::join(names, ", "));
  }
  out += fmt::format("  \"optimizer_state_factor\": {}{}\n",
                     json(plan.optimizer_state_factor).dump(), last.empty() ? "" : ",");
  if (!last.empty()) out += "  " + last + "\n";
  out += "}\n";
  return out;
}

}  // namespace

std::string plan_to_json(const Plan& plan) {
  return plan_file_text(plan, "");
}

void save_plan(const Plan& plan, const std::string& path) {
  write_text_file_atomically(path, plan_to_json(plan));
}

std::string plan_to_json(const Plan& plan, const Profile& profile) {
  if (profile.tied.empty()) return plan_file_text(plan, "");
  std::vector<std::string> ties;
  for (const TiedTensor& t : profile.tied) {
    ties.push_back(fmt::format("{{\"name\": {}, \"stages\": [{}]}}", json(t.name).dump(),
                               fmt::join(stages_holding(t, plan.balance), ", ")));
  }
  return plan_file_text(plan, fmt::format("\"tied_parameters\": [{}]", fmt::join(ties, ", ")));
}

void save_plan(const Plan& plan, const Profile& profile, const std::string& path) {
  write_text_file_atomically(path, plan_to_json(plan, profile));
}

std::string describe_plan(const Plan& plan) {
  return fmt::format("[{}] x{} {} {}{}", fmt::join(plan.balance, ","), plan.chunks,
                     to_string(plan.checkpoint), to_string(plan.schedule),
                     plan.stages_per_device != 1
                         ? fmt::format(" ({} stages/device)", plan.stages_per_device)
                         : std::string());
}

namespace {

// What each schedule kind accepts of stages_per_device, and what torch refuses besides.
void check_stages_per_device(const Plan& plan, const Profile& profile, const std::string& source) {
  const int v = plan.stages_per_device;
  const int stages = plan.stages();
  if (v < 1) {
    throw InputError(
        fmt::format("{}: stages_per_device: expected a positive integer, got {}", source, v));
  }
  if (!is_multi_stage(plan.schedule) && v != 1) {
    throw InputError(fmt::format(
        "{}: stages_per_device: expected 1 for {} (one stage per programme; name \"devices\" to "
        "put several stages on one device), got {}",
        source, to_string(plan.schedule), v));
  }
  if (const auto fixed = fixed_stages_per_device(plan.schedule); fixed && v != *fixed) {
    throw InputError(
        fmt::format("{}: stages_per_device: expected {} for {} (a V of two stages "
                    "per device), got {}",
                    source, *fixed, to_string(plan.schedule), v));
  }
  if (stages % v != 0) {
    throw InputError(
        fmt::format("{}: balance: expected a multiple of {} stages (stages_per_device), got {}",
                    source, v, stages));
  }
  const int micro_batches = micro_batch_count(profile.batch_size, plan.chunks);
  if (auto why = schedule_refusal(plan.schedule, stages / v, v, micro_batches)) {
    throw InputError(fmt::format("{}: chunks: {}", source, *why));
  }
}

}  // namespace

namespace {

// Every stage a layer or more, the layers the profile's, at most limits::kMaxStages stages.
void check_balance(const Plan& plan, const Profile& profile, const std::string& source) {
  if (plan.balance.empty()) {
    throw InputError(source + ": balance: expected at least one stage");
  }
  for (std::size_t s = 0; s < plan.balance.size(); ++s) {
    if (plan.balance[s] < 1) {
      throw InputError(fmt::format(
          "{}: balance[{}]: expected a positive integer (every stage needs at least one layer), "
          "got {}",
          source, s, plan.balance[s]));
    }
  }
  const long long total = std::accumulate(plan.balance.begin(), plan.balance.end(), 0LL);
  if (total != static_cast<long long>(profile.layer_count())) {
    throw InputError(fmt::format(
        "{}: balance: expected layer counts summing to {} (the profile's layers), got {} = {}",
        source, profile.layer_count(), fmt::join(plan.balance, "+"), total));
  }
  if (plan.balance.size() > static_cast<std::size_t>(limits::kMaxStages)) {
    throw InputError(fmt::format("{}: balance: expected at most {} stages, got {}", source,
                                 limits::kMaxStages, plan.balance.size()));
  }
}

// A chunk count the batch allows, whose micro-batches the model can train on.
void check_chunks(const Plan& plan, const Profile& profile, const std::string& source) {
  if (plan.chunks < 1 || plan.chunks > max_chunks(profile.batch_size)) {
    throw InputError(fmt::format("{}: chunks: expected {}, got {}", source,
                                 chunks_expectation(profile.batch_size), plan.chunks));
  }
  if (!splits_trainably(profile, plan.chunks)) {
    std::vector<int> fitting;
    for (int c = 1; c <= max_chunks(profile.batch_size); ++c)
      if (splits_trainably(profile, c)) fitting.push_back(c);
    const std::int64_t smallest = split_batch(profile.batch_size, plan.chunks).back();
    throw InputError(fmt::format(
        "{}: chunks: {} split the batch of {} into micro-batches as small as {} sample{}, but the "
        "model trains on no fewer than {} (the profile's min_micro_batch: a layer cannot train on "
        "fewer); expected a chunk count in {{{}}}",
        source, plan.chunks, profile.batch_size, smallest, smallest == 1 ? "" : "s",
        profile.min_micro_batch, fmt::join(fitting, ", ")));
  }
}

// The stages on the hardware's devices: as many as the schedule places, or the named ones,
// each programme's stages on one device.
void check_devices(const Plan& plan, const Hardware& hardware, const std::string& source) {
  const int stages = plan.stages();
  const int ranks = stages / plan.stages_per_device;
  if (plan.devices.empty()) {
    if (is_multi_stage(plan.schedule)) {
      if (ranks > static_cast<int>(hardware.devices.size())) {
        throw InputError(fmt::format(
            "{}: balance: expected at most {} stages ({} per device on {} device{}), got {}",
            source, plan.stages_per_device * hardware.devices.size(), plan.stages_per_device,
            hardware.devices.size(), hardware.devices.size() == 1 ? "" : "s", stages));
      }
    } else if (plan.balance.size() > hardware.devices.size()) {
      throw InputError(fmt::format(
          "{}: balance: expected at most {} stage{} (one per device; name \"devices\" to put "
          "several stages on one device), got {}",
          source, hardware.devices.size(), hardware.devices.size() == 1 ? "" : "s",
          plan.balance.size()));
    }
  } else {
    if (plan.devices.size() != plan.balance.size()) {
      throw InputError(fmt::format("{}: devices: expected {} device names, one per stage, got {}",
                                   source, plan.balance.size(), plan.devices.size()));
    }
    for (std::size_t s = 0; s < plan.devices.size(); ++s) {
      if (hardware.device_index(plan.devices[s]) < 0) {
        std::vector<std::string> names;
        for (const auto& d : hardware.devices) names.push_back(d.name);
        throw InputError(fmt::format("{}: devices[{}]: expected one of {}, got \"{}\"", source, s,
                                     fmt::join(names, ", "), plan.devices[s]));
      }
    }
    // One programme runs on one device: its stages' order is fixed by the schedule.
    std::vector<int> first_of_rank(ranks, -1);
    for (int s = 0; s < stages; ++s) {
      int& first = first_of_rank[stage_rank(plan.schedule, s, stages, plan.stages_per_device)];
      if (first < 0) {
        first = s;
      } else if (plan.devices[s] != plan.devices[first]) {
        throw InputError(fmt::format(
            "{}: devices[{}]: expected \"{}\" (stages {} and {} are one programme of {}), got "
            "\"{}\"",
            source, s, plan.devices[first], first, s, to_string(plan.schedule), plan.devices[s]));
      }
    }
  }
}

}  // namespace

void check_plan(const Plan& plan, const Profile& profile, const Hardware& hardware,
                const std::string& source) {
  check_balance(plan, profile, source);
  check_chunks(plan, profile, source);
  check_stages_per_device(plan, profile, source);
  check_devices(plan, hardware, source);
}

int max_chunks(std::int64_t batch) {
  return static_cast<int>(std::min<std::int64_t>(batch, limits::kMaxChunks));
}

std::string chunks_expectation(std::int64_t batch) {
  return batch <= limits::kMaxChunks
             ? fmt::format("1 to {} (the batch size)", batch)
             : fmt::format("1 to {} (the most micro-batches a plan may have)", limits::kMaxChunks);
}

std::vector<int> stage_devices(const Plan& plan, const Hardware& hardware) {
  std::vector<int> out(plan.balance.size());
  for (std::size_t s = 0; s < out.size(); ++s) {
    out[s] = plan.devices.empty() ? stage_rank(plan.schedule, static_cast<int>(s), plan.stages(),
                                               plan.stages_per_device)
                                  : hardware.device_index(plan.devices[s]);
  }
  return out;
}

bool is_checkpointed(CheckpointMode mode, int micro_batch, int micro_batches) {
  switch (mode) {
    case CheckpointMode::Always:
      return true;
    case CheckpointMode::ExceptLast:
      return micro_batch < micro_batches - 1;
    case CheckpointMode::Never:
      return false;
  }
  return false;
}

bool splits_trainably(const Profile& profile, int chunks) {
  const auto sizes = split_batch(profile.batch_size, chunks);
  return !sizes.empty() && sizes.back() >= profile.min_micro_batch;
}

std::vector<std::int64_t> split_batch(std::int64_t batch, int chunks) {
  std::vector<std::int64_t> sizes;
  if (batch <= 0 || chunks <= 0) return sizes;
  // Rounded up without batch + chunks - 1, which overflows for a batch near INT64_MAX.
  const std::int64_t each = batch / chunks + (batch % chunks != 0 ? 1 : 0);
  for (std::int64_t left = batch; left > 0; left -= each) sizes.push_back(std::min(each, left));
  return sizes;
}

int micro_batch_count(std::int64_t batch, int chunks) {
  return static_cast<int>(split_batch(batch, chunks).size());
}

}  // namespace pipetune
