// The private cache read from a fabricated sysfs tree: the largest data or unified cache that
// only the core's own SMT threads share.

#include "profiler/cpu_cache.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/scratch_dir.hpp"

namespace pipetune::profiler {
namespace {

namespace fs = std::filesystem;

void write(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text << "\n";
}

// Not fs::remove_all: LibTorch, linked into this test, exports a remove_all of its own that
// crashes here.
void remove_tree(const fs::path& root) {
  std::vector<fs::path> paths;
  std::error_code error;
  for (const auto& e : fs::recursive_directory_iterator(root, error)) paths.push_back(e.path());
  std::sort(paths.begin(), paths.end(), [](const fs::path& a, const fs::path& b) {
    return a.string().size() > b.string().size();
  });
  for (const auto& p : paths) fs::remove(p, error);
  fs::remove(root, error);
}

void add_cache(const fs::path& cpu, int index, const std::string& type, const std::string& size,
               const std::string& shared) {
  const fs::path folder = cpu / "cache" / ("index" + std::to_string(index));
  write(folder / "type", type);
  write(folder / "size", size);
  write(folder / "shared_cpu_list", shared);
}

TEST(PrivateCache, LargestCacheOnlyTheCoresThreadsShare) {
  const fs::path cpu = testing::scratch_dir() / "sysfs" / "cpu0";
  // An SMT core (threads 0 and 8): L1d and L1i, an L2 of its own, an L3 the socket shares.
  write(cpu / "topology" / "thread_siblings_list", "0,8");
  add_cache(cpu, 0, "Data", "48K", "0,8");
  add_cache(cpu, 1, "Instruction", "64K", "0,8");
  add_cache(cpu, 2, "Unified", "2048K", "0,8");
  add_cache(cpu, 3, "Unified", "491520K", "0-15");
  EXPECT_EQ(private_cache_bytes(cpu), 2048 << 10);
  // An L2 two cores share (as on some Atom clusters): the L1d is the private one.
  add_cache(cpu, 2, "Unified", "4M", "0-1,8-9");
  EXPECT_EQ(private_cache_bytes(cpu), 48 << 10);
  // Without a topology folder, a cache one CPU lists is private.
  remove_tree(cpu / "topology");
  add_cache(cpu, 0, "Data", "32K", "0");
  EXPECT_EQ(private_cache_bytes(cpu), 32 << 10);
  remove_tree(cpu.parent_path());
  // Nothing readable: unknown.
  EXPECT_EQ(private_cache_bytes(cpu), 0);
}

}  // namespace
}  // namespace pipetune::profiler
