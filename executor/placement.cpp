#include "executor/placement.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "executor/device_runtime.hpp"
#include "sim/error.hpp"

namespace pipetune::exec {

namespace {
bool is_kind(const std::string& name, const std::string& kind) {
  return name.rfind(kind + ":", 0) == 0 && name.size() > kind.size() + 1 &&
         name.find_first_not_of("0123456789", kind.size() + 1) == std::string::npos;
}
}  // namespace

std::vector<std::string> executor_devices(const Plan& plan, const std::string& kind) {
  if (kind == "cuda" && !exec::cuda_built()) {
    throw InputError(Input::Device, "cuda",
                     "this build of pipetune has no CUDA (LibTorch without CUDA, or no CUDA toolkit)");
  }
  if (kind == "cuda" && exec::cuda_device_count() == 0) {
    throw InputError(Input::Device, "cuda", "no CUDA device on this machine");
  }
  std::vector<std::string> out;
  if (plan.devices.empty()) {
    for (int s = 0; s < plan.stages(); ++s) out.push_back(fmt::format("{}:{}", kind, s));
  } else {
    std::vector<std::string> seen;
    for (const auto& name : plan.devices) {
      if (std::find(seen.begin(), seen.end(), name) == seen.end()) seen.push_back(name);
    }
    const bool own = std::all_of(seen.begin(), seen.end(), [&](const std::string& n) { return is_kind(n, kind); });
    for (std::size_t k = 0; k < seen.size(); ++k) out.push_back(own ? seen[k] : fmt::format("{}:{}", kind, k));
  }
  if (kind == "cuda") {
    for (const auto& name : out) {
      if (std::stoi(name.substr(5)) >= exec::cuda_device_count()) {
        throw InputError(Input::Device, "cuda", fmt::format(
            "the plan needs {} but this machine has {} CUDA device(s); name the plan's devices to "
            "put several stages on one (e.g. \"devices\": [\"cuda:0\", \"cuda:0\"])",
            name, exec::cuda_device_count()));
      }
    }
  }
  return out;
}

Plan with_executor_devices(const Plan& plan, const std::vector<std::string>& devices) {
  if (plan.devices.empty()) return plan;
  Plan out = plan;
  std::vector<std::string> seen;
  for (auto& name : out.devices) {
    auto it = std::find(seen.begin(), seen.end(), name);
    if (it == seen.end()) {
      seen.push_back(name);
      it = seen.end() - 1;
    }
    name = devices[static_cast<std::size_t>(it - seen.begin())];
  }
  return out;
}

int cpu_threads_per_device(int devices) {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, devices));
}

}  // namespace pipetune::exec
