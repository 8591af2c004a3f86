#include "sim/hardware.hpp"

#include <fmt/format.h>

#include <cmath>
#include <map>

#include "sim/error.hpp"
#include "sim/file_io.hpp"
#include "sim/json_reader.hpp"
#include "sim/limits.hpp"

namespace pipetune {

namespace {

using json_reader::Node;
using nlohmann::json;
using nlohmann::ordered_json;

Link parse_link(const Node& node, std::initializer_list<std::string_view> extra_keys = {}) {
  std::vector<std::string_view> keys{"bandwidth_bytes_per_s", "latency_ms"};
  keys.insert(keys.end(), extra_keys.begin(), extra_keys.end());
  if (!node.value().is_object()) node.fail("an object");
  for (const auto& [key, value] : node.value().items()) {
    bool known = false;
    for (auto k : keys) known = known || k == key;
    if (!known) {
      std::string list;
      for (auto k : keys) list += (list.empty() ? "" : ", ") + std::string(k);
      node.fail_message(fmt::format("unknown field \"{}\" (expected one of: {})", key, list));
    }
  }
  Link link;
  // null says "unlimited": JSON has no infinity, and an ideal link must survive a round trip.
  const Node bandwidth = node.field("bandwidth_bytes_per_s");
  link.bandwidth_bytes_per_s =
      bandwidth.value().is_null()
          ? std::numeric_limits<double>::infinity()
          : bandwidth.number_in(limits::kMinBandwidth, 1e300,
                                "at least 1 (bytes per second), or null for unlimited");
  link.latency_ms = node.field("latency_ms").milliseconds();
  return link;
}

ordered_json link_json(const Link& link) {
  ordered_json bandwidth = nullptr;
  if (link.bandwidth_bytes_per_s != std::numeric_limits<double>::infinity()) {
    bandwidth = link.bandwidth_bytes_per_s;
  }
  return {{"bandwidth_bytes_per_s", bandwidth}, {"latency_ms", link.latency_ms}};
}

}  // namespace

const Link& Hardware::link_between(int from, int to) const {
  for (const auto& o : links) {
    if ((o.first == from && o.second == to) || (o.first == to && o.second == from)) return o.link;
  }
  return link;
}

int Hardware::device_index(std::string_view name) const {
  for (std::size_t i = 0; i < devices.size(); ++i) {
    if (devices[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

namespace {

// "devices": named once each, at most limits::kMaxDevices (a link per ordered pair).
void read_devices(const Node& root, Hardware& hw) {
  const Node devices = root.field("devices");
  const auto device_nodes = devices.elements();
  if (device_nodes.empty()) devices.fail("a non-empty array of devices");
  // The simulator keeps a link per ordered pair of devices.
  if (device_nodes.size() > static_cast<std::size_t>(limits::kMaxDevices)) {
    devices.fail("at most 1024 devices");
  }
  for (const Node& d : device_nodes) {
    d.allow_only({"name", "memory_bytes", "speed", "share_of"});
    HardwareDevice device;
    const Node name = d.field("name");
    device.name = name.non_empty_string();
    if (hw.device_index(device.name) >= 0) {
      name.fail_message(fmt::format("duplicate device name \"{}\"", device.name));
    }
    device.memory_bytes = d.field("memory_bytes").bytes();
    if (auto speed = d.optional_field("speed")) {
      device.speed =
          speed->number_in(limits::kMinSpeed, limits::kMaxSpeed, "a number from 1e-6 to 1e6");
    }
    if (auto share_of = d.optional_field("share_of"))
      device.share_of = share_of->non_empty_string();
    hw.devices.push_back(std::move(device));
  }
}

// "links": each between two different devices of "devices".
void read_link_overrides(const Node& links, Hardware& hw) {
  for (const Node& l : links.elements()) {
    LinkOverride o;
    o.link = parse_link(l, {"between"});
    const Node between = l.field("between");
    const auto ends = between.elements();
    if (ends.size() != 2) between.fail("an array of two device names");
    int index[2];
    for (int k = 0; k < 2; ++k) {
      index[k] = hw.device_index(ends[k].non_empty_string());
      if (index[k] < 0) ends[k].fail("the name of a device in \"devices\"");
    }
    if (index[0] == index[1]) between.fail("two different devices");
    o.first = index[0];
    o.second = index[1];
    hw.links.push_back(o);
  }
}

// "calibration": compute scales by device count, a task overhead, a copy link, the plans it was
// fitted on.
Calibration parse_calibration(const Node& calibration, const std::string& source) {
  calibration.allow_only({"compute_scale", "task_overhead_ms", "copy", "fitted_on"});
  Calibration c;
  if (auto scale = calibration.optional_field("compute_scale")) {
    if (!scale->value().is_object())
      scale->fail("an object from device counts to factors, e.g. {\"2\": 1.1}");
    for (const auto& [key, value] : scale->value().items()) {
      const Node factor(value, source, scale->path() + "." + key);
      int devices = 0;
      try {
        devices = std::stoi(key);
      } catch (...) {
        devices = 0;
      }
      if (devices < 1 || std::to_string(devices) != key) {
        factor.fail_message(fmt::format("expected a device count as the key, got \"{}\"", key));
      }
      c.compute_scale[devices] =
          factor.number_in(limits::kMinSpeed, limits::kMaxSpeed, "a number from 1e-6 to 1e6");
    }
  }
  if (auto overhead = calibration.optional_field("task_overhead_ms")) {
    c.task_overhead_ms = overhead->milliseconds();
  }
  if (auto copy = calibration.optional_field("copy")) c.copy = parse_link(*copy);
  if (auto fitted = calibration.optional_field("fitted_on")) {
    for (const Node& plan : fitted->elements()) c.fitted_on.push_back(plan.string());
  }
  return c;
}

}  // namespace

Hardware parse_hardware(std::string_view text, const std::string& source) {
  const json document = json_reader::parse_document(text, source);
  const Node root(document, source);
  if (!document.is_object()) root.fail("a JSON object");
  root.allow_only({"format", "devices", "link", "links", "launch_overhead_ms", "posted_receives",
                   "runtime", "model_error", "calibration"});
  json_reader::check_format(root, kHardwareFormat);

  Hardware hw;
  read_devices(root, hw);
  hw.link = parse_link(root.field("link"));
  if (auto links = root.optional_field("links")) read_link_overrides(*links, hw);
  if (auto overhead = root.optional_field("launch_overhead_ms")) {
    hw.launch_overhead_ms = overhead->milliseconds();
  }
  if (auto posted = root.optional_field("posted_receives")) hw.posted_receives = posted->boolean();
  if (auto runtime = root.optional_field("runtime")) {
    const std::string name = runtime->non_empty_string();
    if (name == kTorchPipeliningRuntime) {
      hw.runtime = Runtime::TorchPipelining;
    } else if (name != "pipetune") {
      runtime->fail(fmt::format("\"pipetune\" or \"{}\"", kTorchPipeliningRuntime));
    }
  }
  if (auto error = root.optional_field("model_error")) {
    hw.model_error = error->non_negative_number();
    if (hw.model_error > 10.0) error->fail("a relative error from 0 to 10");
  }
  if (auto calibration = root.optional_field("calibration"))
    hw.calibration = parse_calibration(*calibration, source);
  return hw;
}

Hardware load_hardware(const std::string& path) {
  return parse_hardware(read_text_file(path), path);
}

std::string hardware_to_json(const Hardware& hw) {
  ordered_json root = ordered_json::object();
  root["format"] = kHardwareFormat;
  ordered_json devices = ordered_json::array();
  for (const auto& d : hw.devices) {
    devices.push_back({{"name", d.name}, {"memory_bytes", d.memory_bytes}, {"speed", d.speed}});
    if (!d.share_of.empty()) devices.back()["share_of"] = d.share_of;
  }
  root["devices"] = std::move(devices);
  root["link"] = link_json(hw.link);
  if (!hw.links.empty()) {
    ordered_json links = ordered_json::array();
    for (const auto& o : hw.links) {
      ordered_json l = {{"between", {hw.devices[o.first].name, hw.devices[o.second].name}}};
      l.update(link_json(o.link));
      links.push_back(std::move(l));
    }
    root["links"] = std::move(links);
  }
  root["launch_overhead_ms"] = hw.launch_overhead_ms;
  if (hw.posted_receives) root["posted_receives"] = true;
  if (hw.runtime == Runtime::TorchPipelining) root["runtime"] = kTorchPipeliningRuntime;
  if (hw.model_error > 0) root["model_error"] = hw.model_error;
  if (!hw.calibration.empty()) {
    const Calibration& c = hw.calibration;
    ordered_json calibration = ordered_json::object();
    ordered_json scale = ordered_json::object();
    for (const auto& [devices, factor] : c.compute_scale) scale[std::to_string(devices)] = factor;
    calibration["compute_scale"] = std::move(scale);
    calibration["task_overhead_ms"] = c.task_overhead_ms;
    if (c.copy) calibration["copy"] = link_json(*c.copy);
    calibration["fitted_on"] = c.fitted_on;
    root["calibration"] = std::move(calibration);
  }
  return root.dump(2) + "\n";
}

void save_hardware(const Hardware& hardware, const std::string& path) {
  write_text_file_atomically(path, hardware_to_json(hardware));
}

double Calibration::scale_for(int devices) const {
  if (compute_scale.empty()) return 1.0;
  auto best = compute_scale.begin();
  for (auto it = compute_scale.begin(); it != compute_scale.end(); ++it) {
    if (std::abs(it->first - devices) < std::abs(best->first - devices)) best = it;
  }
  return best->second;
}

Hardware calibrated(const Hardware& hardware, int devices_used) {
  Hardware out = hardware;
  const Calibration& c = hardware.calibration;
  if (c.empty()) return out;
  const double scale = c.scale_for(devices_used);
  for (auto& d : out.devices) d.speed /= scale;
  out.launch_overhead_ms += c.task_overhead_ms;
  if (c.copy) {
    out.link = *c.copy;
    out.links.clear();
  }
  out.calibration = {};  // applied: a simulator given `out` must not apply it again
  return out;
}

Hardware first_devices(Hardware hardware, int count) {
  if (count < static_cast<int>(hardware.devices.size()))
    hardware.devices.resize(static_cast<std::size_t>(count));
  std::erase_if(hardware.links,
                [count](const LinkOverride& o) { return o.first >= count || o.second >= count; });
  return hardware;
}

Hardware replicate_device(const ProfileDevice& device, int count) {
  Hardware hw;
  for (int i = 0; i < count; ++i) {
    hw.devices.push_back({fmt::format("{}:{}", device.type, i), device.memory_bytes, 1.0,
                          device.sm_shares > 1 ? fmt::format("{}:0", device.type) : ""});
  }
  return hw;
}

void set_all_links(Hardware& hardware, std::optional<double> bandwidth_bytes_per_s,
                   std::optional<double> latency_ms) {
  if (!bandwidth_bytes_per_s && !latency_ms) return;
  auto set = [&](Link& link) {
    if (bandwidth_bytes_per_s) link.bandwidth_bytes_per_s = *bandwidth_bytes_per_s;
    if (latency_ms) link.latency_ms = *latency_ms;
  };
  set(hardware.link);
  for (auto& o : hardware.links) set(o.link);
  hardware.calibration.copy.reset();
}

std::vector<int> shared_gpus(const Hardware& hardware) {
  std::vector<int> gpu(hardware.devices.size(), -1);
  std::map<std::string, std::vector<int>> shares;
  for (std::size_t d = 0; d < hardware.devices.size(); ++d) {
    if (!hardware.devices[d].share_of.empty())
      shares[hardware.devices[d].share_of].push_back(static_cast<int>(d));
  }
  int count = 0;
  for (const auto& [name, devices] : shares) {
    if (devices.size() < 2) continue;
    for (const int d : devices) gpu[static_cast<std::size_t>(d)] = count;
    ++count;
  }
  return gpu;
}

std::vector<int> device_memories(const Hardware& hardware) {
  const std::vector<int> gpu = shared_gpus(hardware);
  std::vector<int> memory(gpu.size());
  std::vector<int> first(gpu.size(), -1);  // per GPU (fewer than the devices)
  for (std::size_t d = 0; d < gpu.size(); ++d) {
    memory[d] = static_cast<int>(d);
    if (gpu[d] < 0) continue;
    if (first[gpu[d]] < 0) first[gpu[d]] = memory[d];
    memory[d] = first[gpu[d]];
  }
  return memory;
}

}  // namespace pipetune
