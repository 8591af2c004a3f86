// libFuzzer target for the command line's plan and hardware flags: the input, split at
// whitespace, is parsed by CLI11 with the flags `simulate` registers (add_hardware_flags,
// add_plan_flags) plus the list flags of `plan` and `sweep`, then resolved as `simulate` does.
// A CLI11 ParseError or an InputError is a clean rejection; anything else is a bug.
// --plan and --hardware always read the fixture files written at start-up, whatever path the
// input names, so the fuzzer exercises the merging of file and flags, not the file system.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "cli/inputs.hpp"
#include "fuzz/fuzz_support.hpp"
#include "sim/error.hpp"
#include "sim/simulator.hpp"
#include "sim/units.hpp"

namespace {

struct FixtureFiles {
  std::string plan;
  std::string hardware;
};

const FixtureFiles& fixture_files() {
  static const FixtureFiles files = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/pipetune-fuzz-XXXXXX";
    if (!mkdtemp(dir.data())) pipetune::fuzz::fail("mkdtemp failed", dir);
    FixtureFiles f{dir + "/plan.json", dir + "/hardware.json"};
    std::ofstream(f.plan) << pipetune::fuzz::kPlanJson;
    std::ofstream(f.hardware) << pipetune::fuzz::kHardwareJson;
    return f;
  }();
  return files;
}

std::vector<std::string> split_words(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> words;
  std::string word;
  for (std::size_t i = 0; i < size; ++i) {
    const char c = static_cast<char>(data[i]);
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\0') {
      if (!word.empty()) words.push_back(std::move(word));
      word.clear();
    } else {
      word += c;
    }
  }
  if (!word.empty()) words.push_back(std::move(word));
  return words;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fixture_files();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pipetune;
  std::vector<std::string> args = split_words(data, size);

  CLI::App app("fuzz");
  cli::HardwareFlags hardware_flags;
  cli::PlanFlags plan_flags;
  cli::add_hardware_flags(app, hardware_flags);
  cli::add_plan_flags(app, plan_flags);
  // The list forms of `plan` and `sweep`.
  std::vector<int> chunk_list;
  std::vector<std::string> checkpoint_list, schedule_list, bandwidth_list;
  std::string size_text;
  app.add_option("--chunk-list", chunk_list)->delimiter(',');
  app.add_option("--checkpoint-list", checkpoint_list)->delimiter(',');
  app.add_option("--schedule-list", schedule_list)->delimiter(',');
  app.add_option("--bandwidth-list", bandwidth_list)->delimiter(',');
  app.add_option("--size", size_text);

  std::reverse(args.begin(), args.end());  // CLI11 takes a vector last word first
  try {
    app.parse(args);
  } catch (const CLI::ParseError&) {
    return 0;
  }

  if (!plan_flags.plan_path.empty()) plan_flags.plan_path = fixture_files().plan;
  if (!hardware_flags.hardware_path.empty())
    hardware_flags.hardware_path = fixture_files().hardware;

  const Profile& profile = fuzz::fixed_profile();
  try {
    if (!size_text.empty()) {
      const std::int64_t bytes = parse_bytes(size_text);
      fuzz::require(bytes >= -1, "parse_bytes returned a negative size", size_text);
    }
    for (const auto& b : bandwidth_list) {
      const double bandwidth = cli::parse_bandwidth(b, "--bandwidth-list");
      fuzz::require(bandwidth > 0, "parse_bandwidth returned a non-positive bandwidth", b);
    }
    (void)cli::parse_checkpoint_list(checkpoint_list, "--checkpoint-list");
    (void)cli::parse_schedule_list(schedule_list, "--schedule-list");

    // As `simulate` does.
    const Plan plan = cli::resolve_plan(plan_flags);
    std::string note;
    const Hardware hardware = cli::resolve_hardware(profile, hardware_flags, plan.stages(), &note);
    check_plan(plan, profile, hardware, cli::plan_source(plan_flags));
    const Simulator simulator(profile, hardware);
    const SimulationResult result = simulator.run(plan);
    fuzz::check_result(result, std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const InputError&) {
    return 0;
  }
  return 0;
}
