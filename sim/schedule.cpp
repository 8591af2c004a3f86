#include "sim/schedule.hpp"

#include <algorithm>
#include <charconv>
#include <limits>
#include <stdexcept>

namespace pipetune {

char action_letter(ActionKind kind) {
  switch (kind) {
    case ActionKind::Forward:
      return 'F';
    case ActionKind::Recompute:
      return 'R';
    case ActionKind::Backward:
      return 'B';
  }
  return '?';
}

std::string to_string(const Action& action) {
  return std::to_string(action.stage) + action_letter(action.kind) +
         std::to_string(action.micro_batch);
}

std::optional<Action> parse_action(std::string_view text) {
  const auto letter = text.find_first_of("FRB");
  if (letter == std::string_view::npos || letter == 0 || letter + 1 >= text.size()) {
    return std::nullopt;
  }
  Action a;
  a.kind = text[letter] == 'F'   ? ActionKind::Forward
           : text[letter] == 'R' ? ActionKind::Recompute
                                 : ActionKind::Backward;
  auto number = [](std::string_view digits, int& out) {
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string_view::npos) {
      return false;
    }
    auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), out);
    return ec == std::errc() && ptr == digits.data() + digits.size();
  };
  if (!number(text.substr(0, letter), a.stage) || !number(text.substr(letter + 1), a.micro_batch)) {
    return std::nullopt;
  }
  return a;
}

namespace {

void append_backward(std::vector<Action>& out, const Schedule& s, int stage, int micro_batch) {
  if (s.recomputes(micro_batch)) out.push_back({ActionKind::Recompute, stage, micro_batch});
  out.push_back({ActionKind::Backward, stage, micro_batch});
}

}  // namespace

Schedule make_schedule(ScheduleKind kind, int stages, int micro_batches,
                       CheckpointMode checkpoint) {
  if (stages < 1 || micro_batches < 1) {
    throw std::invalid_argument("make_schedule: need at least one stage and one micro-batch");
  }
  Schedule s;
  s.kind = kind;
  s.checkpoint = checkpoint;
  s.stages = stages;
  s.micro_batches = micro_batches;
  s.per_stage.resize(stages);
  for (int stage = 0; stage < stages; ++stage) {
    auto& out = s.per_stage[stage];
    out.reserve(3 * static_cast<std::size_t>(micro_batches));
    if (kind == ScheduleKind::GPipe) {
      for (int i = 0; i < micro_batches; ++i) out.push_back({ActionKind::Forward, stage, i});
      for (int i = micro_batches - 1; i >= 0; --i) append_backward(out, s, stage, i);
    } else {
      const int warmup = std::min(micro_batches, stages - stage);
      int next_forward = 0;
      for (; next_forward < warmup; ++next_forward) {
        out.push_back({ActionKind::Forward, stage, next_forward});
      }
      for (int next_backward = 0; next_backward < micro_batches; ++next_backward) {
        append_backward(out, s, stage, next_backward);
        if (next_forward < micro_batches) {
          out.push_back({ActionKind::Forward, stage, next_forward++});
        }
      }
    }
  }
  return s;
}

std::vector<std::vector<std::pair<int, int>>> clock_cycles(int micro_batches, int stages) {
  std::vector<std::vector<std::pair<int, int>>> clocks;
  for (int k = 0; k < micro_batches + stages - 1; ++k) {
    std::vector<std::pair<int, int>> cells;
    for (int j = std::max(1 + k - micro_batches, 0); j < std::min(1 + k, stages); ++j) {
      cells.emplace_back(k - j, j);
    }
    clocks.push_back(std::move(cells));
  }
  return clocks;
}

std::vector<Action> program_order(const Schedule& schedule) {
  const int stages = schedule.stages, m = schedule.micro_batches;
  constexpr int kNotYet = std::numeric_limits<int>::max();
  // Finish tick of each stage's forward and backward of each micro-batch.
  std::vector<int> forward_done(static_cast<std::size_t>(stages) * m, kNotYet);
  std::vector<int> backward_done(static_cast<std::size_t>(stages) * m, kNotYet);
  auto at = [m](int stage, int micro_batch) {
    return static_cast<std::size_t>(stage) * m + micro_batch;
  };
  std::vector<std::size_t> next(stages, 0);
  std::vector<int> free_at(stages, 0);
  std::size_t total = 0;
  for (const auto& actions : schedule.per_stage) total += actions.size();

  std::vector<Action> order;
  order.reserve(total);
  for (int tick = 0; order.size() < total; ++tick) {
    bool busy_or_started = false;
    for (int s = 0; s < stages; ++s) {
      if (free_at[s] > tick) {
        busy_or_started = true;
        continue;
      }
      if (next[s] == schedule.per_stage[s].size()) continue;
      const Action a = schedule.per_stage[s][next[s]];
      int ready = 0;  // tick by which the inputs from other stages exist
      if (a.kind == ActionKind::Forward && s > 0) ready = forward_done[at(s - 1, a.micro_batch)];
      if (a.kind == ActionKind::Backward && s + 1 < stages) {
        ready = backward_done[at(s + 1, a.micro_batch)];
      }
      if (ready > tick) continue;
      order.push_back(a);
      ++next[s];
      free_at[s] = tick + 1;
      busy_or_started = true;
      if (a.kind == ActionKind::Forward) forward_done[at(s, a.micro_batch)] = tick + 1;
      if (a.kind == ActionKind::Backward) backward_done[at(s, a.micro_batch)] = tick + 1;
    }
    if (!busy_or_started) {
      throw std::logic_error("program_order: the schedule deadlocks at " +
                             to_string(schedule.per_stage[0].empty()
                                           ? Action{}
                                           : schedule.per_stage[0][std::min(
                                                 next[0], schedule.per_stage[0].size() - 1)]));
    }
  }
  return order;
}

std::vector<std::vector<Action>> device_programs(const Schedule& schedule,
                                                 std::span<const int> stage_device, int devices) {
  std::vector<std::vector<Action>> programs(devices);
  for (const Action& a : program_order(schedule)) programs[stage_device[a.stage]].push_back(a);
  return programs;
}

}  // namespace pipetune
