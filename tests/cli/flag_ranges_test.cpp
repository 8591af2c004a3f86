// Every flag of every subcommand, given a value out of its range or not a number at all: one
// line under 200 characters that names the flag, and exit status 2. The flags are found by
// walking the app the programs build, so a flag added later is covered without a new test.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "cli/number_flags.hpp"
#include "cli/run_app.hpp"

namespace pipetune {
namespace {

struct Flag {
  std::string subcommand;
  std::string name;
  std::optional<cli::NumberRange> range;  ///< numeric flags only
};

std::vector<Flag> every_flag_that_takes_a_value() {
  CLI::App app;
  std::vector<cli::Command> commands;
  cli::add_commands(app, commands);
  std::vector<Flag> flags;
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    for (CLI::Option* option : sub->get_options()) {
      if (option->get_expected_min() == 0 || option->get_positional()) continue;  // --json, …
      std::optional<cli::NumberRange> range;
      try {
        range = cli::number_range(option->get_validator("")->get_name());
      } catch (const CLI::OptionNotFound&) {
      }
      flags.push_back({sub->get_name(), option->get_name(), range});
    }
  }
  return flags;
}

// One past a whole bound, as text: past int64's edge it must be refused, not wrap.
std::string below(std::int64_t min) {
  return min == std::numeric_limits<std::int64_t>::min() ? "-9223372036854775809"
                                                         : std::to_string(min - 1);
}
std::string above(std::int64_t max) {
  return max == std::numeric_limits<std::int64_t>::max() ? "9223372036854775808"
                                                         : std::to_string(max + 1);
}

// Values outside the flag's range, and values that are not numbers of its kind.
std::vector<std::string> bad_values(const cli::NumberRange& r) {
  std::vector<std::string> values{"abc", "1x"};
  if (r.whole) {
    values.push_back(below(r.whole_min));
    values.push_back(above(r.whole_max));
    values.push_back("1.5");
  } else {
    values.push_back(r.min_excluded ? std::to_string(r.min) : std::to_string(r.min - 1));
    values.push_back(std::to_string(r.max * 10 + 1));
    values.push_back("nan");
    values.push_back("1e999");
  }
  return values;
}

struct Outcome {
  int exit_code;
  std::string err;
};

// What the program does with these arguments: the same run_app its main calls.
Outcome run(const std::vector<std::string>& args) {
  CLI::App app;
  std::vector<cli::Command> commands;
  cli::add_commands(app, commands);
  std::vector<std::string> words{"pipetune"};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  ::testing::internal::CaptureStderr();
  const int code = cli::run_app(app, commands, static_cast<int>(argv.size()), argv.data());
  return {code, ::testing::internal::GetCapturedStderr()};
}

void expect_one_line_naming(const Outcome& o, const std::string& flag, const std::string& what) {
  EXPECT_EQ(o.exit_code, 2) << what << ": " << o.err;
  ASSERT_FALSE(o.err.empty()) << what;
  EXPECT_EQ(o.err.find('\n'), o.err.size() - 1) << what << ": not one line: " << o.err;
  EXPECT_LT(o.err.size(), 200u) << what << ": " << o.err;
  EXPECT_NE(o.err.find(flag), std::string::npos)
      << what << ": does not name " << flag << ": " << o.err;
}

TEST(FlagRanges, EveryNumericFlagSaysItsRangeInOneLine) {
  int numeric = 0;
  for (const Flag& f : every_flag_that_takes_a_value()) {
    if (!f.range) continue;
    ++numeric;
    for (const std::string& value : bad_values(*f.range)) {
      const std::string what = f.subcommand + " " + f.name + " \"" + value + "\"";
      const Outcome o = run({f.subcommand, f.name + "=" + value});
      expect_one_line_naming(o, f.name, what);
      EXPECT_NE(o.err.find("expected a"), std::string::npos) << what << ": " << o.err;
    }
  }
  // The sim commands alone have more than a dozen; a walk that found none is broken.
  EXPECT_GT(numeric, 12);
}

TEST(FlagRanges, AFlagGivenNoValueSaysSoInOneLine) {
  for (const Flag& f : every_flag_that_takes_a_value()) {
    expect_one_line_naming(run({f.subcommand, f.name + "="}), f.name, f.subcommand + " " + f.name);
  }
}

TEST(FlagRanges, NoFlagLeavesANumberToCLI11sConversion) {
  // A numeric flag without a range check would answer "abc" with CLI11's "Could not convert".
  for (const Flag& f : every_flag_that_takes_a_value()) {
    if (f.range) continue;
    const Outcome o = run({f.subcommand, f.name + "=abc", "--help-all-unknown-flag"});
    EXPECT_EQ(o.err.find("Could not convert"), std::string::npos)
        << f.subcommand << " " << f.name << ": " << o.err;
  }
}

TEST(FlagRanges, AValueInsideTheRangeIsAccepted) {
  // The checks must not refuse what they allow: the bounds themselves parse.
  for (const Flag& f : every_flag_that_takes_a_value()) {
    if (!f.range || f.range->min_excluded) continue;
    CLI::App app;
    std::vector<cli::Command> commands;
    cli::add_commands(app, commands);
    for (const double bound : {f.range->min, f.range->max}) {
      const std::string value = !f.range->whole         ? fmt::format("{}", bound)
                                : bound == f.range->min ? std::to_string(f.range->whole_min)
                                                        : std::to_string(f.range->whole_max);
      std::vector<std::string> words{"pipetune", f.subcommand, f.name + "=" + value};
      std::vector<char*> argv;
      for (auto& w : words) argv.push_back(w.data());
      try {
        app.parse(static_cast<int>(argv.size()), argv.data());
      } catch (const CLI::RequiredError&) {
        // Other flags are missing: this one passed its check.
      } catch (const CLI::ParseError& e) {
        ADD_FAILURE() << f.subcommand << " " << f.name << " " << value << ": " << e.what();
      }
      app.clear();
    }
  }
}

}  // namespace
}  // namespace pipetune
