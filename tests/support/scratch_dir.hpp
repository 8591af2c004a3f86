#pragma once

// A folder of this test process's own for the files its tests write, so that a run of the suite
// leaves nothing in the temporary directory.

#include <filesystem>

namespace pipetune::testing {

/// <temp>/pipetune-tests-<pid>, made (empty) on first use and removed with everything in it when
/// the process exits. Files there outlive a test, not the process: under ctest each test is a
/// process of its own. Tests that share the process keep to subfolders of their own.
const std::filesystem::path& scratch_dir();

}  // namespace pipetune::testing
