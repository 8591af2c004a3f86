#include "executor/models/out_of_memory.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <regex>

#include "sim/units.hpp"

namespace pipetune::models {

namespace {

thread_local std::string failed_activity;

std::int64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? std::int64_t{pages} * page : 0;
}

std::int64_t available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

}  // namespace

Activity::Activity(std::string what)
    : what_(std::move(what)), exceptions_at_start_(std::uncaught_exceptions()) {}

Activity::~Activity() {
  // Unwinding: the first Activity left is the innermost one, the most precise account.
  if (std::uncaught_exceptions() > exceptions_at_start_ && failed_activity.empty()) {
    failed_activity = what_;
  }
}

std::string take_failed_activity() {
  return std::exchange(failed_activity, std::string());
}

std::optional<std::int64_t> refused_allocation_bytes(const std::exception& error) {
  // c10's CPU allocator: "DefaultCPUAllocator: can't allocate memory: you tried to allocate
  // 40000000000 bytes. Error code 12 (Cannot allocate memory)".
  static const std::regex kCpu(R"(can't allocate memory: you tried to allocate (\d+) bytes)");
  std::cmatch match;
  const char* text = error.what();
  if (!std::regex_search(text, match, kCpu)) return std::nullopt;
  return std::strtoll(match[1].first, nullptr, 10);
}

InputError out_of_memory(const std::string& what, std::int64_t bytes) {
  const std::int64_t total = physical_memory_bytes();
  const std::int64_t available = available_memory_bytes();
  return InputError(fmt::format(
      "{}{}out of memory: a tensor of {} bytes ({}) did not fit; this machine has {} of memory, "
      "{} of it available",
      what, what.empty() ? "" : ": ", bytes, format_bytes(bytes), format_bytes(total),
      format_bytes(available)));
}

}  // namespace pipetune::models
