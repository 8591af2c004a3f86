#include "executor/graph_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>

#include "executor/graph_runtime.hpp"

namespace pipetune::exec {
namespace {

// The roles of the buffers an action's graph reads and writes (graph_plan.hpp's BufferRole).
std::pair<std::optional<BufferRole>, std::optional<BufferRole>> roles(ActionKind kind) {
  switch (kind) {
    case ActionKind::Forward:
      return {BufferRole::Input, BufferRole::Output};
    case ActionKind::Recompute:
      return {BufferRole::Input, std::nullopt};
    case ActionKind::Backward:
    case ActionKind::InputGrad:
      return {BufferRole::OutputGrad, BufferRole::InputGrad};
    case ActionKind::WeightGrad:
      break;
  }
  return {std::nullopt, std::nullopt};
}

StaticBuffer buffer_of(const GraphKey& key, BufferRole role) {
  return {key.stage, key.slot, key.size, role};
}

}  // namespace

std::string to_string(const GraphKey& key) {
  return fmt::format("stage {} {} size {} slot {}{}{}", key.stage, action_letter(key.kind),
                     key.size, key.slot, key.recomputed ? " recomputed" : "",
                     key.split ? " split" : "");
}

GraphKey GraphPlan::key_of(const Action& action) const {
  const auto s = static_cast<std::size_t>(action.stage);
  const auto m = static_cast<std::size_t>(action.micro_batch);
  const int taken = slot.at(s).at(m);
  if (taken < 0) throw std::out_of_range(to_string(action) + ": its stage runs no F of it");
  return {action.stage, action.kind,           micro_batch_sizes.at(m),
          taken,        recomputed[s][m] != 0, split[s][m] != 0};
}

GraphBuffers GraphPlan::buffers_of(const GraphKey& key) const {
  const auto [in, out] = roles(key.kind);
  return {in ? buffer_id(buffer_of(key, *in)) : -1, out ? buffer_id(buffer_of(key, *out)) : -1};
}

int GraphPlan::buffer_id(const StaticBuffer& buffer) const {
  const auto it = std::lower_bound(buffers.begin(), buffers.end(), buffer);
  return it != buffers.end() && *it == buffer ? static_cast<int>(it - buffers.begin()) : -1;
}

int GraphPlan::capture_index(const GraphKey& key) const {
  if (key.stage < 0 || static_cast<std::size_t>(key.stage) >= captures.size()) return -1;
  const auto& keys = captures[static_cast<std::size_t>(key.stage)];
  const auto it = std::find(keys.begin(), keys.end(), key);
  return it == keys.end() ? -1 : static_cast<int>(it - keys.begin());
}

GraphPlan plan_graphs(const Schedule& schedule, std::span<const std::int64_t> micro_batch_sizes) {
  const auto stages = static_cast<std::size_t>(schedule.stages);
  const auto micro_batches = static_cast<std::size_t>(schedule.micro_batches);
  if (micro_batch_sizes.size() != micro_batches) {
    throw std::invalid_argument(fmt::format("{} micro-batch sizes for {} micro-batches",
                                            micro_batch_sizes.size(), micro_batches));
  }
  GraphPlan plan;
  plan.micro_batch_sizes.assign(micro_batch_sizes.begin(), micro_batch_sizes.end());
  plan.slot.assign(stages, std::vector<int>(micro_batches, -1));
  plan.recomputed.assign(stages, std::vector<char>(micro_batches, 0));
  plan.split = plan.recomputed;
  plan.slots_per_stage.assign(stages, 0);
  plan.captures.resize(stages);
  std::set<StaticBuffer> buffers;
  for (std::size_t s = 0; s < stages; ++s) {
    const std::vector<Action>& order = schedule.per_stage[s];
    // Where each micro-batch's last action is (its B or W: R precedes B or I, I precedes W),
    // and which run differently: known before their F, whose graph it changes.
    std::vector<std::size_t> last(micro_batches, 0);
    for (std::size_t k = 0; k < order.size(); ++k) {
      const auto m = static_cast<std::size_t>(order[k].micro_batch);
      last.at(m) = k;
      if (order[k].kind == ActionKind::Recompute) plan.recomputed[s][m] = 1;
      if (order[k].kind == ActionKind::InputGrad) plan.split[s][m] = 1;
    }
    std::vector<char> busy;  // per slot
    for (std::size_t k = 0; k < order.size(); ++k) {
      const Action& a = order[k];
      int& slot = plan.slot[s][static_cast<std::size_t>(a.micro_batch)];
      if (a.kind == ActionKind::Forward) {
        if (slot >= 0) throw std::invalid_argument(to_string(a) + ": a second F");
        slot = static_cast<int>(std::find(busy.begin(), busy.end(), 0) - busy.begin());
        if (static_cast<std::size_t>(slot) == busy.size()) busy.push_back(0);
        busy[static_cast<std::size_t>(slot)] = 1;
      } else if (slot < 0) {
        throw std::invalid_argument(to_string(a) + ": before its F");
      }
      const GraphKey key = plan.key_of(a);
      if (plan.capture_index(key) < 0) {
        plan.captures[s].push_back(key);
        const auto [in, out] = roles(a.kind);
        if (in) buffers.insert(buffer_of(key, *in));
        if (out) buffers.insert(buffer_of(key, *out));
      }
      if (k == last[static_cast<std::size_t>(a.micro_batch)]) {
        busy[static_cast<std::size_t>(slot)] = 0;
      }
    }
    plan.slots_per_stage[s] = static_cast<int>(busy.size());
  }
  plan.buffers.assign(buffers.begin(), buffers.end());
  return plan;
}

// --- GraphReplayer (graph_runtime.hpp) ---

void GraphReplayer::run(std::span<const Action> program, const GraphStepCalls& calls) {
  for (const Action& a : program) {
    const GraphKey key = plan_.key_of(a);
    const int index = plan_.capture_index(key);
    if (index < 0) throw std::logic_error(to_string(a) + ": no graph planned for it");
    std::size_t& captured = captured_.at(static_cast<std::size_t>(key.stage));
    if (static_cast<std::size_t>(index) > captured) {
      // A stage's pool must fill in the plan's order: this programme is not the plan's.
      throw std::logic_error(
          fmt::format("{}: its graph ({}) is met before {}, which the plan captures first",
                      to_string(a), to_string(key),
                      to_string(plan_.captures[static_cast<std::size_t>(key.stage)][captured])));
    }
    const GraphBuffers buffers = plan_.buffers_of(key);
    if (a.kind != ActionKind::Recompute && buffers.input >= 0) calls.copy_in(a, buffers.input);
    if (static_cast<std::size_t>(index) == captured) {
      runtime_.capture(key, [&] { calls.work(a, key); });
      ++captured;
    }
    runtime_.replay(key);
    if (buffers.output >= 0) calls.copy_out(a, buffers.output);
  }
}

}  // namespace pipetune::exec
