#include "sim/planner/runtime_support.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>

#include "sim/cost_model.hpp"
#include "sim/planner/planner.hpp"

namespace pipetune {
namespace {

bool even_split(std::int64_t batch_size, int chunks) {
  const std::vector<std::int64_t> sizes = split_batch(batch_size, chunks);
  return sizes.front() == sizes.back();
}

// torch.utils.checkpoint recomputes once per autograd call that reaches the stage's saved
// tensors, and torch's split backward makes one for I and one for each of W's parameter groups.
constexpr std::string_view kRecomputesPerAutogradCall =
    "torch recomputes a checkpointed stage at its I and again for each of its W's parameter "
    "groups (a stage of L layers with weights runs its forward L + 1 times more)";

}  // namespace

std::string torch_cannot_run(const Plan& plan, std::int64_t batch_size) {
  if (!even_split(batch_size, plan.chunks)) {
    const std::vector<std::int64_t> sizes = split_batch(batch_size, plan.chunks);
    return fmt::format(
        "a batch of {} in {} chunks makes micro-batches of {} and {}: torch's stages check every "
        "micro-batch against one shape",
        batch_size, plan.chunks, sizes.front(), sizes.back());
  }
  if (plan.checkpoint == CheckpointMode::ExceptLast) {
    return "checkpoint except_last: torch's PipelineStage runs one module for every micro-batch";
  }
  if (plan.checkpoint == CheckpointMode::Always && splits_backward(plan.schedule)) {
    return fmt::format("checkpoint always under {}: {}", to_string(plan.schedule),
                       kRecomputesPerAutogradCall);
  }
  return "";
}

std::string torch_changed_stage_input(const Plan& plan, const Profile& profile,
                                      const SizeCosts& costs) {
  const int layers = static_cast<int>(profile.layer_count());
  int first = 0;
  for (std::size_t s = 0; s < plan.balance.size(); first += plan.balance[s], ++s) {
    const int end = first + plan.balance[s];
    // Stage 0's input is the micro-batch itself, which needs no gradient.
    if (s == 0 || end > layers || !costs.copies_input(first, end)) continue;
    const int layer = costs.input_decider[static_cast<std::size_t>(first)];
    return fmt::format(
        "stage {} {} layer '{}', which changes its input in place: torch hands the stage its "
        "input as a leaf that needs a gradient, which autograd does not let change (cut "
        "elsewhere, or make that layer out of place)",
        s, layer == first ? "starts with" : "reaches its input through views in",
        profile.layers[static_cast<std::size_t>(layer)].name);
  }
  return "";
}

std::string torch_changed_stage_input(const Plan& plan, const Profile& profile) {
  const CostModel model(profile);
  return torch_changed_stage_input(plan, profile, model.at(profile.micro_batch_sizes.front()));
}

std::string torch_view_stage_output(const Plan& plan, const Profile& profile) {
  if (!splits_backward(plan.schedule)) return "";
  const int layers = static_cast<int>(profile.layer_count());
  const auto& l = profile.layers;
  int first = plan.balance.empty() ? 0 : plan.balance.front();
  for (std::size_t s = 1; s + 1 < plan.balance.size(); first += plan.balance[s], ++s) {
    const int end = first + plan.balance[s];
    if (end > layers) break;
    // In-place layers hand on the tensor they were given; the first other one decides.
    int k = end - 1;
    while (k > first && l[static_cast<std::size_t>(k)].modifies_input) --k;
    const LayerProfile& decider = l[static_cast<std::size_t>(k)];
    if (!decider.output_aliases_input || decider.modifies_input) continue;
    return fmt::format(
        "stage {} ends with layer '{}', whose output is a view of its input: torch's zero-bubble "
        "I detaches a stage's output in place, which a view refuses (cut elsewhere)",
        s, decider.name);
  }
  return "";
}

int frozen_stem_cuts_end(const Profile& profile) {
  const CostModel model(profile);
  const int layers = static_cast<int>(profile.layer_count());
  int end = 1;
  while (end < layers && !model.input_needs_gradient(end)) ++end;
  return end;
}

std::string torch_frozen_stem_unmodelled(const Plan& plan, const Profile& profile) {
  const int stem_cuts_end = frozen_stem_cuts_end(profile);
  int first = 0;
  for (std::size_t s = 0; s + 1 < plan.balance.size(); ++s) {
    first += plan.balance[s];
    if (first <= 0 || first >= stem_cuts_end) continue;
    return fmt::format(
        "stage {} starts inside the frozen stem (no layer before layer '{}' trains): torch asks a "
        "gradient of every stage's input, so it builds a graph there and sends gradients back, "
        "which the profile does not hold: time and memory are predicted short",
        s + 1, profile.layers[static_cast<std::size_t>(first)].name);
  }
  return "";
}

std::string keep_what_the_runtime_runs(PlannerOptions& options, const Hardware& hardware,
                                       std::int64_t batch_size) {
  if (hardware.runtime != Runtime::TorchPipelining) return "";
  std::vector<int> chunks = options.chunks;
  if (chunks.empty()) {
    for (int c = 1; c <= max_chunks(batch_size); ++c) chunks.push_back(c);
  }
  std::erase_if(chunks, [&](int c) { return !even_split(batch_size, c); });
  std::erase(options.checkpoints, CheckpointMode::ExceptLast);
  options.checkpointed_split_backward = false;
  if (chunks.empty()) {
    return fmt::format(
        "no chunk count asked for splits the batch of {} evenly, as torch's stages need",
        batch_size);
  }
  if (options.checkpoints.empty()) {
    return "torch's PipelineStage cannot checkpoint all but the last micro-batch "
           "(except_last); ask for never or always";
  }
  const bool runs_one =
      std::any_of(options.schedules.begin(), options.schedules.end(), [&](ScheduleKind kind) {
        return !splits_backward(kind) ||
               std::find(options.checkpoints.begin(), options.checkpoints.end(),
                         CheckpointMode::Never) != options.checkpoints.end();
      });
  if (!runs_one) {
    return fmt::format(
        "checkpoint always under a split backward: {}; ask for never or another "
        "schedule",
        kRecomputesPerAutogradCall);
  }
  options.chunks = std::move(chunks);
  return "";
}

std::string keep_what_the_runtime_runs(PlannerOptions& options, const Hardware& hardware,
                                       const Profile& profile) {
  std::string refused = keep_what_the_runtime_runs(options, hardware, profile.batch_size);
  if (refused.empty() && hardware.runtime == Runtime::TorchPipelining) {
    options.stage_inputs_unchanged =
        std::any_of(profile.layers.begin(), profile.layers.end(),
                    [](const LayerProfile& l) { return l.modifies_input; });
    options.stage_outputs_detachable = std::any_of(
        profile.layers.begin(), profile.layers.end(),
        [](const LayerProfile& l) { return l.output_aliases_input && !l.modifies_input; });
  }
  return refused;
}

}  // namespace pipetune
