#pragma once

// A folder of this test process's own for the files its tests write, so that a run of the suite
// leaves nothing in the temporary directory.

#include <filesystem>
#include <string>

namespace pipetune::testing {

/// <temp>/pipetune-tests-<pid>, made (empty) on first use and removed with everything in it when
/// the process exits. Files there outlive a test, not the process: under ctest each test is a
/// process of its own. Tests that share the process keep to subfolders of their own.
const std::filesystem::path& scratch_dir();

/// scratch_dir() / folder / name, the folder made: a test file's own corner of the process's
/// folder, where the test programme holds several files' tests.
std::filesystem::path scratch_file(const std::string& folder, const std::string& name);

}  // namespace pipetune::testing
