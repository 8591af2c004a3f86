#include "tests/support/scratch_dir.hpp"

#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace pipetune::testing {

namespace {

// nftw, not std::filesystem::remove_all: LibTorch, linked into some of the tests, exports a
// remove_all of its own that crashes in them (tests/profiler/cpu_cache_test.cpp).
void remove_tree(const std::filesystem::path& root) {
  nftw(
      root.c_str(),
      [](const char* path, const struct stat*, int, struct FTW*) {
        std::remove(path);
        return 0;  // on past what cannot be removed
      },
      16, FTW_DEPTH | FTW_PHYS);
}

class ScratchDir {
 public:
  ScratchDir()
      : path_(std::filesystem::temp_directory_path() /
              ("pipetune-tests-" + std::to_string(::getpid()))),
        owner_(::getpid()) {
    remove_tree(path_);  // left by a killed process that had this pid
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    // A child forked after the folder was made runs this too if it exits through exit(): the
    // folder is the parent's still.
    if (::getpid() == owner_) remove_tree(path_);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  pid_t owner_;
};

}  // namespace

const std::filesystem::path& scratch_dir() {
  static const ScratchDir dir;
  return dir.path();
}

std::filesystem::path scratch_file(const std::string& folder, const std::string& name) {
  const std::filesystem::path dir = scratch_dir() / folder;
  std::filesystem::create_directories(dir);
  return dir / name;
}

}  // namespace pipetune::testing
