#include "sim/schedule.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <map>
#include <set>
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
    case ActionKind::InputGrad:
      return 'I';
    case ActionKind::WeightGrad:
      return 'W';
  }
  return '?';
}

std::string to_string(const Action& action) {
  return std::to_string(action.stage) + action_letter(action.kind) +
         std::to_string(action.micro_batch);
}

std::optional<Action> parse_action(std::string_view text) {
  const auto letter = text.find_first_not_of("0123456789");
  if (letter == std::string_view::npos || letter == 0 || letter + 1 >= text.size()) {
    return std::nullopt;
  }
  Action a;
  const auto kind = std::find_if(std::begin(kAllActionKinds), std::end(kAllActionKinds),
                                 [&](ActionKind k) { return action_letter(k) == text[letter]; });
  if (kind == std::end(kAllActionKinds)) return std::nullopt;
  a.kind = *kind;
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

// Builds one programme: recomputes go right before the B or I of a checkpointed micro-batch.
class ProgramBuilder {
 public:
  ProgramBuilder(const Schedule& s, std::vector<Action>& out) : s_(s), out_(out) {}
  void forward(int stage, int i) { out_.push_back({ActionKind::Forward, stage, i}); }
  void backward(ActionKind kind, int stage, int i) {
    if (s_.recomputes(i)) out_.push_back({ActionKind::Recompute, stage, i});
    out_.push_back({kind, stage, i});
  }
  void weight(int stage, int i) { out_.push_back({ActionKind::WeightGrad, stage, i}); }

 private:
  const Schedule& s_;
  std::vector<Action>& out_;
};

void gpipe(const Schedule& s, int stage, ProgramBuilder& p) {
  for (int i = 0; i < s.micro_batches; ++i) p.forward(stage, i);
  for (int i = s.micro_batches - 1; i >= 0; --i) p.backward(ActionKind::Backward, stage, i);
}

void one_f_one_b(const Schedule& s, int stage, ProgramBuilder& p) {
  const int m = s.micro_batches;
  const int warmup = std::min(m, s.stages - stage);
  int next_forward = 0;
  for (; next_forward < warmup; ++next_forward) p.forward(stage, next_forward);
  for (int next_backward = 0; next_backward < m; ++next_backward) {
    p.backward(ActionKind::Backward, stage, next_backward);
    if (next_forward < m) p.forward(stage, next_forward++);
  }
}

// Interleaved 1F1B and interleaved zero bubble (torch's _get_1f1b_rank_ops): programme `rank`
// of `ranks`, v local stages. Operation k of the warm-up and steady phases is a forward of the
// local stage k / per_round mod v; operation k of the steady and cool-down phases a backward
// (or I) of the local stage counted from the last, rounds starting after the warm-up.
void interleaved(const Schedule& s, int rank, int ranks, int v, bool zero_bubble,
                 ProgramBuilder& p) {
  const int m = s.micro_batches;
  const int per_round = m / std::max(1, m / ranks);
  const int warmup =
      std::min((v - 1) * per_round + (zero_bubble ? 1 : 2) * (ranks - 1 - rank), m * v);
  const int operations = m * v + warmup;  // warm-up, steady (m v - warm-up), cool-down (warm-up)
  auto forward_stage = [&](int k) { return (k / per_round) % v * ranks + rank; };
  auto backward_stage = [&](int k) {
    return (v - 1 - (k - warmup) / per_round % v) * ranks + rank;
  };
  std::vector<int> next_forward(s.stages, 0), next_backward(s.stages, 0), next_weight(s.stages, 0);
  std::vector<int> backward_ops;  // operation index of each backward, for the W that follows
  std::size_t weights = 0;
  auto weight = [&] {
    const int stage = backward_stage(backward_ops[weights++]);
    p.weight(stage, next_weight[stage]++);
  };
  for (int k = 0; k < operations; ++k) {
    if (k < m * v) {
      const int stage = forward_stage(k);
      p.forward(stage, next_forward[stage]++);
    }
    if (k < warmup) continue;
    const int stage = backward_stage(k);
    p.backward(zero_bubble ? ActionKind::InputGrad : ActionKind::Backward, stage,
               next_backward[stage]++);
    backward_ops.push_back(k);
    // ZB1P: programme r delays each W by r Is, which fills its share of the bubble.
    if (zero_bubble && k - warmup >= rank) weight();
  }
  while (zero_bubble && weights < backward_ops.size()) weight();
}

// ZBV (torch's ScheduleZBVZeroBubble): programme `rank` holds stages rank (going down) and
// 2 ranks - 1 - rank (coming back up). It runs at least 2 ranks - 1 micro-batches' worth of
// pattern; actions of micro-batches beyond M are dropped.
void zbv(const Schedule& s, int rank, int ranks, std::vector<Action>& out) {
  const int m = std::max(2 * ranks - 1, s.micro_batches);
  const int down = rank, up = 2 * ranks - 1 - rank;
  int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
  std::vector<Action> all;
  auto add = [&](ActionKind kind, int stage, int i) { all.push_back({kind, stage, i}); };
  for (int k = 0; k < 2 * (ranks - rank) - 1; ++k) add(ActionKind::Forward, down, f0++);
  for (int k = 0; k < rank; ++k) {
    add(ActionKind::Forward, up, f1++);
    add(ActionKind::Forward, down, f0++);
  }
  for (int k = 0; k < ranks - rank; ++k) {
    add(ActionKind::Forward, up, f1++);
    add(ActionKind::InputGrad, up, b1);
    add(ActionKind::WeightGrad, up, b1++);
  }
  while (f1 < f0 || f0 < m) {
    if (f0 < m) add(ActionKind::Forward, down, f0++);
    add(ActionKind::InputGrad, down, b0);
    add(ActionKind::WeightGrad, down, b0++);
    add(ActionKind::Forward, up, f1++);
    add(ActionKind::InputGrad, up, b1);
    add(ActionKind::WeightGrad, up, b1++);
  }
  int w0 = b0, w1 = b1;
  for (int k = 0; k < rank; ++k) {
    add(ActionKind::InputGrad, down, b0++);
    add(ActionKind::InputGrad, up, b1++);
  }
  for (int k = 0; k < ranks - rank; ++k) {
    add(ActionKind::InputGrad, down, b0++);
    add(ActionKind::WeightGrad, down, w0++);
  }
  while (w1 < b1) add(ActionKind::WeightGrad, up, w1++);
  while (w0 < b0) add(ActionKind::WeightGrad, down, w0++);
  ProgramBuilder p(s, out);
  for (const Action& a : all) {
    if (a.micro_batch >= s.micro_batches) continue;
    if (a.kind == ActionKind::Forward) p.forward(a.stage, a.micro_batch);
    if (a.kind == ActionKind::InputGrad) p.backward(a.kind, a.stage, a.micro_batch);
    if (a.kind == ActionKind::WeightGrad) p.weight(a.stage, a.micro_batch);
  }
}

// DualPipeV (torch's ScheduleDualPipeV, after DeepSeek's DualPipe): ZBV's V, programme `rank`
// holding stages rank (down) and 2 ranks - 1 - rank (up). Its steady state pairs a forward of
// one of its stages with a whole backward of the other (torch runs the pair one after the
// other); the warm-up's and the tail's backwards are split, their Ws run from a queue in the
// order of their Is. Phases, with D ranks and M >= 2D micro-batches:
//   1. 2 (D - 1 - r) forwards down          5. D - 1 - r times: B up, then F up + B down
//   2. r + 1 times: F down, F up            6. r + 1 times: a backward up and one down, each
//   3. D - 1 - r times: I up, a W, F up        whole until the middle pair, then I (odd ranks
//   4. M - 2D + r + 1 times: F down + B up,    switch on the up one, even on the down one)
//      then F up + B down (the last rank's  7. D - 1 - r times: a W, then I down
//      first pair: F down, B up)            8. r + 1 Ws.
void dualpipev(int rank, int ranks, int micro_batches, ProgramBuilder& p) {
  const int down = rank, up = 2 * ranks - 1 - rank;
  std::map<int, int> next_forward, next_backward;  // per stage: B and I share one count
  std::vector<std::pair<int, int>> weights;        // (stage, micro-batch) of each I, in order
  std::size_t next_weight = 0;
  auto forward = [&](int stage) { p.forward(stage, next_forward[stage]++); };
  auto backward = [&](int stage, bool split) {
    const int i = next_backward[stage]++;
    p.backward(split ? ActionKind::InputGrad : ActionKind::Backward, stage, i);
    if (split) weights.emplace_back(stage, i);
  };
  auto weight = [&] {
    if (next_weight == weights.size()) return;  // none pending
    const auto [stage, i] = weights[next_weight++];
    p.weight(stage, i);
  };
  const int tail = ranks - 1 - rank;  // D - 1 - r
  for (int k = 0; k < 2 * tail; ++k) forward(down);
  for (int k = 0; k <= rank; ++k) {
    forward(down);
    forward(up);
  }
  for (int k = 0; k < tail; ++k) {
    backward(up, true);
    weight();
    forward(up);
  }
  for (int k = 0; k < micro_batches - 2 * ranks + rank + 1; ++k) {
    forward(down);
    backward(up, false);
    forward(up);
    backward(down, false);
  }
  for (int k = 0; k < tail; ++k) {
    backward(up, false);
    forward(up);
    backward(down, false);
  }
  bool split = false;
  for (int k = 0; k <= rank; ++k) {
    if (k == (rank + 1) / 2 && rank % 2 == 1) split = true;
    backward(up, split);
    if (k == (rank + 1) / 2 && rank % 2 == 0) split = true;
    backward(down, split);
  }
  for (int k = 0; k < tail; ++k) {
    weight();
    backward(down, split);
  }
  for (int k = 0; k <= rank; ++k) weight();
}

void looped_bfs(const Schedule& s, int rank, int ranks, int v, ProgramBuilder& p) {
  for (int local = 0; local < v; ++local) {
    for (int i = 0; i < s.micro_batches; ++i) p.forward(local * ranks + rank, i);
  }
  for (int local = v - 1; local >= 0; --local) {
    for (int i = s.micro_batches - 1; i >= 0; --i) {
      p.backward(ActionKind::Backward, local * ranks + rank, i);
    }
  }
}

// Each stage's actions, in the order its programme runs them.
void derive_per_stage(Schedule& s) {
  s.per_stage.assign(s.stages, {});
  for (const auto& program : s.per_rank) {
    for (const Action& a : program) s.per_stage[a.stage].push_back(a);
  }
}

}  // namespace

std::optional<std::string> schedule_refusal(ScheduleKind kind, int ranks, int stages_per_device,
                                            int micro_batches) {
  if (ranks < 1 || micro_batches < 1 || stages_per_device < 1) {
    return "need at least one device, one stage and one micro-batch";
  }
  if (const auto fixed = fixed_stages_per_device(kind);
      is_multi_stage(kind) && fixed && stages_per_device != *fixed) {
    return fmt::format("{} runs exactly {} stages per device, got {}", to_string(kind), *fixed,
                       stages_per_device);
  }
  if (kind == ScheduleKind::DualPipeV && micro_batches < 2 * ranks) {
    return fmt::format(
        "dualpipev needs at least as many micro-batches as stages (torch refuses fewer): {} "
        "stages, got {}",
        2 * ranks, micro_batches);
  }
  if (kind == ScheduleKind::Interleaved1F1B || kind == ScheduleKind::InterleavedZB) {
    const int rounds = std::max(1, micro_batches / ranks);
    if (micro_batches % rounds != 0) {
      return fmt::format(
          "{} on {} devices needs a micro-batch count divisible by its number of rounds "
          "max(1, M / {}) = {} (torch refuses it), got {}",
          to_string(kind), ranks, ranks, rounds, micro_batches);
    }
  }
  return std::nullopt;
}

Schedule make_schedule(ScheduleKind kind, int stages, int micro_batches, CheckpointMode checkpoint,
                       int stages_per_device) {
  if (stages < 1 || micro_batches < 1) {
    throw std::invalid_argument("make_schedule: need at least one stage and one micro-batch");
  }
  const int v = is_multi_stage(kind) ? stages_per_device : 1;
  if (v < 1 || stages % v != 0) {
    throw std::invalid_argument(fmt::format(
        "make_schedule: {} stages do not split into {} per device", stages, stages_per_device));
  }
  const int ranks = stages / v;
  if (auto why = schedule_refusal(kind, ranks, v, micro_batches)) {
    throw std::invalid_argument("make_schedule: " + *why);
  }
  Schedule s;
  s.kind = kind;
  s.checkpoint = checkpoint;
  s.stages = stages;
  s.micro_batches = micro_batches;
  s.stage_rank.resize(stages);
  for (int stage = 0; stage < stages; ++stage) {
    s.stage_rank[stage] = stage_rank(kind, stage, stages, v);
  }
  s.per_rank.resize(ranks);
  for (int rank = 0; rank < ranks; ++rank) {
    auto& out = s.per_rank[rank];
    out.reserve(4 * static_cast<std::size_t>(micro_batches) * v);
    ProgramBuilder p(s, out);
    switch (kind) {
      case ScheduleKind::GPipe:
        gpipe(s, rank, p);
        break;
      case ScheduleKind::OneFOneB:
        one_f_one_b(s, rank, p);
        break;
      case ScheduleKind::Interleaved1F1B:
      case ScheduleKind::InterleavedZB:
        interleaved(s, rank, ranks, v, kind == ScheduleKind::InterleavedZB, p);
        break;
      case ScheduleKind::ZBV:
        zbv(s, rank, ranks, out);
        break;
      case ScheduleKind::LoopedBFS:
        looped_bfs(s, rank, ranks, v, p);
        break;
      case ScheduleKind::DualPipeV:
        dualpipev(rank, ranks, micro_batches, p);
        break;
    }
  }
  derive_per_stage(s);
  return s;
}

Schedule schedule_of(const Plan& plan, std::int64_t batch_size) {
  return make_schedule(plan.schedule, plan.stages(), micro_batch_count(batch_size, plan.chunks),
                       plan.checkpoint, plan.stages_per_device);
}

namespace {

// Which (stage, micro-batch, kind) actions a custom order has run so far, in programme order.
class ActionsSeen {
 public:
  bool done(int stage, int micro_batch, ActionKind kind) const {
    return seen_.count({stage, micro_batch, kind}) > 0;
  }
  void add(const Action& a) { seen_.insert({a.stage, a.micro_batch, a.kind}); }

 private:
  std::set<std::tuple<int, int, ActionKind>> seen_;
};

// Each action in turn, as torch's validation takes them: no recompute of its own, none twice,
// a backward after its forward, W after its I, one backward per micro-batch, each stage on one
// programme (set in s.stage_rank).
void check_each_action(Schedule& s,
                       const std::function<std::string(std::size_t, std::size_t)>& where,
                       ActionsSeen& seen) {
  std::vector<std::size_t> first_at(s.stages, 0);  // position of each stage's first action
  for (std::size_t r = 0; r < s.per_rank.size(); ++r) {
    for (std::size_t k = 0; k < s.per_rank[r].size(); ++k) {
      const Action& a = s.per_rank[r][k];
      const std::string text = to_string(a);
      if (a.kind == ActionKind::Recompute) {
        throw std::invalid_argument(fmt::format(
            "{}: {}: recompute is not an action of its own here (checkpointing is the plan's)",
            where(r, k), text));
      }
      if (seen.done(a.stage, a.micro_batch, a.kind)) {
        throw std::invalid_argument(fmt::format("{}: {}: runs twice", where(r, k), text));
      }
      const bool forwarded = seen.done(a.stage, a.micro_batch, ActionKind::Forward);
      if ((sends_gradient(a.kind) || a.kind == ActionKind::Recompute) && !forwarded) {
        throw std::invalid_argument(
            fmt::format("{}: {}: before {}", where(r, k), text,
                        to_string(Action{ActionKind::Forward, a.stage, a.micro_batch})));
      }
      if (a.kind == ActionKind::WeightGrad &&
          !seen.done(a.stage, a.micro_batch, ActionKind::InputGrad)) {
        throw std::invalid_argument(
            fmt::format("{}: {}: before {}", where(r, k), text,
                        to_string(Action{ActionKind::InputGrad, a.stage, a.micro_batch})));
      }
      const bool backward_done = seen.done(a.stage, a.micro_batch, ActionKind::Backward) ||
                                 seen.done(a.stage, a.micro_batch, ActionKind::InputGrad);
      if (sends_gradient(a.kind) && backward_done) {
        throw std::invalid_argument(
            fmt::format("{}: {}: micro-batch {} of stage {} has a "
                        "backward already",
                        where(r, k), text, a.micro_batch, a.stage));
      }
      int& rank = s.stage_rank[a.stage];
      if (rank >= 0 && rank != static_cast<int>(r)) {
        throw std::invalid_argument(
            fmt::format("{}: {}: stage {} already runs at {} (one "
                        "programme per stage)",
                        where(r, k), text, a.stage, where(rank, first_at[a.stage])));
      }
      if (rank < 0) first_at[a.stage] = k;
      rank = static_cast<int>(r);
      seen.add(a);
    }
  }
}

// Every stage's every micro-batch forward and backward (B, or I and W).
void check_every_micro_batch_complete(const Schedule& s, const ActionsSeen& seen) {
  for (int stage = 0; stage < s.stages; ++stage) {
    for (int i = 0; i < s.micro_batches; ++i) {
      const bool forward = seen.done(stage, i, ActionKind::Forward);
      const bool whole = seen.done(stage, i, ActionKind::Backward);
      const bool input = seen.done(stage, i, ActionKind::InputGrad);
      const bool weight = seen.done(stage, i, ActionKind::WeightGrad);
      if (!forward || (!whole && !input) || input != weight) {
        const Action missing{!forward ? ActionKind::Forward
                             : !input ? (weight ? ActionKind::InputGrad : ActionKind::Backward)
                                      : ActionKind::WeightGrad,
                             stage, i};
        throw std::invalid_argument(fmt::format(
            "stage {} has {} micro-batches but no {}{}", stage, s.micro_batches, to_string(missing),
            s.stage_rank[stage] < 0 ? fmt::format(" (stage {} has no actions at all)", stage)
                                    : std::string()));
      }
    }
  }
}

// The closest generated kind, for display: programmes read from a file follow no generator.
void name_closest_kind(Schedule& s) {
  const bool split = std::any_of(s.per_rank.begin(), s.per_rank.end(), [](const auto& program) {
    return std::any_of(program.begin(), program.end(),
                       [](const Action& a) { return a.kind == ActionKind::InputGrad; });
  });
  const bool single = s.per_rank.size() == static_cast<std::size_t>(s.stages);
  s.kind = split ? ScheduleKind::InterleavedZB
                 : (single ? ScheduleKind::OneFOneB : ScheduleKind::Interleaved1F1B);
  s.checkpoint = CheckpointMode::Never;
}

}  // namespace

Schedule schedule_from_programs(
    std::vector<std::vector<Action>> per_rank,
    const std::function<std::string(std::size_t, std::size_t)>& where_given) {
  Schedule s;
  s.per_rank = std::move(per_rank);
  const std::function<std::string(std::size_t, std::size_t)> where = [&](std::size_t rank,
                                                                         std::size_t position) {
    return where_given ? where_given(rank, position)
                       : fmt::format("programme {}, action {}", rank, position);
  };
  // Stages and micro-batches: one past the largest index seen.
  for (const auto& program : s.per_rank) {
    for (const Action& a : program) {
      s.stages = std::max(s.stages, a.stage + 1);
      s.micro_batches = std::max(s.micro_batches, a.micro_batch + 1);
    }
  }
  if (s.stages == 0) throw std::invalid_argument("the schedule has no actions");
  s.stage_rank.assign(s.stages, -1);
  ActionsSeen seen;
  check_each_action(s, where, seen);
  check_every_micro_batch_complete(s, seen);
  name_closest_kind(s);
  derive_per_stage(s);
  program_order(s);  // throws if the programmes deadlock
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
  // Finish tick of each stage's forward (or recompute) and of the backward (B or I) that sends
  // its input gradient, per micro-batch.
  std::vector<int> forward_done(static_cast<std::size_t>(stages) * m, kNotYet);
  std::vector<int> gradient_done(static_cast<std::size_t>(stages) * m, kNotYet);
  auto at = [m](int stage, int micro_batch) {
    return static_cast<std::size_t>(stage) * m + micro_batch;
  };
  const int lanes = schedule.ranks();
  std::vector<std::size_t> next(lanes, 0);
  std::vector<int> free_at(lanes, 0);
  std::size_t total = 0;
  for (const auto& actions : schedule.per_rank) total += actions.size();

  std::vector<Action> order;
  order.reserve(total);
  for (int tick = 0; order.size() < total; ++tick) {
    bool busy_or_started = false;
    for (int r = 0; r < lanes; ++r) {
      if (free_at[r] > tick) {
        busy_or_started = true;
        continue;
      }
      if (next[r] == schedule.per_rank[r].size()) continue;
      const Action a = schedule.per_rank[r][next[r]];
      const int s = a.stage, i = a.micro_batch;
      int ready = 0;  // tick by which the inputs from other stages exist
      if (a.kind == ActionKind::Forward && s > 0) ready = forward_done[at(s - 1, i)];
      if (sends_gradient(a.kind)) {
        ready = s + 1 < stages ? gradient_done[at(s + 1, i)] : forward_done[at(s, i)];
      }
      if (a.kind == ActionKind::WeightGrad) ready = gradient_done[at(s, i)];
      if (ready > tick) continue;
      order.push_back(a);
      ++next[r];
      free_at[r] = tick + 1;
      busy_or_started = true;
      if (a.kind == ActionKind::Forward) forward_done[at(s, i)] = tick + 1;
      if (sends_gradient(a.kind)) gradient_done[at(s, i)] = tick + 1;
    }
    if (!busy_or_started) {
      std::string waiting;
      for (int r = 0; r < lanes; ++r) {
        if (next[r] < schedule.per_rank[r].size()) {
          waiting += (waiting.empty() ? "" : ", ") + to_string(schedule.per_rank[r][next[r]]);
        }
      }
      throw std::logic_error("program_order: the schedule deadlocks: every programme waits (" +
                             waiting + ")");
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

std::vector<char> micro_batches_with(const Schedule& schedule, ActionKind kind) {
  std::vector<char> out(static_cast<std::size_t>(schedule.stages) * schedule.micro_batches, 0);
  for (const auto& program : schedule.per_rank) {
    for (const Action& a : program) {
      if (a.kind == kind) {
        out[static_cast<std::size_t>(a.stage) * schedule.micro_batches + a.micro_batch] = 1;
      }
    }
  }
  return out;
}

}  // namespace pipetune
