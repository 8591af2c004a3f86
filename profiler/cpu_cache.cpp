#include "profiler/cpu_cache.hpp"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace pipetune::profiler {

namespace {

std::string first_line(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  return line;
}

// "0-3,8" → {0, 1, 2, 3, 8}; an unreadable list is empty.
std::set<int> cpu_list(const std::string& text) {
  std::set<int> cpus;
  std::stringstream parts(text);
  std::string part;
  while (std::getline(parts, part, ',')) {
    try {
      const auto dash = part.find('-');
      const int first = std::stoi(part.substr(0, dash));
      const int last = dash == std::string::npos ? first : std::stoi(part.substr(dash + 1));
      for (int c = first; c <= last && c - first < 4096; ++c) cpus.insert(c);
    } catch (const std::exception&) {
      return {};
    }
  }
  return cpus;
}

// "2048K", "32M", "1024" → bytes; 0 when unreadable.
std::int64_t size_bytes(const std::string& text) {
  try {
    std::size_t used = 0;
    const std::int64_t value = std::stoll(text, &used);
    const std::string unit = text.substr(used);
    if (unit.empty()) return value;
    if (unit == "K") return value << 10;
    if (unit == "M") return value << 20;
    if (unit == "G") return value << 30;
  } catch (const std::exception&) {
  }
  return 0;
}

}  // namespace

std::int64_t private_cache_bytes(const std::filesystem::path& cpu) {
  std::error_code error;
  std::set<int> siblings = cpu_list(first_line(cpu / "topology" / "thread_siblings_list"));
  std::int64_t largest = 0;
  for (const auto& entry : std::filesystem::directory_iterator(cpu / "cache", error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("index", 0) != 0) continue;
    if (first_line(entry.path() / "type") == "Instruction") continue;
    const std::set<int> sharing = cpu_list(first_line(entry.path() / "shared_cpu_list"));
    if (sharing.empty()) continue;
    // Without a topology folder the cache counts as private only if one CPU lists it.
    const bool is_private = siblings.empty() ? sharing.size() == 1
                                             : std::includes(siblings.begin(), siblings.end(),
                                                             sharing.begin(), sharing.end());
    if (is_private) largest = std::max(largest, size_bytes(first_line(entry.path() / "size")));
  }
  return largest;
}

std::int64_t private_cache_bytes() {
  return private_cache_bytes("/sys/devices/system/cpu/cpu0");
}

}  // namespace pipetune::profiler
