// Stages as CUDA graphs, the bookkeeping (executor/graph_plan.hpp, graph_runtime.hpp): over
// every schedule, micro-batches in flight together never share a slot and no stage has more
// slots than it has micro-batches in flight; every action maps to its micro-batch's graph; and
// a replayer captures each graph once, then only replays, never copying into a slot another
// micro-batch holds. Torch-free: a fake runtime records what the GPU one would do. The checkers
// are computed from the schedule, not from the plan, and are shown to refuse wrong plans.

#include "executor/graph_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "executor/graph_runtime.hpp"
#include "sim/plan.hpp"
#include "sim/schedule.hpp"

namespace pipetune::exec {

void PrintTo(const GraphKey& key, std::ostream* os) {
  *os << to_string(key);
}

namespace {

// torch.chunk: ceil(batch / chunks) samples each, the last smaller; nothing when that makes
// fewer chunks than asked (7 into 5 gives 2,2,2,1): the executor then runs another schedule.
std::optional<std::vector<std::int64_t>> chunk_sizes(std::int64_t batch, int chunks) {
  const std::int64_t each = (batch + chunks - 1) / chunks;
  std::vector<std::int64_t> sizes;
  for (std::int64_t left = batch; left > 0; left -= each) sizes.push_back(std::min(each, left));
  if (sizes.size() != static_cast<std::size_t>(chunks)) return std::nullopt;
  return sizes;
}

struct Case {
  std::string name;
  Schedule schedule;
  std::vector<std::int64_t> sizes;
};

// Every schedule kind on 2 to 4 devices (two stages each for the multi-stage kinds), every
// micro-batch count torch accepts up to 8, every checkpoint mode, over batches that split
// unevenly (7, 17; 15 into 8) and evenly (15 into 3 or 5).
const std::vector<Case>& all_cases() {
  static const std::vector<Case> cases = [] {
    std::vector<Case> out;
    for (const ScheduleKind kind : kAllScheduleKinds) {
      const int per_device = is_multi_stage(kind) ? 2 : 1;
      for (int ranks = 2; ranks <= 4; ++ranks) {
        for (int m = 1; m <= 8; ++m) {
          if (schedule_refusal(kind, ranks, per_device, m)) continue;
          for (const std::int64_t batch : {7, 15, 17}) {
            const auto sizes = chunk_sizes(batch, m);
            if (!sizes) continue;
            EXPECT_EQ(*sizes, split_batch(batch, m));  // the executor's own split
            for (const CheckpointMode mode : kAllCheckpointModes) {
              out.push_back({std::string(to_string(kind)) + " on " + std::to_string(ranks) +
                                 " devices, batch " + std::to_string(batch) + " in " +
                                 std::to_string(m) + ", " + std::string(to_string(mode)),
                             make_schedule(kind, ranks * per_device, m, mode, per_device), *sizes});
            }
          }
        }
      }
    }
    return out;
  }();
  return cases;
}

bool is_backward(ActionKind kind) {
  return kind == ActionKind::Backward || kind == ActionKind::InputGrad ||
         kind == ActionKind::WeightGrad;
}

// A micro-batch's interval on a stage: positions in per_stage of its F and of its last B, I or W.
struct Interval {
  std::size_t first = 0, last = 0;
  bool overlaps(const Interval& o) const { return first <= o.last && o.first <= last; }
};

std::vector<Interval> intervals(const Schedule& schedule, int stage) {
  const std::vector<Action>& order = schedule.per_stage[static_cast<std::size_t>(stage)];
  std::vector<Interval> out(static_cast<std::size_t>(schedule.micro_batches));
  for (std::size_t k = 0; k < order.size(); ++k) {
    Interval& in = out[static_cast<std::size_t>(order[k].micro_batch)];
    if (order[k].kind == ActionKind::Forward) in.first = k;
    if (is_backward(order[k].kind)) in.last = std::max(in.last, k);
  }
  return out;
}

// (a) Micro-batches in flight together on a stage have different slots.
testing::AssertionResult slots_disjoint(const Schedule& schedule, const GraphPlan& plan) {
  for (int s = 0; s < schedule.stages; ++s) {
    const auto in = intervals(schedule, s);
    for (std::size_t i = 0; i < in.size(); ++i) {
      for (std::size_t j = i + 1; j < in.size(); ++j) {
        if (in[i].overlaps(in[j]) && plan.slot[s][i] == plan.slot[s][j]) {
          return testing::AssertionFailure()
                 << "stage " << s << ": micro-batches " << i << " and " << j
                 << " are in flight together in slot " << plan.slot[s][i];
        }
      }
    }
  }
  return testing::AssertionSuccess();
}

// (b) Each stage's slots are numbered from 0 and as many as its most intervals at one position.
testing::AssertionResult slots_optimal(const Schedule& schedule, const GraphPlan& plan) {
  for (int s = 0; s < schedule.stages; ++s) {
    const auto in = intervals(schedule, s);
    std::size_t busiest = 0;
    for (std::size_t k = 0; k < schedule.per_stage[s].size(); ++k) {
      busiest = std::max<std::size_t>(busiest, std::count_if(in.begin(), in.end(), [k](auto& i) {
                                        return i.first <= k && k <= i.last;
                                      }));
    }
    if (plan.slots_per_stage[s] != static_cast<int>(busiest)) {
      return testing::AssertionFailure() << "stage " << s << ": " << plan.slots_per_stage[s]
                                         << " slots for at most " << busiest << " in flight";
    }
    for (std::size_t m = 0; m < in.size(); ++m) {
      if (plan.slot[s][m] < 0 || plan.slot[s][m] >= plan.slots_per_stage[s]) {
        return testing::AssertionFailure() << "stage " << s << ": micro-batch " << m << " in slot "
                                           << plan.slot[s][m] << " of " << busiest;
      }
    }
  }
  return testing::AssertionSuccess();
}

// (c) Every action maps to the graph of its kind, its micro-batch's size and the slot of its F,
// reading and writing that slot's buffers; each stage captures exactly the keys it uses, in the
// order it first uses them.
testing::AssertionResult keys_match(const Schedule& schedule, std::span<const std::int64_t> sizes,
                                    const GraphPlan& plan) {
  std::set<int> buffers_used;
  for (int s = 0; s < schedule.stages; ++s) {
    const std::vector<Action>& order = schedule.per_stage[s];
    std::vector<char> recomputed(sizes.size(), 0), split(sizes.size(), 0);
    for (const Action& a : order) {
      if (a.kind == ActionKind::Recompute) recomputed[a.micro_batch] = 1;
      if (a.kind == ActionKind::InputGrad) split[a.micro_batch] = 1;
    }
    std::vector<int> forward_slot(sizes.size(), -1);
    std::vector<GraphKey> first_uses;
    for (const Action& a : order) {
      const GraphKey key = plan.key_of(a);
      if (a.kind == ActionKind::Forward) forward_slot[a.micro_batch] = key.slot;
      const GraphKey expected{s,
                              a.kind,
                              sizes[a.micro_batch],
                              forward_slot[a.micro_batch],
                              recomputed[a.micro_batch] != 0,
                              split[a.micro_batch] != 0};
      if (key != expected) {
        return testing::AssertionFailure() << to_string(a) << " maps to " << to_string(key)
                                           << ", expected " << to_string(expected);
      }
      if (std::find(first_uses.begin(), first_uses.end(), key) == first_uses.end()) {
        first_uses.push_back(key);
      }
      using R = BufferRole;
      const bool forward = a.kind == ActionKind::Forward,
                 recompute = a.kind == ActionKind::Recompute;
      const bool gradient = sends_gradient(a.kind);
      const std::pair<int, std::optional<R>> io[] = {
          {plan.buffers_of(key).input,
           forward || recompute ? std::optional(R::Input)
                                : (gradient ? std::optional(R::OutputGrad) : std::nullopt)},
          {plan.buffers_of(key).output,
           forward ? std::optional(R::Output)
                   : (gradient ? std::optional(R::InputGrad) : std::nullopt)}};
      for (const auto& [id, role] : io) {
        const bool right =
            role ? id >= 0 && plan.buffers.at(id) == StaticBuffer{s, key.slot, key.size, *role}
                 : id == -1;
        if (!right) return testing::AssertionFailure() << to_string(a) << ": buffer " << id;
        if (id >= 0) buffers_used.insert(id);
      }
    }
    if (plan.captures[s] != first_uses) {
      return testing::AssertionFailure()
             << "stage " << s << " captures " << plan.captures[s].size() << " graphs, not the "
             << first_uses.size() << " it uses in order of first use";
    }
  }
  if (buffers_used.size() != plan.buffers.size()) {
    return testing::AssertionFailure()
           << plan.buffers.size() << " buffers, " << buffers_used.size() << " used";
  }
  return testing::AssertionSuccess();
}

struct Event {
  enum class What { CopyIn, Capture, Work, Replay, CopyOut } what;
  GraphKey key{};     // Capture, Work, Replay
  Action action{};    // CopyIn, Work, CopyOut
  int buffer = -1;    // CopyIn, CopyOut
  bool in_capture{};  // Work
};
using What = Event::What;

// Records captures and replays, and (through calls()) the executor's copies and work, in order.
class FakeGraphRuntime : public GraphRuntime {
 public:
  void capture(const GraphKey& key, const std::function<void()>& work) override {
    log.push_back({.what = What::Capture, .key = key});
    capturing_ = true;
    work();
    capturing_ = false;
  }
  void replay(const GraphKey& key) override { log.push_back({.what = What::Replay, .key = key}); }
  GraphStepCalls calls() {
    return {
        [this](const Action& a, int buffer) {
          log.push_back({.what = What::CopyIn, .action = a, .buffer = buffer});
        },
        [this](const Action& a, const GraphKey& key) {
          log.push_back({.what = What::Work, .key = key, .action = a, .in_capture = capturing_});
        },
        [this](const Action& a, int buffer) {
          log.push_back({.what = What::CopyOut, .action = a, .buffer = buffer});
        }};
  }
  std::vector<Event> log;

 private:
  bool capturing_ = false;
};

std::vector<GraphKey> keys(std::span<const Event> log, What what) {
  std::vector<GraphKey> out;
  for (const Event& e : log) {
    if (e.what == what) out.push_back(e.key);
  }
  return out;
}

// (e) A device's log over `steps` steps of `program`: the replays are the programme's graphs in
// order, and a micro-batch copies only into and out of buffers of a slot it holds, from its F's
// copy-in until its last B, I or W has run; an F only into a slot nobody holds.
testing::AssertionResult copies_respect_slots(const Schedule& schedule,
                                              std::span<const std::int64_t> sizes,
                                              const GraphPlan& plan,
                                              const std::vector<Action>& program,
                                              std::span<const Event> log, std::size_t steps) {
  std::vector<std::vector<Interval>> in;
  for (int s = 0; s < schedule.stages; ++s) in.push_back(intervals(schedule, s));
  std::map<std::pair<int, int>, int> holder;  // (stage, slot) -> micro-batch
  std::optional<Action> done;                 // its last backward replayed: frees at the next
  std::size_t replays = 0;
  for (const Event& e : log) {
    const Action next = program[replays % program.size()];
    if (done && e.what != What::CopyOut) {
      const Action freed = *done;
      std::erase_if(holder, [&](const auto& h) {
        return h.first.first == freed.stage && h.second == freed.micro_batch;
      });
      done.reset();
    }
    if (e.what == What::CopyIn || e.what == What::CopyOut) {
      const Action& a = e.action;
      if (e.what == What::CopyIn && a != next) {
        return testing::AssertionFailure()
               << to_string(a) << " copies in before " << to_string(next);
      }
      const StaticBuffer& b = plan.buffers.at(e.buffer);
      if (b.stage != a.stage || b.size != sizes[a.micro_batch]) {
        return testing::AssertionFailure() << to_string(a) << ": copies with buffer " << e.buffer;
      }
      const auto [it, fresh] = holder.try_emplace({b.stage, b.slot}, a.micro_batch);
      if (it->second != a.micro_batch) {
        return testing::AssertionFailure()
               << to_string(a) << " copies into slot " << b.slot << " of stage " << b.stage
               << " while micro-batch " << it->second << " holds it";
      }
      if (fresh && !(e.what == What::CopyIn && a.kind == ActionKind::Forward)) {
        return testing::AssertionFailure() << to_string(a) << ": a slot its F did not take";
      }
    } else if (e.what == What::Replay) {
      if (e.key != plan.key_of(next)) {
        return testing::AssertionFailure()
               << "replay " << replays << ": " << to_string(e.key) << ", not " << to_string(next);
      }
      const Interval& i = in[next.stage][next.micro_batch];
      if (schedule.per_stage[next.stage][i.last] == next) done = next;
      ++replays;
    }
  }
  if (replays != steps * program.size()) {
    return testing::AssertionFailure() << replays << " replays for " << steps << " steps";
  }
  return testing::AssertionSuccess();
}

TEST(GraphPlan, SlotsAreDisjointOptimalAndKeysMatchEverySchedule) {
  ASSERT_GT(all_cases().size(), 300u);
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    const GraphPlan plan = plan_graphs(c.schedule, c.sizes);
    EXPECT_TRUE(slots_disjoint(c.schedule, plan));
    EXPECT_TRUE(slots_optimal(c.schedule, plan));
    EXPECT_TRUE(keys_match(c.schedule, c.sizes, plan));
  }
}

// (d) The analytic counts: 1F1B's stage s holds min(M, K - s) micro-batches; GPipe runs every
// F before any B, so all M are in flight at once, whether checkpointed or not.
TEST(GraphPlan, SlotsAreTheAnalyticCounts) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    const GraphPlan plan = plan_graphs(c.schedule, c.sizes);
    const int k = c.schedule.stages, m = c.schedule.micro_batches;
    for (int s = 0; s < k; ++s) {
      if (c.schedule.kind == ScheduleKind::OneFOneB) {
        EXPECT_EQ(plan.slots_per_stage[s], std::min(m, k - s));
      }
      if (c.schedule.kind == ScheduleKind::GPipe) {
        EXPECT_EQ(plan.slots_per_stage[s], m);
      }
    }
  }
}

// The worked table of graph_plan.hpp, and stage 2's graphs: one slot, two sizes.
TEST(GraphPlan, OneFOneBAsTheHeaderTabulates) {
  for (const CheckpointMode mode : kAllCheckpointModes) {
    const Schedule schedule = make_schedule(ScheduleKind::OneFOneB, 3, 4, mode);
    const std::vector<std::int64_t> sizes{2, 2, 2, 1};
    const GraphPlan plan = plan_graphs(schedule, sizes);
    EXPECT_EQ(plan.slot, (std::vector<std::vector<int>>{{0, 1, 2, 0}, {0, 1, 0, 1}, {0, 0, 0, 0}}));
    EXPECT_EQ(plan.slots_per_stage, (std::vector<int>{3, 2, 1}));
  }
  const Schedule schedule = make_schedule(ScheduleKind::OneFOneB, 3, 4, CheckpointMode::Never);
  const GraphPlan plan = plan_graphs(schedule, std::vector<std::int64_t>{2, 2, 2, 1});
  const auto f = ActionKind::Forward, b = ActionKind::Backward;
  EXPECT_EQ(plan.captures[2],
            (std::vector<GraphKey>{{2, f, 2, 0}, {2, b, 2, 0}, {2, f, 1, 0}, {2, b, 1, 0}}));
}

TEST(GraphPlan, RefusesWhatIsNotASchedule) {
  const Schedule schedule = make_schedule(ScheduleKind::GPipe, 2, 3, CheckpointMode::Never);
  EXPECT_THROW(plan_graphs(schedule, std::vector<std::int64_t>{3, 3}), std::invalid_argument);
  const GraphPlan plan = plan_graphs(schedule, std::vector<std::int64_t>{3, 3, 1});
  EXPECT_THROW(plan.key_of({ActionKind::Forward, 2, 0}), std::out_of_range);
  EXPECT_THROW(plan.key_of({ActionKind::Forward, 0, 3}), std::out_of_range);
}

// (e) Two steps per device: the first captures each graph once, right before its first replay
// and in the plan's order per stage, the action's work running inside the capture; the second
// only replays. Both replay one graph per action, in the device programme's order.
TEST(GraphReplayer, CapturesOnceThenOnlyReplaysInProgrammeOrder) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    const GraphPlan plan = plan_graphs(c.schedule, c.sizes);
    const auto programs = device_programs(c.schedule, c.schedule.stage_rank, c.schedule.ranks());
    for (std::size_t d = 0; d < programs.size(); ++d) {
      SCOPED_TRACE("device " + std::to_string(d));
      FakeGraphRuntime fake;
      GraphReplayer replayer(plan, fake);
      replayer.run(programs[d], fake.calls());
      const std::size_t first_step = fake.log.size();
      replayer.run(programs[d], fake.calls());
      const std::span<const Event> log(fake.log);
      const std::span<const Event> step1 = log.first(first_step), step2 = log.subspan(first_step);
      std::vector<GraphKey> replays;
      for (const Action& a : programs[d]) replays.push_back(plan.key_of(a));
      EXPECT_EQ(keys(step1, What::Replay), replays);
      EXPECT_EQ(keys(step2, What::Replay), replays);
      const std::vector<GraphKey> captured = keys(step1, What::Capture);
      for (int s = 0; s < c.schedule.stages; ++s) {
        std::vector<GraphKey> of_stage;
        std::copy_if(captured.begin(), captured.end(), std::back_inserter(of_stage),
                     [s](const GraphKey& key) { return key.stage == s; });
        const bool here = c.schedule.stage_rank[s] == static_cast<int>(d);
        EXPECT_EQ(of_stage, here ? plan.captures[s] : std::vector<GraphKey>{}) << "stage " << s;
      }
      std::set<GraphKey> replayed;
      for (std::size_t i = 0; i < step1.size(); ++i) {
        if (step1[i].what == What::Replay) replayed.insert(step1[i].key);
        if (step1[i].what != What::Capture) continue;
        EXPECT_FALSE(replayed.count(step1[i].key)) << to_string(step1[i].key);
        ASSERT_LT(i + 2, step1.size());
        EXPECT_TRUE(step1[i + 1].what == What::Work && step1[i + 1].in_capture &&
                    step1[i + 1].key == step1[i].key);
        EXPECT_TRUE(step1[i + 2].what == What::Replay && step1[i + 2].key == step1[i].key);
      }
      EXPECT_EQ(keys(step1, What::Work).size(), captured.size());
      EXPECT_TRUE(keys(step2, What::Capture).empty());
      EXPECT_TRUE(keys(step2, What::Work).empty());
      EXPECT_TRUE(copies_respect_slots(c.schedule, c.sizes, plan, programs[d], log, 2));
    }
  }
}

// A programme that is not the plan's (here run backwards) meets a graph before the ones the
// plan captures first on its stage: refused, not captured out of the pool's order.
TEST(GraphReplayer, RefusesAProgrammeOutOfThePlansOrder) {
  const Schedule schedule = make_schedule(ScheduleKind::GPipe, 2, 3, CheckpointMode::Never);
  const GraphPlan plan = plan_graphs(schedule, std::vector<std::int64_t>{3, 3, 1});
  auto program = device_programs(schedule, schedule.stage_rank, 2)[0];
  std::reverse(program.begin(), program.end());
  FakeGraphRuntime fake;
  GraphReplayer replayer(plan, fake);
  EXPECT_THROW(replayer.run(program, fake.calls()), std::logic_error);
  EXPECT_TRUE(fake.log.empty());  // refused before any copy
}

// The checkers can fail: a micro-batch put in a slot still held, a slot too many, captures out
// of order, and the copies such a plan makes, are all refused.
TEST(GraphPlanCheckers, RefuseWrongPlans) {
  const Schedule schedule = make_schedule(ScheduleKind::OneFOneB, 3, 4, CheckpointMode::Never);
  const std::vector<std::int64_t> sizes{2, 2, 2, 2};
  const GraphPlan plan = plan_graphs(schedule, sizes);
  ASSERT_TRUE(slots_disjoint(schedule, plan));
  ASSERT_TRUE(slots_optimal(schedule, plan));
  ASSERT_TRUE(keys_match(schedule, sizes, plan));

  GraphPlan clash = plan;
  clash.slot[0][3] = 1;  // 0F3 runs before 0B1 frees slot 1
  EXPECT_FALSE(slots_disjoint(schedule, clash));
  GraphPlan wasteful = plan;
  wasteful.slot[0][3] = 3;
  wasteful.slots_per_stage[0] = 4;
  EXPECT_TRUE(slots_disjoint(schedule, wasteful));
  EXPECT_FALSE(slots_optimal(schedule, wasteful));
  GraphPlan reordered = plan;
  std::swap(reordered.captures[0][0], reordered.captures[0][1]);
  EXPECT_FALSE(keys_match(schedule, sizes, reordered));

  const auto program = device_programs(schedule, schedule.stage_rank, 3)[0];
  for (const bool wrong : {false, true}) {
    FakeGraphRuntime fake;
    GraphReplayer(wrong ? clash : plan, fake).run(program, fake.calls());
    EXPECT_EQ(static_cast<bool>(copies_respect_slots(schedule, sizes, wrong ? clash : plan, program,
                                                     fake.log, 1)),
              !wrong);
  }
}

}  // namespace
}  // namespace pipetune::exec
