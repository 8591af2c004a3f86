#include "distributed/link_probe.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <sstream>

#include "sim/compare.hpp"
#include "sim/error.hpp"

namespace pipetune::distributed {

namespace {

constexpr int kRounds = 7;
constexpr int kProbeTag = 1 << 24;  // clear of the pipeline's tags: the probe runs before it

// Half the round trip of `bytes` from `a` to `b` and back, as `a` times it; `b` echoes.
std::vector<double> ping_pong(exec::Transport& transport, int a, int b, std::int64_t bytes,
                              int tag) {
  std::vector<double> one_way;
  const at::Tensor payload = at::ones({bytes}, at::kByte);
  for (int k = 0; k < kRounds; ++k) {
    if (transport.rank() == a) {
      const auto start = std::chrono::steady_clock::now();
      transport.send(payload, b, tag + 2 * k, 0.0);
      transport.recv(b, tag + 2 * k + 1);
      transport.flush_sends();
      one_way.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count() /
          2.0);
    } else {
      const exec::Received got = transport.recv(a, tag + 2 * k);
      transport.send(got.tensor, a, tag + 2 * k + 1, 0.0);
      transport.flush_sends();
    }
  }
  return one_way;
}

}  // namespace

Hardware probe_process_links(exec::Transport& transport,
                             const std::vector<std::string>& device_names,
                             std::int64_t large_bytes) {
  const int world = transport.world_size();
  if (static_cast<int>(device_names.size()) != world) {
    throw InputError(
        fmt::format("link probe: {} devices but WORLD_SIZE is {}", device_names.size(), world));
  }
  constexpr std::int64_t kSmall = 256;
  // Each pair in turn, the others waiting at the barrier: links are measured unloaded.
  std::ostringstream mine;  // "a b latency_ms bandwidth" per pair this rank led
  int pair = 0;
  for (int a = 0; a < world; ++a) {
    for (int b = a + 1; b < world; ++b, ++pair) {
      transport.barrier(fmt::format("the link probe of ranks {} and {}", a, b));
      if (transport.rank() != a && transport.rank() != b) continue;
      const int tag = kProbeTag + pair * 4 * kRounds;
      const auto small = ping_pong(transport, a, b, kSmall, tag);
      const auto large = ping_pong(transport, a, b, large_bytes, tag + 2 * kRounds);
      if (transport.rank() != a) continue;
      const Link link = link_from_copies(small, kSmall, large, large_bytes);
      mine << fmt::format("{} {} {:.9g} {:.9g}\n", a, b, link.latency_ms,
                          link.bandwidth_bytes_per_s);
    }
  }
  const std::vector<std::string> parts = transport.gather("link probe", mine.str());
  Hardware hardware;
  if (parts.empty()) return hardware;
  for (const auto& name : device_names) hardware.devices.push_back({name, 0, 1.0});
  for (const auto& part : parts) {
    std::istringstream in(part);
    LinkOverride o;
    while (in >> o.first >> o.second >> o.link.latency_ms >> o.link.bandwidth_bytes_per_s) {
      hardware.links.push_back(o);
    }
  }
  std::sort(hardware.links.begin(), hardware.links.end(),
            [](const LinkOverride& x, const LinkOverride& y) {
              return std::tie(x.first, x.second) < std::tie(y.first, y.second);
            });
  if (!hardware.links.empty()) hardware.link = hardware.links.front().link;
  hardware.posted_receives = true;  // what this transport does (process_group.cpp)
  return hardware;
}

}  // namespace pipetune::distributed
