#include "sim/profile.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "sim/cost_model.hpp"
#include "sim/error.hpp"
#include "sim/file_io.hpp"
#include "sim/json_reader.hpp"
#include "sim/limits.hpp"

namespace pipetune {

namespace {

using json_reader::Node;
using nlohmann::json;
using nlohmann::ordered_json;

std::vector<double> numbers(const Node& node, std::size_t count) {
  std::vector<double> out;
  for (const Node& e : node.elements(count, "non-negative numbers, one per micro-batch size")) {
    out.push_back(e.milliseconds());
  }
  return out;
}

std::vector<std::int64_t> byte_counts(const Node& node, std::size_t count) {
  std::vector<std::int64_t> out;
  for (const Node& e :
       node.elements(count, "non-negative integers (bytes), one per micro-batch size")) {
    out.push_back(e.bytes());
  }
  return out;
}

// Every byte count the cost model can yield, summed over the layers, stays within
// limits::kMaxProfileBytes at every micro-batch size from 1 to the batch: what keeps the
// simulator's counters from overflowing (sim/limits.hpp). Each count is max(0, a linear
// function) between measured sizes and beyond them, so the sum is convex on each of those
// pieces and its largest value is at a piece's end: 1, a measured size or the batch.
void check_profile_total(const Profile& p, const std::string& source) {
  std::vector<std::int64_t> at{1, p.batch_size};
  for (auto s : p.micro_batch_sizes) {
    if (s <= p.batch_size) at.push_back(s);
  }
  const auto& sizes = p.micro_batch_sizes;
  // In doubles: the sum is what is being checked, it must not wrap on the way.
  const auto in_double = [&](const std::vector<std::int64_t>& field, double x) {
    std::vector<double> values(field.begin(), field.end());
    return interpolate(sizes, values, x);
  };
  for (const auto size : at) {
    const double x = static_cast<double>(size);
    double total = in_double(p.input_bytes, x);
    for (const auto& l : p.layers) {
      total += static_cast<double>(l.param_bytes);
      for (const auto* field :
           {&l.output_bytes, &l.saved_bytes, &l.workspace_bytes, &l.backward_peak_bytes,
            &l.backward_accumulate_peak_bytes, &l.inner_backward_peak_bytes,
            &l.inner_backward_accumulate_peak_bytes, &l.backward_input_peak_bytes,
            &l.backward_weight_peak_bytes, &l.torch_weight_gradient_bytes,
            &l.torch_freed_by_input_bytes, &l.torch_weight_peak_bytes,
            &l.torch_weight_accumulate_peak_bytes}) {
        if (!field->empty()) total += in_double(*field, x);
      }
    }
    if (total > static_cast<double>(limits::kMaxProfileBytes)) {
      throw InputError(fmt::format(
          "{}: layers: the byte counts add up to {:.4g} bytes at a micro-batch of {} sample{} "
          "(parameters, input and every per-size field{}), above the 64 TiB a profile may hold",
          source, total, size, size == 1 ? "" : "s",
          std::find(sizes.begin(), sizes.end(), size) == sizes.end()
              ? ", extended beyond the measured sizes"
              : ""));
    }
  }
}

// Two per-size fields that come together or not at all; true when both are there.
// Two optional fields that come together: both, or neither, else the one missing is named.
std::optional<std::pair<Node, Node>> both_or_neither(const Node& node, const char* first,
                                                     const char* second) {
  const auto a = node.optional_field(first);
  const auto b = node.optional_field(second);
  if (a.has_value() != b.has_value()) {
    node.fail_message(fmt::format("missing field \"{}\" ({} and {} come together)",
                                  a ? second : first, first, second));
  }
  if (!a) return std::nullopt;
  return std::pair{*a, *b};
}

bool read_pair(const Node& node, const char* first, const char* second, std::size_t sizes,
               std::vector<double>& first_values, std::vector<double>& second_values) {
  const auto pair = both_or_neither(node, first, second);
  if (!pair) return false;
  first_values = numbers(pair->first, sizes);
  second_values = numbers(pair->second, sizes);
  return true;
}

// The backward's measured peaks, and the fields that refine them.
void read_backward_peaks(const Node& node, std::size_t sizes, LayerProfile& layer) {
  const auto peaks = both_or_neither(node, "backward_peak_bytes", "backward_accumulate_peak_bytes");
  if (peaks) {
    layer.backward_peak_bytes = byte_counts(peaks->first, sizes);
    layer.backward_accumulate_peak_bytes = byte_counts(peaks->second, sizes);
  }
  // The fields below refine the backward's peaks and come only with them.
  const auto refining = [&](const char* first, const char* second, const char* relation) {
    auto pair = both_or_neither(node, first, second);
    if (pair && !peaks)
      node.fail_message(fmt::format("has {}, but no backward_peak_bytes ({})", first, relation));
    return pair;
  };
  if (const auto inner = refining("inner_backward_peak_bytes",
                                  "inner_backward_accumulate_peak_bytes", "they refine them")) {
    layer.inner_backward_peak_bytes = byte_counts(inner->first, sizes);
    layer.inner_backward_accumulate_peak_bytes = byte_counts(inner->second, sizes);
  }
  if (const auto release =
          refining("backward_peak_end", "backward_peak_drop_bytes", "it belongs to them")) {
    for (const Node& e : release->first.elements(
             sizes, "numbers from 0 to 1 (a share), one per micro-batch size")) {
      layer.backward_peak_end.push_back(e.number_in(0.0, 1.0, "a number from 0 to 1 (a share)"));
    }
    layer.backward_peak_drop_bytes = byte_counts(release->second, sizes);
  }
  if (const auto split =
          refining("backward_input_peak_bytes", "backward_weight_peak_bytes", "they refine them")) {
    layer.backward_input_peak_bytes = byte_counts(split->first, sizes);
    layer.backward_weight_peak_bytes = byte_counts(split->second, sizes);
  }
}

// What torch's split backward allocates and frees in the layer (its runtime's profile).
void read_torch_memory(const Node& node, std::size_t sizes, LayerProfile& layer) {
  if (const auto torch_input =
          both_or_neither(node, "torch_weight_gradient_bytes", "torch_freed_by_input_bytes")) {
    layer.torch_weight_gradient_bytes = byte_counts(torch_input->first, sizes);
    layer.torch_freed_by_input_bytes = byte_counts(torch_input->second, sizes);
  }
  if (auto keeps = node.optional_field("torch_keeps_output_gradient")) {
    if (layer.torch_weight_gradient_bytes.empty())
      node.fail_message(
          "has torch_keeps_output_gradient, but no torch_weight_gradient_bytes (it comes with "
          "them)");
    layer.torch_keeps_output_gradient = keeps->boolean();
  }
  if (const auto torch_weight =
          both_or_neither(node, "torch_weight_peak_bytes", "torch_weight_accumulate_peak_bytes")) {
    if (layer.torch_weight_gradient_bytes.empty())
      node.fail_message(
          "has torch_weight_peak_bytes, but no torch_weight_gradient_bytes (they come with them)");
    layer.torch_weight_peak_bytes = byte_counts(torch_weight->first, sizes);
    layer.torch_weight_accumulate_peak_bytes = byte_counts(torch_weight->second, sizes);
  }
  if (auto freed = node.optional_field("torch_weight_freed_bytes")) {
    if (layer.torch_weight_peak_bytes.empty())
      node.fail_message(
          "has torch_weight_freed_bytes, but no torch_weight_peak_bytes (it comes with them)");
    layer.torch_weight_freed_bytes = byte_counts(*freed, sizes);
  }
  if (auto frees = node.optional_field("torch_weight_frees_input")) {
    if (layer.torch_weight_freed_bytes.empty())
      node.fail_message(
          "has torch_weight_frees_input, but no torch_weight_freed_bytes (it comes with them)");
    layer.torch_weight_frees_input = frees->boolean();
  }
}

// The backward's halves, and the times beside co-runners, with a cold cache, as a step's first
// task, of the host's launches, and their spread.
void read_time_variants(const Node& node, std::size_t sizes, LayerProfile& layer) {
  read_pair(node, "backward_input_ms", "backward_weight_ms", sizes, layer.backward_input_ms,
            layer.backward_weight_ms);
  read_pair(node, "forward_corun_ms", "backward_corun_ms", sizes, layer.forward_corun_ms,
            layer.backward_corun_ms);
  read_pair(node, "forward_cold_ms", "backward_cold_ms", sizes, layer.forward_cold_ms,
            layer.backward_cold_ms);
  if (auto first = node.optional_field("forward_step_start_ms")) {
    if (layer.forward_cold_ms.empty())
      node.fail_message(
          "has forward_step_start_ms, but no forward_cold_ms (step-start times come with the "
          "cold times)");
    layer.forward_step_start_ms = numbers(*first, sizes);
  }
  const bool forward_launch = read_pair(node, "forward_launch_ms", "backward_launch_ms", sizes,
                                        layer.forward_launch_ms, layer.backward_launch_ms);
  if (auto nograd_launch = node.optional_field("forward_nograd_launch_ms")) {
    if (!forward_launch)
      node.fail_message(
          "has forward_nograd_launch_ms, but no forward_launch_ms (they come with it)");
    layer.forward_nograd_launch_ms = numbers(*nograd_launch, sizes);
  }
  if (auto spread = node.optional_field("forward_ms_spread")) {
    layer.forward_ms_spread = numbers(*spread, sizes);
  }
  if (auto spread = node.optional_field("backward_ms_spread")) {
    layer.backward_ms_spread = numbers(*spread, sizes);
  }
}

LayerProfile parse_layer(const Node& node, std::size_t sizes) {
  node.allow_only({"name",
                   "param_bytes",
                   "trainable_param_bytes",
                   "buffer_bytes",
                   "forward_ms",
                   "backward_ms",
                   "output_bytes",
                   "saved_bytes",
                   "workspace_bytes",
                   "backward_peak_bytes",
                   "backward_accumulate_peak_bytes",
                   "inner_backward_peak_bytes",
                   "inner_backward_accumulate_peak_bytes",
                   "backward_peak_end",
                   "backward_peak_drop_bytes",
                   "backward_input_peak_bytes",
                   "backward_weight_peak_bytes",
                   "forward_nograd_ms",
                   "backward_input_ms",
                   "backward_weight_ms",
                   "forward_corun_ms",
                   "backward_corun_ms",
                   "forward_cold_ms",
                   "backward_cold_ms",
                   "forward_step_start_ms",
                   "forward_launch_ms",
                   "backward_launch_ms",
                   "forward_nograd_launch_ms",
                   "forward_ms_spread",
                   "backward_ms_spread",
                   "keeps_input",
                   "keeps_output",
                   "output_aliases_input",
                   "modifies_input",
                   "torch_weight_gradient_bytes",
                   "torch_freed_by_input_bytes",
                   "torch_keeps_output_gradient",
                   "torch_weight_peak_bytes",
                   "torch_weight_accumulate_peak_bytes",
                   "torch_weight_freed_bytes",
                   "torch_weight_frees_input"});
  LayerProfile layer;
  layer.name = node.field("name").string();
  layer.param_bytes = node.field("param_bytes").bytes();
  if (auto trainable = node.optional_field("trainable_param_bytes")) {
    layer.trainable_param_bytes = trainable->bytes();
    if (layer.trainable_param_bytes > layer.param_bytes)
      trainable->fail(fmt::format("at most param_bytes ({})", layer.param_bytes));
  }
  if (auto buffers = node.optional_field("buffer_bytes")) layer.buffer_bytes = buffers->bytes();
  layer.forward_ms = numbers(node.field("forward_ms"), sizes);
  layer.backward_ms = numbers(node.field("backward_ms"), sizes);
  layer.output_bytes = byte_counts(node.field("output_bytes"), sizes);
  layer.saved_bytes = byte_counts(node.field("saved_bytes"), sizes);
  layer.workspace_bytes = byte_counts(node.field("workspace_bytes"), sizes);
  read_backward_peaks(node, sizes, layer);
  if (auto nograd = node.optional_field("forward_nograd_ms"))
    layer.forward_nograd_ms = numbers(*nograd, sizes);
  if (auto keeps = node.optional_field("keeps_input")) layer.keeps_input = keeps->boolean();
  if (auto keeps = node.optional_field("keeps_output")) layer.keeps_output = keeps->boolean();
  if (auto alias = node.optional_field("output_aliases_input"))
    layer.output_aliases_input = alias->boolean();
  if (auto modifies = node.optional_field("modifies_input"))
    layer.modifies_input = modifies->boolean();
  read_torch_memory(node, sizes, layer);
  read_time_variants(node, sizes, layer);
  return layer;
}

// Tied tensors: each one's holders strictly increasing layer indices, at least two, each of
// them holding at least its bytes.
std::vector<TiedTensor> parse_tied(const Node& node, const std::vector<LayerProfile>& layers) {
  std::vector<TiedTensor> out;
  for (const Node& t : node.elements()) {
    t.allow_only({"name", "layers", "bytes", "trainable"});
    TiedTensor tied;
    tied.name = t.field("name").non_empty_string();
    tied.bytes = t.field("bytes").bytes();
    if (auto trainable = t.optional_field("trainable")) tied.trained = trainable->boolean();
    const Node holders = t.field("layers");
    for (const Node& h : holders.elements()) {
      const auto k = h.non_negative_integer();
      if (k >= static_cast<std::int64_t>(layers.size())) {
        h.fail(fmt::format("a layer index below {}", layers.size()));
      }
      if (!tied.layers.empty() && k <= tied.layers.back()) {
        h.fail(fmt::format("a layer after {} (holders strictly increasing)", tied.layers.back()));
      }
      if (layers[k].param_bytes < tied.bytes) {
        h.fail_message(
            fmt::format("layers[{}] holds {} parameter bytes, fewer than the {} of "
                        "the tied tensor it is said to hold",
                        k, layers[k].param_bytes, tied.bytes));
      }
      if (tied.trained && layers[k].trained_bytes() < tied.bytes) {
        h.fail_message(
            fmt::format("layers[{}] has {} trainable parameter bytes, fewer than the {} of the "
                        "tied tensor it is said to train (\"trainable\": false if it is frozen)",
                        k, layers[k].trained_bytes(), tied.bytes));
      }
      tied.layers.push_back(static_cast<int>(k));
    }
    if (tied.layers.size() < 2) holders.fail("at least two layers holding the tensor");
    out.push_back(std::move(tied));
  }
  return out;
}

// device.after_idle: points with positive idles, strictly ascending, and extras of 0 or more.
std::vector<AfterIdlePoint> after_idle_points(const Node& array) {
  std::vector<AfterIdlePoint> points;
  for (const Node& element : array.elements()) {
    element.allow_only({"idle_ms", "extra_ms"});
    const Node idle = element.field("idle_ms");
    AfterIdlePoint point{idle.milliseconds(), element.field("extra_ms").milliseconds()};
    if (point.idle_ms <= 0.0 || (!points.empty() && point.idle_ms <= points.back().idle_ms))
      idle.fail("a positive idle, above the point's before it");
    points.push_back(point);
  }
  if (points.empty()) array.fail("one point or more");
  return points;
}

// The profile's device: what it is, and what the profiler measured of it.
ProfileDevice parse_device(const Node& device) {
  ProfileDevice d;
  device.allow_only({"type", "name", "memory_bytes", "library_bytes", "backward_call_ms",
                     "sm_shares", "cache_bytes", "after_idle"});
  d.type = device.field("type").non_empty_string();
  d.name = device.field("name").string();
  d.memory_bytes = device.field("memory_bytes").bytes();
  if (auto library = device.optional_field("library_bytes")) d.library_bytes = library->bytes();
  if (auto call = device.optional_field("backward_call_ms"))
    d.backward_call_ms = call->milliseconds();
  if (auto shares = device.optional_field("sm_shares")) {
    const std::int64_t count = shares->positive_integer();
    if (count > limits::kMaxDevices) shares->fail("a count of shares from 1 to 1024");
    d.sm_shares = static_cast<int>(count);
  }
  if (auto cache = device.optional_field("cache_bytes")) d.cache_bytes = cache->bytes();
  if (auto idle = device.optional_field("after_idle")) d.after_idle = after_idle_points(*idle);
  return d;
}

// batch_size, micro_batch_sizes (strictly increasing) and min_micro_batch.
void read_batch_sizes(const Node& root, Profile& p) {
  const Node batch = root.field("batch_size");
  p.batch_size = batch.positive_integer();
  if (p.batch_size > limits::kMaxBatch) batch.fail("a positive integer up to 1000000000");

  const Node sizes = root.field("micro_batch_sizes");
  const auto size_nodes = sizes.elements();
  if (size_nodes.empty()) sizes.fail("a non-empty array of micro-batch sizes");
  for (const Node& s : size_nodes) {
    const auto v = s.positive_integer();
    if (v > limits::kMaxBatch) s.fail("a positive integer up to 1000000000");
    if (!p.micro_batch_sizes.empty() && v <= p.micro_batch_sizes.back()) {
      s.fail(fmt::format("a size above {} (sizes must be strictly increasing)",
                         p.micro_batch_sizes.back()));
    }
    p.micro_batch_sizes.push_back(v);
  }
  if (auto least = root.optional_field("min_micro_batch")) {
    p.min_micro_batch = least->positive_integer();
    if (p.min_micro_batch > p.micro_batch_sizes.front()) {
      least->fail(
          fmt::format("at most the smallest of micro_batch_sizes, {} (no size measured "
                      "below the fewest samples a micro-batch may hold)",
                      p.micro_batch_sizes.front()));
    }
  }
}

// Traces, reports and the GUI match tasks to layers by name: two layers of one name would be
// confused there.
void check_layer_names(const Profile& p, const std::vector<Node>& layer_nodes) {
  std::unordered_map<std::string_view, std::size_t> first_of_name;
  for (std::size_t k = 0; k < p.layers.size(); ++k) {
    const auto [seen, fresh] = first_of_name.emplace(p.layers[k].name, k);
    if (!fresh) {
      layer_nodes[k].field("name").fail_message(
          fmt::format("\"{}\" is also the name of layers[{}]: every layer needs a name of its own",
                      p.layers[k].name, seen->second));
    }
  }
}

// Fields that describe whole stages, or the step: on every layer or none.
void check_every_layer_or_none(const Profile& p, const std::vector<Node>& layer_nodes) {
  // Measured backward peaks replace the model's estimate for whole stages, and when a backward's
  // peak ends, the split of the backward (one rule for every stage) and launch times (a stage's
  // host time is a sum over its layers) likewise: all layers or none.
  for (std::size_t k = 1; k < p.layers.size(); ++k) {
    const auto every_layer_or_none = [&](const char* field, auto LayerProfile::*member) {
      const bool first_has_none = (p.layers[0].*member).empty();
      if ((p.layers[k].*member).empty() == first_has_none) return;
      layer_nodes[k].fail_message(
          first_has_none
              ? fmt::format("has {}, but layers[0] has none (every layer or none)", field)
              : fmt::format("missing field \"{}\" (layers[0] has it: every layer or none)", field));
    };
    every_layer_or_none("backward_peak_bytes", &LayerProfile::backward_peak_bytes);
    every_layer_or_none("inner_backward_peak_bytes", &LayerProfile::inner_backward_peak_bytes);
    every_layer_or_none("backward_input_peak_bytes", &LayerProfile::backward_input_peak_bytes);
    every_layer_or_none("backward_peak_end", &LayerProfile::backward_peak_end);
    every_layer_or_none("backward_input_ms", &LayerProfile::backward_input_ms);
    every_layer_or_none("forward_launch_ms", &LayerProfile::forward_launch_ms);
    every_layer_or_none("forward_nograd_launch_ms", &LayerProfile::forward_nograd_launch_ms);
    every_layer_or_none("torch_weight_gradient_bytes", &LayerProfile::torch_weight_gradient_bytes);
    every_layer_or_none("torch_weight_peak_bytes", &LayerProfile::torch_weight_peak_bytes);
    every_layer_or_none("torch_weight_freed_bytes", &LayerProfile::torch_weight_freed_bytes);
  }
}

// Co-run times, cold times and step-start times: each with what they were measured with, and on
// every layer or none; the backward call's time only with launch times.
void read_measurement_conditions(const Node& root, const Node& device, Profile& p,
                                 const std::vector<Node>& layer_nodes) {
  // Co-run times need the count they were measured with, and describe every layer or none.
  const auto co_runners = root.optional_field("co_runners");
  if (co_runners) {
    const auto n = co_runners->positive_integer();
    if (n > limits::kMaxDevices) {
      co_runners->fail(fmt::format("a positive integer up to {}", limits::kMaxDevices));
    }
    p.co_runners = static_cast<int>(n);
  }
  for (std::size_t k = 0; k < p.layers.size(); ++k) {
    if (p.layers[k].forward_corun_ms.empty() == (p.co_runners > 0)) {
      layer_nodes[k].fail_message(
          p.co_runners > 0
              ? "missing field \"forward_corun_ms\" (co_runners is given: every layer has co-run "
                "times)"
              : "has forward_corun_ms, but the profile has no co_runners (the count they were "
                "measured with)");
    }
  }

  // Cold times need the cache they were taken with, and describe every layer or none.
  for (std::size_t k = 0; k < p.layers.size(); ++k) {
    if (p.layers[k].forward_cold_ms.empty() == (p.device.cache_bytes > 0)) {
      layer_nodes[k].fail_message(
          p.device.cache_bytes > 0
              ? "missing field \"forward_cold_ms\" (device.cache_bytes is given: every layer has "
                "cold times)"
              : "has forward_cold_ms, but the profile's device has no cache_bytes (the cache they "
                "were taken with emptied)");
    }
  }
  // Step-start times describe every layer or none: the first task of a step may be any stage's.
  for (std::size_t k = 1; k < p.layers.size(); ++k) {
    const bool first_has = !p.layers[0].forward_step_start_ms.empty();
    if (!p.layers[k].forward_step_start_ms.empty() == first_has) continue;
    const std::size_t with = first_has ? 0 : k, without = first_has ? k : 0;
    layer_nodes[with].fail_message(
        fmt::format("has forward_step_start_ms, but layer \"{}\" has none (every layer has "
                    "step-start times, or none)",
                    p.layers[without].name));
  }

  // The call's time is only ever added to launch times: alone it would be silently unused.
  if (p.device.backward_call_ms > 0 && !p.has_launch_times()) {
    device.field("backward_call_ms")
        .fail_message(
            "is given, but no layer has launch times (forward_launch_ms), which it "
            "belongs with");
  }
}

}  // namespace

Profile parse_profile(std::string_view text, const std::string& source) {
  const json document = json_reader::parse_document(text, source);
  const Node root(document, source);
  if (!document.is_object()) root.fail("a JSON object");
  root.allow_only({"format", "model", "device", "dtype", "batch_size", "micro_batch_sizes",
                   "min_micro_batch", "input_bytes", "layers", "timer", "co_runners",
                   "tied_parameters", "meta"});
  json_reader::check_format(root, kProfileFormat);

  Profile p;
  p.model = root.field("model").non_empty_string();
  const Node device = root.field("device");
  p.device = parse_device(device);
  p.dtype = root.field("dtype").non_empty_string();
  if (auto timer = root.optional_field("timer")) {
    p.timer = timer->non_empty_string();
    if (p.timer != "clock" && p.timer != "cuda-events" && p.timer != "cupti") {
      timer->fail("\"clock\", \"cuda-events\" or \"cupti\"");
    }
  }
  read_batch_sizes(root, p);
  const std::size_t count = p.micro_batch_sizes.size();
  p.input_bytes = byte_counts(root.field("input_bytes"), count);

  const Node layers = root.field("layers");
  const auto layer_nodes = layers.elements();
  if (layer_nodes.empty()) layers.fail("a non-empty array of layers");
  for (const Node& l : layer_nodes) p.layers.push_back(parse_layer(l, count));
  check_layer_names(p, layer_nodes);
  check_every_layer_or_none(p, layer_nodes);
  read_measurement_conditions(root, device, p, layer_nodes);

  if (auto tied = root.optional_field("tied_parameters")) p.tied = parse_tied(*tied, p.layers);
  check_profile_total(p, source);

  if (auto meta = root.optional_field("meta")) {
    if (!meta->value().is_object()) meta->fail("an object");
    p.meta_json = meta->value().dump();
  }
  return p;
}

std::vector<std::int64_t> launch_bound_sizes(const Profile& profile) {
  std::vector<std::int64_t> out;
  if (!profile.has_launch_times()) return out;
  for (std::size_t k = 0; k < profile.micro_batch_sizes.size(); ++k) {
    double device = 0.0, launches = profile.device.backward_call_ms;
    for (const auto& l : profile.layers) {
      device += l.forward_ms[k] + l.backward_ms[k];
      launches += l.forward_launch_ms[k] + l.backward_launch_ms[k];
    }
    if (launches > device) out.push_back(profile.micro_batch_sizes[k]);
  }
  return out;
}

std::vector<int> stages_holding(const TiedTensor& tied, const std::vector<int>& balance) {
  std::vector<int> stages;
  int stage = 0, end = balance.empty() ? 0 : balance[0];
  for (int layer : tied.layers) {
    while (layer >= end && stage + 1 < static_cast<int>(balance.size())) end += balance[++stage];
    if (stages.empty() || stages.back() != stage) stages.push_back(stage);
  }
  return stages;
}

Profile load_profile(const std::string& path) {
  return parse_profile(read_text_file(path), path);
}

namespace {

ordered_json device_to_json(const ProfileDevice& d) {
  ordered_json device = {{"type", d.type}, {"name", d.name}, {"memory_bytes", d.memory_bytes}};
  if (d.library_bytes > 0) device["library_bytes"] = d.library_bytes;
  if (d.backward_call_ms > 0) device["backward_call_ms"] = d.backward_call_ms;
  if (d.sm_shares > 0) device["sm_shares"] = d.sm_shares;
  if (d.cache_bytes > 0) device["cache_bytes"] = d.cache_bytes;
  if (!d.after_idle.empty()) {
    ordered_json points = ordered_json::array();
    for (const AfterIdlePoint& point : d.after_idle)
      points.push_back({{"idle_ms", point.idle_ms}, {"extra_ms", point.extra_ms}});
    device["after_idle"] = std::move(points);
  }
  return device;
}

// A layer's fields; the optional ones only where measured.
ordered_json layer_to_json(const LayerProfile& l) {
  ordered_json layer = {{"name", l.name}, {"param_bytes", l.param_bytes}};
  if (l.trainable_param_bytes >= 0) layer["trainable_param_bytes"] = l.trainable_param_bytes;
  if (l.buffer_bytes > 0) layer["buffer_bytes"] = l.buffer_bytes;
  layer["forward_ms"] = l.forward_ms;
  layer["backward_ms"] = l.backward_ms;
  layer["output_bytes"] = l.output_bytes;
  layer["saved_bytes"] = l.saved_bytes;
  layer["workspace_bytes"] = l.workspace_bytes;
  if (!l.backward_peak_bytes.empty()) {
    layer["backward_peak_bytes"] = l.backward_peak_bytes;
    layer["backward_accumulate_peak_bytes"] = l.backward_accumulate_peak_bytes;
  }
  if (!l.inner_backward_peak_bytes.empty()) {
    layer["inner_backward_peak_bytes"] = l.inner_backward_peak_bytes;
    layer["inner_backward_accumulate_peak_bytes"] = l.inner_backward_accumulate_peak_bytes;
  }
  if (!l.backward_peak_end.empty()) {
    layer["backward_peak_end"] = l.backward_peak_end;
    layer["backward_peak_drop_bytes"] = l.backward_peak_drop_bytes;
  }
  if (!l.backward_input_peak_bytes.empty()) {
    layer["backward_input_peak_bytes"] = l.backward_input_peak_bytes;
    layer["backward_weight_peak_bytes"] = l.backward_weight_peak_bytes;
  }
  if (!l.forward_nograd_ms.empty()) layer["forward_nograd_ms"] = l.forward_nograd_ms;
  // Written where they differ from the defaults, so profiles without them read back the same.
  if (!l.keeps_input) layer["keeps_input"] = false;
  if (l.keeps_output) layer["keeps_output"] = true;
  if (l.output_aliases_input) layer["output_aliases_input"] = true;
  if (l.modifies_input) layer["modifies_input"] = true;
  if (!l.torch_weight_gradient_bytes.empty()) {
    layer["torch_weight_gradient_bytes"] = l.torch_weight_gradient_bytes;
    layer["torch_freed_by_input_bytes"] = l.torch_freed_by_input_bytes;
  }
  if (l.torch_keeps_output_gradient) layer["torch_keeps_output_gradient"] = true;
  if (!l.torch_weight_peak_bytes.empty()) {
    layer["torch_weight_peak_bytes"] = l.torch_weight_peak_bytes;
    layer["torch_weight_accumulate_peak_bytes"] = l.torch_weight_accumulate_peak_bytes;
  }
  if (!l.torch_weight_freed_bytes.empty())
    layer["torch_weight_freed_bytes"] = l.torch_weight_freed_bytes;
  if (l.torch_weight_frees_input) layer["torch_weight_frees_input"] = true;
  if (!l.backward_input_ms.empty()) {
    layer["backward_input_ms"] = l.backward_input_ms;
    layer["backward_weight_ms"] = l.backward_weight_ms;
  }
  if (!l.forward_corun_ms.empty()) {
    layer["forward_corun_ms"] = l.forward_corun_ms;
    layer["backward_corun_ms"] = l.backward_corun_ms;
  }
  if (!l.forward_cold_ms.empty()) {
    layer["forward_cold_ms"] = l.forward_cold_ms;
    layer["backward_cold_ms"] = l.backward_cold_ms;
  }
  if (!l.forward_step_start_ms.empty()) layer["forward_step_start_ms"] = l.forward_step_start_ms;
  if (!l.forward_launch_ms.empty()) {
    layer["forward_launch_ms"] = l.forward_launch_ms;
    layer["backward_launch_ms"] = l.backward_launch_ms;
  }
  if (!l.forward_nograd_launch_ms.empty())
    layer["forward_nograd_launch_ms"] = l.forward_nograd_launch_ms;
  if (!l.forward_ms_spread.empty()) layer["forward_ms_spread"] = l.forward_ms_spread;
  if (!l.backward_ms_spread.empty()) layer["backward_ms_spread"] = l.backward_ms_spread;
  return layer;
}

}  // namespace

std::string profile_to_json(const Profile& p) {
  ordered_json root = ordered_json::object();
  root["format"] = kProfileFormat;
  root["model"] = p.model;
  root["device"] = device_to_json(p.device);
  root["dtype"] = p.dtype;
  if (!p.timer.empty()) root["timer"] = p.timer;
  root["batch_size"] = p.batch_size;
  root["micro_batch_sizes"] = p.micro_batch_sizes;
  if (p.min_micro_batch > 1) root["min_micro_batch"] = p.min_micro_batch;
  root["input_bytes"] = p.input_bytes;
  if (p.co_runners > 0) root["co_runners"] = p.co_runners;
  ordered_json layers = ordered_json::array();
  for (const auto& l : p.layers) {
    ordered_json layer = layer_to_json(l);
    layers.push_back(std::move(layer));
  }
  root["layers"] = std::move(layers);
  if (!p.tied.empty()) {
    ordered_json tied = ordered_json::array();
    for (const TiedTensor& t : p.tied) {
      tied.push_back({{"name", t.name}, {"layers", t.layers}, {"bytes", t.bytes}});
      if (!t.trained) tied.back()["trainable"] = false;
    }
    root["tied_parameters"] = std::move(tied);
  }
  if (!p.meta_json.empty()) root["meta"] = ordered_json::parse(p.meta_json);
  return root.dump(2) + "\n";
}

void save_profile(const Profile& profile, const std::string& path) {
  write_text_file_atomically(path, profile_to_json(profile));
}

}  // namespace pipetune
