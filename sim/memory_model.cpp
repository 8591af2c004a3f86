#include "sim/memory_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace pipetune {

namespace {

// A backward walk's levels, last layer first: its peak (≥ 0, the level at its start) and two
// steps down from it. Once the last layer that reaches the peak has ended, only the later
// layers' levels (and the net) count: `after_layer`, from `layer_end`. Where the profile
// records when that layer is done with its own peak, from that point (`peak_end`) its level
// less the recorded drop counts too: `after_peak`, at least `after_layer`. Without a record the
// two steps are one (after_peak = after_layer, peak_end = layer_end). Times are fractions of the
// walk's time by its layers' `ms`.
struct PeakTracker {
  PeakTracker(const std::vector<double>& ms, int first, int end)
      : PeakTracker(&ms, sum_ms(ms, first, end)) {}
  // With the walk's total time already summed (both backward walks share it); without `ms`,
  // levels alone: the fractions stay 1 (a serial sum of every layer's time is most of a walk,
  // and the planner's memory bound reads no time).
  PeakTracker(const std::vector<double>* ms, double total) : ms(ms), total_ms(total) {
    layer_end_ms = release_ms = total_ms;  // no layer above the start: nothing to free
  }
  static double sum_ms(const std::vector<double>& ms, int first, int end) {
    double total = 0.0;
    for (int k = first; k < end; ++k) total += ms[k];
    return total;
  }
  // Layer k peaks at `level`; from `release` of its time on it stays at or below `after`
  // (after ≥ level: only its end is known).
  void layer(int k, std::int64_t level, double release = 1.0,
             std::int64_t after = std::numeric_limits<std::int64_t>::max()) {
    const double before_ms = elapsed_ms;
    if (ms) elapsed_ms += (*ms)[k];
    if (level >= peak) {
      peak = level;
      later = std::numeric_limits<std::int64_t>::min();
      layer_end_ms = elapsed_ms;
      released = after < level;
      within = released ? after : level;
      release_ms = released && ms ? before_ms + release * (*ms)[k] : elapsed_ms;
    } else {
      later = std::max(later, level);
    }
  }
  // A net above the peak (a measured peak below what the layer keeps) is allocated at the end.
  void finish(std::int64_t net) {
    auto fraction = [&](double at_ms) { return total_ms > 0.0 ? at_ms / total_ms : 1.0; };
    after_layer = std::min(peak, std::max(later, net));
    after_peak = released ? std::max(after_layer, within) : after_layer;
    layer_end = fraction(layer_end_ms);
    peak_end = fraction(release_ms);
  }

  const std::vector<double>* ms;
  double total_ms = 0.0, elapsed_ms = 0.0;
  std::int64_t peak = 0;
  double peak_end = 1.0, layer_end = 1.0;
  std::int64_t after_peak = 0, after_layer = 0;
  // The peak layer's end and own release, and its level after that; the later layers' top.
  double layer_end_ms = 0.0, release_ms = 0.0;
  bool released = false;
  std::int64_t within = 0, later = 0;  // the start's level, until a layer reaches the peak
};

// What each layer's W frees, found along the forward walk. W runs first layer first and frees
// each layer's graph as it goes, so a layer with parameters frees its saved tensors, and a kept
// storage goes with the W of the last layer keeping it, unless a keeper has no parameters (its
// graph stays until W ends) or the storage is the output of a layer with parameters (the
// executor holds those boundaries for W until it ends). Inactive (the planner's bounds, which
// read no W term), it allocates and records nothing.
struct WeightFrees {
  WeightFrees(const CostModel& model, int first, int end, bool active)
      : model(model),
        first(first),
        active(active),
        by_layer(active ? static_cast<std::size_t>(end - first) : 0, 0) {}
  bool trains(int k) const { return model.trained_bytes_of(k) > 0; }
  void saved(int k, std::int64_t bytes) {
    if (active && trains(k)) by_layer[k - first] += bytes;
  }
  void keeper(int k) {
    if (!active) return;
    last_keeper = k;
    keepers_train = keepers_train && trains(k);
  }
  void output_of(int k) { held = active && (held || trains(k)); }
  // The current storage is replaced (or the walk ends with it).
  void storage_dies(std::int64_t bytes) {
    if (active && bytes > 0 && last_keeper >= 0 && keepers_train && !held)
      by_layer[last_keeper - first] += bytes;
    last_keeper = -1;
    keepers_train = true;
    held = false;
  }

  const CostModel& model;
  int first;
  bool active;
  std::vector<std::int64_t> by_layer;
  int last_keeper = -1;
  bool keepers_train = true, held = false;
};

// The top of the in-place chain above trained layer j: the last of the layers after it that
// change their input in place and train nothing (torchvision's ReLU(inplace=True) after a
// convolution or a batch norm), j itself where none does. The executor's boundary for j is then
// that one storage, its autograd history the chain's top.
int in_place_chain_top(const CostModel& model, const SizeCosts& c, int j, int end) {
  int top = j;
  while (top + 1 < end && c.modifies[top + 1] && c.aliases[top + 1] &&
         model.trained_bytes_of(top + 1) == 0)
    ++top;
  return top;
}

// W's walk, layer by layer in the order the executor runs it (first layer first), both
// variants. A layer's W peaks at its measured W peak (backward_weight_peak_bytes) where the
// profile has one. Else it is its backward without the input gradient: the profile's measured
// backward peak (held variant: W's output gradient is kept by I, not owned by autograd) less the
// gradient of the layer's input, which the profiler computes for every layer whose input needs
// one (all but those up to the model's first that trains). It is the first backward's peak in both
// variants: W's autograd.grad hands back every parameter gradient of the layer at once, fresh,
// before they are added into .grad, where a backward's AccumulateGrad adds (and frees) each as it
// comes. That peak may be below the layer's parameters: a layer of many blocks (a ConvNeXt or
// ResNet stage as one child) frees each block's saved tensors as the walk passes it, while the
// gradients of the blocks before it are still to be made. Once it is done, the layer's first W
// leaves its parameter gradients as .grad, and autograd frees what `freed_by_weight` says that
// layer's graph held.
void set_weight_backward(const CostModel& model, const SizeCosts& c, int first, int end,
                         const std::vector<std::int64_t>& freed_by_weight, StageMemory& m) {
  const bool measured = !c.backward_peak_bytes.empty();
  const double total_ms = PeakTracker::sum_ms(c.backward_weight_ms, first, end);
  for (bool first_weight : {false, true}) {
    PeakTracker walk(&c.backward_weight_ms, total_ms);
    std::int64_t level = 0;
    for (int k = first; k < end; ++k) {
      const std::int64_t params = model.trained_bytes_in(k, first, k);  // W runs first layer first
      if (params == 0) {
        walk.layer(k, level);
        continue;
      }
      const std::int64_t input_grad = model.input_needs_gradient(k) ? c.output_bytes[k - 1] : 0;
      const std::int64_t own =
          !c.backward_weight_peak_bytes.empty()
              ? c.backward_weight_peak_bytes[k]
              : (measured ? std::max<std::int64_t>(0, c.backward_peak_bytes[k] - input_grad)
                          : params);
      // Under an in-place chain that tops inside the stage, W asks the weights' gradients of the
      // chain's top with the gradient I held there: autograd runs the chain's backward again, a
      // fresh gradient of k's output. (SqueezeNet's first convolution and its in-place ReLU
      // before a max pooling: its device 0.98 MB short at 4 samples, -8 %.)
      const int top = in_place_chain_top(model, c, k, end);
      const std::int64_t chain = top > k && top < end - 1 ? c.output_bytes[k] : 0;
      walk.layer(k, level + own + chain);
      level += (first_weight ? params : 0) - freed_by_weight[k - first];
    }
    walk.finish(level);
    m.weight_backward[first_weight ? 1 : 0] = {walk.peak, walk.after_peak, walk.after_layer,
                                               walk.peak_end, walk.layer_end};
  }
}

// Layer k's I above the level it starts at, making `input_grad`: measured where the profile has
// it (a layer of many operators keeps every saved tensor through I, so the gradients inside it
// pile up: a transformer layer's attention gradients), else its input gradient and workspace.
std::int64_t input_backward_above(const SizeCosts& c, int k, std::int64_t input_grad) {
  return c.backward_input_peak_bytes.empty() ? input_grad + c.workspace_bytes[k]
                                             : std::max(input_grad, c.backward_input_peak_bytes[k]);
}

// I as pipetune's executor runs it: the backward's walk without parameter gradients and without
// freeing activations (W frees them); a layer's output gradient stays when the layer has
// parameters (`kept_for_weights`, for W).
InputBackwardMemory executor_input_backward(const CostModel& model, const SizeCosts& c, int first,
                                            int end, bool last_stage, const auto& input_gradient) {
  PeakTracker walk(c.backward_input_ms, first, end);
  InputBackwardMemory out;
  std::int64_t current = 0;
  // The model's last stage makes its output's gradient itself, from the loss (elsewhere it is
  // received), inside its last layer's I: the measured peak of that layer, timed with the loss,
  // holds it already. With parameters to take it, the layer then keeps it for W like any other.
  const std::int64_t loss_gradient =
      last_stage && model.trained_bytes_of(end - 1) > 0 ? c.output_bytes[end - 1] : 0;
  out.kept_for_weights += loss_gradient;
  // A layer that trains followed by layers changing its output in place (torchvision's
  // ReLU(inplace=True) after a batch norm): the executor's boundary is that one storage, so I
  // captures the gradient at the top of the in-place chain (the input gradient of the layer
  // above it) from when that layer's backward makes it, and the gradient of the trained layer's
  // own output passes through. (torchvision's ResNet-18 with its stem's max pooling in the first
  // stage: 2 MB short at 8 samples, -13.6 %.) A chain reaching the stage's output is seeded by
  // the received gradient; the walk keeps the trained layer's gradient there, over by as much.
  // Per layer of the stage: it tops such a chain (holds the gradient), or it is the trained layer
  // under one (its own output gradient passes through).
  std::vector<char> holds(static_cast<std::size_t>(end - first), 0), passes(holds);
  for (int j = first; j < end - 1; ++j) {
    if (model.trained_bytes_of(j) == 0) continue;
    const int top = in_place_chain_top(model, c, j, end);
    if (top > j && top < end - 1) holds[top - first] = passes[j - first] = 1;
  }
  for (int k = end - 1; k >= first; --k) {
    const std::int64_t input_grad = input_gradient(k);
    const std::int64_t own_loss_gradient = k == end - 1 ? loss_gradient : 0;
    walk.layer(k, current + std::max(input_backward_above(c, k, input_grad),
                                     own_loss_gradient + input_grad));
    current += input_grad + own_loss_gradient;
    if (k < end - 1) {
      if (model.trained_bytes_of(k) > 0) {
        out.kept_for_weights += c.output_bytes[k];
        if (passes[k - first]) current -= input_gradient(k + 1);  // held above, same bytes
      } else if (!holds[k - first]) {
        current -= input_gradient(k + 1);
      }
    }
  }
  walk.finish(current);
  out.peak = walk.peak;
  out.net = current;
  out.after_peak = walk.after_peak;
  out.peak_end = walk.peak_end;
  out.after_layer = walk.after_layer;
  out.layer_end = walk.layer_end;
  return out;
}

// What torch's I keeps of layer k for W, in a stage ending at `end`: its count, and the gradient
// of its output where its last operation has weights (the stage's received gradient aside).
std::int64_t torch_kept_for_weights(const SizeCosts& c, int k, int end,
                                    const auto& input_gradient) {
  const bool keeps_output = k < end - 1 && c.torch_keeps_output_gradient[k];
  return c.torch_weight_gradient_bytes[k] + (keeps_output ? input_gradient(k + 1) : 0);
}

// I as torch.distributed.pipelining runs it: its input gradients with the stage's graph kept,
// and, for W, the gradient flowing into every operation with weights, where the executor keeps
// one per layer that trains. Layer k keeps its count (the last stage's last layer's includes
// the loss's gradient of the output where kept) and drops the gradient of its output unless its
// last operation has weights; the stage's received gradient is torch's buffer, counted there.
InputBackwardMemory torch_input_backward(const CostModel& model, const SizeCosts& c, int first,
                                         int end, const auto& input_gradient) {
  PeakTracker walk(c.backward_input_ms, first, end);
  const auto& kept = c.torch_weight_gradient_bytes;
  const auto& keeps_output = c.torch_keeps_output_gradient;
  std::int64_t level = 0, for_weights = 0;
  for (int k = end - 1; k >= first; --k) {
    const std::int64_t input_grad = input_gradient(k);
    // The profile's measured I peak is the executor's; torch's layer holds at least what it
    // keeps and the input gradient it makes at once. The last layer's was timed with the loss,
    // so it holds the loss's gradient of the output already (GPT-2's head at 4 samples: torch's
    // I peaked 1,024,004 bytes above its start, the profile's peak; with that gradient added
    // again the rank was predicted 10.6 % over).
    walk.layer(k, level + std::max(input_backward_above(c, k, input_grad), input_grad + kept[k]));
    level += input_grad + kept[k];
    for_weights += torch_kept_for_weights(c, k, end, input_gradient);
    if (k < end - 1 && !keeps_output[k]) level -= input_gradient(k + 1);
  }
  // As I ends torch detaches the stage's output: what only the stage's top layers without
  // weights, and its last layer with weights above its last such operation, saved dies.
  std::int64_t freed = 0;
  for (int k = end - 1; k >= first; --k) {
    freed += c.torch_freed_by_input_bytes[k];
    if (model.trained_bytes_of(k) > 0) break;
  }
  level -= freed;
  walk.finish(level);
  return {walk.peak,     level,          walk.after_peak, walk.after_layer,
          walk.peak_end, walk.layer_end, for_weights,     freed};
}

// W as torch runs it, first layer first: each layer peaks where the profile measured torch's W
// of it alone, above where the layers before left the level; it then frees the gradients I
// kept for it and, the first time, keeps its weights' gradients. W asks autograd for the
// weights' gradients without keeping the graph, so what only a layer's operations with weights
// saved goes as they are done (the profile's torch_weight_freed_bytes, and its input where only
// they saved it); the rest of what autograd saved goes when the graph dies, at W's end.
// (Measured on torchvision's ResNet at 2 samples: a later W of `layer3` and `layer4` peaks 18.4
// MB above its start, two copies of its largest convolution's weights, where the executor's W
// holds the 33.6 MB of `layer4`'s gradients at once; a GPT-2 block's 0.26 MB, below its 0.79 MB
// of weights. A first W of `maxpool`, `layer1` and `layer2` at 2 samples peaks 0.92 MB above
// its start, once `layer1`'s W has freed 0.66 MB of activations before `layer2` makes its
// 2.1 MB of gradients.)
WeightBackwardMemory torch_weight_backward(const CostModel& model, const SizeCosts& c, int first,
                                           int end, const auto& input_gradient, bool first_weight) {
  PeakTracker walk(c.backward_weight_ms, first, end);
  const bool frees = !c.torch_weight_freed_bytes.empty();
  std::int64_t level = 0;
  for (int k = first; k < end; ++k) {
    const std::int64_t params = model.trained_bytes_in(k, first, k);
    const std::int64_t peak =
        first_weight ? c.torch_weight_peak_bytes[k] : c.torch_weight_accumulate_peak_bytes[k];
    walk.layer(k, level + peak);
    level += (first_weight ? params : 0) - torch_kept_for_weights(c, k, end, input_gradient);
    if (!frees) continue;
    // The input is the layer before's output, its own storage unless that layer made a view;
    // the stage's input is torch's buffer (or what the stage before sent), never freed here.
    const bool input_freed =
        k > first && c.torch_weight_frees_input[k] && !c.keeps_output[k - 1] && !c.aliases[k - 1];
    level -= c.torch_weight_freed_bytes[k] + (input_freed ? c.output_bytes[k - 1] : 0);
  }
  walk.finish(level);
  return {walk.peak, walk.after_peak, walk.after_layer, walk.peak_end, walk.layer_end};
}

struct ForwardWalk {
  std::int64_t kept, peak;  // bytes kept for the backward; the walk's peak, kept included
};

// Forward with autograd, storage by storage. The current activation lives in `storage` (bytes; 0
// for the stage input's, counted elsewhere, unless the stage changes its input in place and so
// starts on a copy of it: then the copy's, `input_copy`). Until a layer keeps that storage it is
// loose: alive while the next layers use it, gone once one makes a storage of its own. A kept
// storage is released by the backward of the first layer that kept it (`released`, by layer
// from `first`), except the stage output's, which the executor holds and the simulator frees
// when the backward ends.
//
// A micro-batch whose backward is split (I, then W) runs its forward layer by layer, and the
// executor holds the output of every layer with parameters that train until W ends (W asks each
// such layer's weight gradients of its own output): a storage nobody else keeps (a GroupNorm's
// output that the Sigmoid after it reads but does not keep) stays too, and on the last stage so
// do the logits when the last layer trains. That walk (`split`) records nothing for the
// backward, which the plain walk's records serve: `released` and `weight_frees` are null then.
ForwardWalk forward_walk(const CostModel& model, const SizeCosts& c, int first, int end,
                         bool last_stage, std::int64_t input_copy, bool split,
                         std::vector<std::int64_t>* released, WeightFrees* weight_frees) {
  const bool record = released != nullptr;
  std::int64_t kept = 0, storage = input_copy, peak = 0;
  int kept_by = -1;
  for (int k = first; k < end; ++k) {
    const std::int64_t made = c.aliases[k] ? 0 : c.output_bytes[k];
    const std::int64_t loose = kept_by < 0 ? storage : 0;
    peak = std::max(peak, kept + loose + c.saved_bytes[k] + made + c.workspace_bytes[k]);
    kept += c.saved_bytes[k];
    if (record) weight_frees->saved(k, c.saved_bytes[k]);
    auto keep = [&] {
      if (storage == 0) return;
      if (record) weight_frees->keeper(k);
      if (kept_by >= 0) return;
      kept += storage;
      if (record) (*released)[k - first] += storage;
      kept_by = k;
    };
    if (c.keeps_input[k]) keep();
    if (!c.aliases[k]) {
      if (record) weight_frees->storage_dies(storage);
      storage = made;
      kept_by = -1;
    }
    if (record) weight_frees->output_of(k);
    if (c.keeps_output[k]) keep();
    if (split && model.trained_bytes_of(k) > 0) keep();
  }
  if (last_stage) {
    if (record) weight_frees->storage_dies(storage);  // elsewhere the executor holds the output
  } else if (kept_by < 0) {
    kept += storage;
  } else if (record) {
    (*released)[kept_by - first] -= storage;
  }
  return {kept, peak};
}

// Forward without autograd (checkpointed): each intermediate storage dies once the next layer
// that makes its own has run; only the stage output survives. Its peak, the output included.
std::int64_t checkpointed_forward_peak(const SizeCosts& c, int first, int end,
                                       std::int64_t input_copy) {
  std::int64_t peak = 0, storage = input_copy;
  for (int k = first; k < end; ++k) {
    const std::int64_t made = c.aliases[k] ? 0 : c.output_bytes[k];
    peak = std::max(peak, storage + made + c.workspace_bytes[k]);
    if (!c.aliases[k]) storage = made;
  }
  return peak;
}

// Backward, last layer first, as the micro-batch's first backward of the step (parameter
// gradients made: they become .grad and stay) and as a later one (added into .grad and freed, a
// transient of the same size). Layer k allocates the gradient of its input and of its
// parameters plus its workspace; afterwards autograd releases k's saved tensors, the storages k
// was the first to keep (`released`) and the gradient of its output (an intermediate).
void backward_walks(const CostModel& model, const SizeCosts& c, int first, int end,
                    const std::vector<std::int64_t>& released, const auto& input_gradient,
                    bool timed, StageMemory& m) {
  const double backward_total_ms = timed ? PeakTracker::sum_ms(c.backward_ms, first, end) : 0.0;
  for (bool first_backward : {false, true}) {
    PeakTracker walk(timed ? &c.backward_ms : nullptr, backward_total_ms);
    std::int64_t current = 0;
    for (int k = end - 1; k >= first; --k) {
      const std::int64_t input_grad = input_gradient(k);
      const std::int64_t param_grad = first_backward ? model.trained_bytes_in(k, k + 1, end) : 0;
      // Measured when the profile has it (inside the stage, the output and its gradient die
      // early); else every gradient plus the workspace at once.
      std::int64_t peak_above =
          input_grad + model.trained_bytes_in(k, k + 1, end) + c.workspace_bytes[k];
      if (!c.backward_peak_bytes.empty()) {
        const bool inside = k < end - 1;
        const auto& measured = first_backward
                                   ? (inside ? c.inner_backward_peak_bytes : c.backward_peak_bytes)
                                   : (inside ? c.inner_backward_accumulate_peak_bytes
                                             : c.backward_accumulate_peak_bytes);
        peak_above = measured[k];
      }
      std::int64_t next =
          current + input_grad + param_grad - c.saved_bytes[k] - released[k - first];
      if (k < end - 1) next -= input_gradient(k + 1);  // k's output gradient, if it had one
      if (c.backward_peak_end.empty()) {
        walk.layer(k, current + peak_above);
      } else {
        // Measured: the layer is done with its peak before it ends, though never below where
        // the walk leaves it.
        const std::int64_t level = current + peak_above;
        walk.layer(k, level, c.backward_peak_end[k],
                   std::max(next, level - c.backward_peak_drop_bytes[k]));
      }
      current = next;
    }
    walk.finish(current);
    (first_backward ? m.backward_peak_first : m.backward_peak) = walk.peak;
    (first_backward ? m.backward_net_first : m.backward_net) = current;
    (first_backward ? m.backward_after_peak_first : m.backward_after_peak) = walk.after_peak;
    (first_backward ? m.backward_peak_end_first : m.backward_peak_end) = walk.peak_end;
    (first_backward ? m.backward_after_layer_first : m.backward_after_layer) = walk.after_layer;
    (first_backward ? m.backward_layer_end_first : m.backward_layer_end) = walk.layer_end;
  }
}

}  // namespace

StageMemory stage_memory(const CostModel& model, const SizeCosts& c, int first, int end,
                         bool first_stage, StageMemoryTerms terms) {
  StageMemory m;
  m.input_bytes = c.stage_input_bytes(first);
  m.output_bytes = c.output_bytes[end - 1];
  m.buffer_bytes = model.buffer_bytes(first, end);
  // The gradient of layer k's input, made by k's backward: none where it needs none (the
  // layers up to a frozen stem's end, CostModel::input_needs_gradient), nor on the first stage.
  const auto input_gradient = [&](int k) -> std::int64_t {
    if (k > first) return model.input_needs_gradient(k) ? c.output_bytes[k - 1] : 0;
    return first_stage || (first > 0 && !model.input_needs_gradient(first)) ? 0 : m.input_bytes;
  };
  const bool last_stage = end == static_cast<int>(c.output_bytes.size());
  m.input_gradient_bytes = input_gradient(first);
  m.output_gradient_bytes = !last_stage && model.input_needs_gradient(end) ? m.output_bytes : 0;

  std::vector<std::int64_t> released(static_cast<std::size_t>(end - first), 0);
  const std::int64_t input_copy = c.copies_input(first, end) ? m.input_bytes : 0;
  const bool all = terms == StageMemoryTerms::All;
  WeightFrees weight_frees(model, first, end, all);
  const ForwardWalk plain =
      forward_walk(model, c, first, end, last_stage, input_copy, false, &released, &weight_frees);
  m.kept_bytes = plain.kept;
  m.forward_transient = plain.peak - plain.kept;
  if (all) {
    const ForwardWalk split =
        forward_walk(model, c, first, end, last_stage, input_copy, true, nullptr, nullptr);
    m.split_kept_bytes = split.kept;
    m.split_forward_transient = split.peak - split.kept;
    m.checkpointed_forward_transient = std::max<std::int64_t>(
        0, checkpointed_forward_peak(c, first, end, input_copy) - m.output_bytes);
  }
  backward_walks(model, c, first, end, released, input_gradient, all, m);
  if (!all) return m;

  m.input_backward = executor_input_backward(model, c, first, end, last_stage, input_gradient);
  set_weight_backward(model, c, first, end, weight_frees.by_layer, m);
  m.torch_input = m.input_backward;
  m.torch_weight = m.weight_backward;
  if (!c.torch_weight_gradient_bytes.empty()) {
    m.torch_input = torch_input_backward(model, c, first, end, input_gradient);
    for (int first_weight = 0; first_weight < 2 && !c.torch_weight_peak_bytes.empty();
         ++first_weight) {
      m.torch_weight[first_weight] =
          torch_weight_backward(model, c, first, end, input_gradient, first_weight == 1);
    }
  }
  return m;
}

std::int64_t resident_bytes(std::int64_t held, std::int64_t trained,
                            double optimizer_state_factor) {
  return held + std::llround(static_cast<double>(trained) * optimizer_state_factor);
}

std::int64_t dies_with_backward(const StageMemory& m, bool last_stage, bool own_input) {
  return (last_stage ? 0 : m.output_bytes + m.output_gradient_bytes) +
         (own_input ? m.input_bytes : 0);
}

MemoryEffect forward_effect(const StageMemory& m, bool checkpointed, bool last_stage, bool split) {
  if (checkpointed) {
    return {m.output_bytes + m.checkpointed_forward_transient,
            m.checkpointed_forward_transient + (last_stage ? m.output_bytes : 0)};
  }
  return recompute_effect(m, split);
}

MemoryEffect recompute_effect(const StageMemory& m, bool split) {
  if (split) return {m.split_kept_bytes + m.split_forward_transient, m.split_forward_transient};
  return {m.kept_bytes + m.forward_transient, m.forward_transient};
}

MemoryEffect recompute_task_effect(const StageMemory& m, bool split) {
  MemoryEffect effect = recompute_effect(m, split);
  effect.allocated += m.buffer_bytes;
  effect.freed += m.buffer_bytes;
  return effect;
}

MemoryEffect backward_effect(const StageMemory& m, bool first_time, std::int64_t dies) {
  const std::int64_t peak = first_time ? m.backward_peak_first : m.backward_peak;
  const std::int64_t net = first_time ? m.backward_net_first : m.backward_net;
  const std::int64_t after_peak = first_time ? m.backward_after_peak_first : m.backward_after_peak;
  const std::int64_t after_layer =
      first_time ? m.backward_after_layer_first : m.backward_after_layer;
  return {peak,
          (after_layer - net) + dies,
          peak - after_peak,
          first_time ? m.backward_peak_end_first : m.backward_peak_end,
          after_peak - after_layer,
          first_time ? m.backward_layer_end_first : m.backward_layer_end};
}

MemoryEffect input_backward_effect(const StageMemory& m, bool torch) {
  // The graph stays: I leaves its input gradient and the gradients W reads.
  const InputBackwardMemory& i = torch ? m.torch_input : m.input_backward;
  return {i.peak,     i.after_layer - i.net,        i.peak - i.after_peak,
          i.peak_end, i.after_peak - i.after_layer, i.layer_end};
}

MemoryEffect weight_backward_effect(const StageMemory& m, std::int64_t param_bytes, bool first_time,
                                    bool last_stage, std::int64_t dies, bool torch) {
  // The walk's peak and steps down (the first time it leaves the parameter gradients as .grad);
  // at its end the rest of the graph's activations, the gradients I kept and what dies with
  // any backward.
  const InputBackwardMemory& i = torch ? m.torch_input : m.input_backward;
  const std::int64_t net = (first_time ? param_bytes : 0) - i.kept_for_weights -
                           (torch ? m.kept_bytes - i.freed_saved : m.split_kept_bytes) +
                           (last_stage ? 0 : m.output_bytes) - dies;
  const WeightBackwardMemory& w = (torch ? m.torch_weight : m.weight_backward)[first_time ? 1 : 0];
  std::int64_t peak = w.peak, after_peak = w.after_peak, after_layer = w.after_layer;
  if (torch) {
    // torch's walk frees what I kept as it goes; what I already freed of the graph may be
    // counted again by the graph's walk, so the steps never go below the net.
    after_layer = std::max(after_layer, net);
    after_peak = std::max(after_peak, after_layer);
    peak = std::max(peak, after_peak);
  }
  return {peak,       after_layer - net,        peak - after_peak,
          w.peak_end, after_peak - after_layer, w.layer_end};
}

std::int64_t left_by_backward(const StageMemory& m, bool first_time, bool last_stage) {
  return m.kept_bytes + (first_time ? m.backward_net_first : m.backward_net) -
         (last_stage ? 0 : m.output_bytes) - m.input_gradient_bytes;
}

std::int64_t peak_bound_before_backward(std::int64_t baseline,
                                        const std::array<StageMemory, 2>& memory,
                                        const BeforeBackward& state, bool last_stage) {
  const StageMemory& q = memory[state.slot];
  std::int64_t others = 0;  // in flight besides q
  for (int slot = 0; slot < 2; ++slot) {
    others += state.kept_forwards[slot] * memory[slot].kept_bytes;
    others += state.received_inputs[slot] * memory[slot].input_bytes;
  }
  if (!state.recomputed) others -= q.kept_bytes;
  if (state.received_inputs[state.slot] > 0) others -= q.input_bytes;
  const std::int64_t input = state.received_inputs[state.slot] > 0 ? q.input_bytes : 0;
  // The gradient from the next device arrives before the backward can start.
  const std::int64_t received_gradient = last_stage ? 0 : q.output_gradient_bytes;
  const std::int64_t level = baseline + (state.first ? 0 : state.left_by_earlier) + others +
                             q.kept_bytes + input + received_gradient;
  std::int64_t bound = level + backward_effect(q, state.first, 0).allocated;
  if (state.first) {
    // Once it ends (its frees are exact; the input gradient's copy has not started).
    const MemoryEffect b = backward_effect(q, true, dies_with_backward(q, last_stage, input > 0));
    bound =
        std::max(bound, level + b.allocated - b.freed_after_peak - b.freed_after_layer - b.freed);
  }
  return bound;
}

StagePeakShape stage_peak_shape(const CostModel& model, const Plan& plan, int stages) {
  const Profile& profile = model.profile();
  const std::vector<std::int64_t> sizes = split_batch(profile.batch_size, plan.chunks);
  StagePeakShape shape;
  shape.schedule = plan.schedule;
  shape.checkpoint = plan.checkpoint;
  shape.micro_batches = static_cast<int>(sizes.size());
  shape.last_differs = sizes.back() != sizes.front();
  shape.stages = stages;
  shape.optimizer_state_factor = plan.optimizer_state_factor;
  shape.batch_input_bytes = model.at(profile.batch_size).input_bytes;
  shape.library_bytes = profile.device.library_bytes;
  const SizeCosts& common = model.at(sizes.front());
  const SizeCosts& last = model.at(sizes.back());
  for (std::size_t k = 0; k < profile.layers.size(); ++k) {
    if (!common.aliases[k]) continue;
    shape.view_output_bytes[0] = std::max(shape.view_output_bytes[0], common.output_bytes[k]);
    shape.view_output_bytes[1] = std::max(shape.view_output_bytes[1], last.output_bytes[k]);
  }
  return shape;
}

std::int64_t stage_peak_bound(const CostModel& model, const SizeCosts& common,
                              const SizeCosts& last, const StagePeakShape& shape, int stage,
                              int first, int end, bool nested) {
  const int m = shape.micro_batches;
  const std::int64_t held = model.held_bytes(first, end);
  const std::int64_t trained = model.trained_bytes(first, end);
  const std::int64_t baseline = resident_bytes(held, trained, shape.optimizer_state_factor) +
                                (stage == 0 ? shape.batch_input_bytes : 0) + shape.library_bytes;
  const bool last_stage = stage + 1 == shape.stages;
  const int stop = shape.checkpoint == CheckpointMode::Always       ? m
                   : shape.checkpoint == CheckpointMode::ExceptLast ? m - 1
                                                                    : 0;  // [0, stop) recomputed
  auto slot_of = [&](int i) { return shape.last_differs && i == m - 1 ? 1 : 0; };
  const bool gpipe = shape.schedule == ScheduleKind::GPipe;
  const int first_q = gpipe ? m - 1 : 0;  // the first backward's micro-batch
  std::array<StageMemory, 2> memory;
  std::int64_t left_first = 0, left_later = 0;  // by the first backward, by any later one
  if (nested) {
    memory[0].kept_bytes = common.kept_bytes_within(first, end);
    memory[1].kept_bytes = last.kept_bytes_within(first, end);
    left_first = trained - shape.view_output_bytes[slot_of(first_q)];
    left_later = -shape.view_output_bytes[0];
  } else {
    constexpr auto kTerms = StageMemoryTerms::PeakBound;
    memory[0] = stage_memory(model, common, first, end, stage == 0, kTerms);
    memory[1] =
        shape.last_differs ? stage_memory(model, last, first, end, stage == 0, kTerms) : memory[0];
    left_first = left_by_backward(memory[slot_of(first_q)], true, last_stage);
    left_later = left_by_backward(memory[0], false, last_stage);
  }
  // Micro-batches [p, r) are forwarded and not yet backwarded when q's backward starts, after
  // `earlier` backwards (all of common size but perhaps the first).
  const bool senders_tensor =
      static_cast<std::size_t>(stage) < shape.receives_senders_tensor.size() &&
      shape.receives_senders_tensor[static_cast<std::size_t>(stage)];
  auto before = [&](int p, int r, int q, int earlier) {
    BeforeBackward state;
    const int autograd_from = std::max(p, stop);
    const int last_in = shape.last_differs && p <= m - 1 && m - 1 < r ? 1 : 0;
    const int autograd_last = last_in && m - 1 >= stop ? 1 : 0;
    state.kept_forwards = {std::max(0, r - autograd_from) - autograd_last, autograd_last};
    if (stage > 0 && !nested && !senders_tensor) state.received_inputs = {r - p - last_in, last_in};
    state.slot = slot_of(q);
    state.recomputed = q < stop;
    state.first = earlier == 0;
    state.left_by_earlier = earlier == 0 ? 0 : left_first + (earlier - 1) * left_later;
    return peak_bound_before_backward(baseline, memory, state, last_stage || nested);
  };
  // Right after the first backward, the others in flight hold at least nothing.
  std::int64_t bound = baseline + left_first;
  if (gpipe) {
    bound = std::max(bound, before(0, m, m - 1, 0));
    if (m >= 2) bound = std::max(bound, before(0, m - 1, m - 2, 1));
  } else {
    const int warmup = std::min(m, shape.stages - stage);
    bound = std::max(bound, before(0, warmup, 0, 0));
    // Before q's backward, forwards up to min(M, w + q) have run.
    for (int q : {1, m - warmup, m - 1}) {
      if (q >= 1 && q < m) bound = std::max(bound, before(q, std::min(m, warmup + q), q, q));
    }
  }
  return bound;
}

}  // namespace pipetune
