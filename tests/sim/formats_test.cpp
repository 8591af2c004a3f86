// Loaders accept the documented formats and reject bad input with one message that names the
// file, the JSON path and what was expected.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "sim/cost_model.hpp"
#include "sim/error.hpp"
#include "sim/file_io.hpp"
#include "sim/hardware.hpp"
#include "sim/plan.hpp"
#include "sim/profile.hpp"
#include "tests/sim/fixtures.hpp"
#include "tests/support/scratch_dir.hpp"

namespace pipetune {
namespace {

using ::testing::HasSubstr;

const char* const kProfile = R"({
  "format": "pipetune.profile/1",
  "model": "tiny",
  "device": {"type": "cpu", "name": "test", "memory_bytes": 0},
  "dtype": "float32",
  "batch_size": 8,
  "micro_batch_sizes": [1, 4],
  "input_bytes": [16, 64],
  "layers": [
    {"name": "0", "param_bytes": 400, "forward_ms": [0.5, 1.0], "backward_ms": [1.0, 2.0],
     "output_bytes": [40, 160], "saved_bytes": [4, 16], "workspace_bytes": [0, 0]},
    {"name": "1", "param_bytes": 0, "forward_ms": [0.1, 0.2], "backward_ms": [0.1, 0.2],
     "output_bytes": [40, 160], "saved_bytes": [40, 160], "workspace_bytes": [8, 8],
     "forward_ms_spread": [0.01, 0.02]}
  ]
})";

using testing::error_of;

std::string profile_error(const std::string& text) {
  return error_of([](const std::string& t, const std::string& s) { parse_profile(t, s); }, text);
}

// kProfile with one substring replaced.
std::string profile_with(const std::string& from, const std::string& to) {
  std::string text = kProfile;
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

TEST(ProfileFormat, ParsesEveryField) {
  const Profile p = parse_profile(kProfile, "in.json");
  EXPECT_EQ(p.model, "tiny");
  EXPECT_EQ(p.device.type, "cpu");
  EXPECT_EQ(p.batch_size, 8);
  EXPECT_EQ(p.micro_batch_sizes, (std::vector<std::int64_t>{1, 4}));
  ASSERT_EQ(p.layers.size(), 2u);
  EXPECT_EQ(p.layers[0].param_bytes, 400);
  EXPECT_EQ(p.layers[1].saved_bytes, (std::vector<std::int64_t>{40, 160}));
  EXPECT_EQ(p.layers[1].forward_ms_spread, (std::vector<double>{0.01, 0.02}));
  EXPECT_TRUE(p.layers[0].forward_ms_spread.empty());
}

TEST(ProfileFormat, RoundTripsThroughJson) {
  const Profile p = parse_profile(kProfile, "in.json");
  const Profile q = parse_profile(profile_to_json(p), "again.json");
  EXPECT_EQ(profile_to_json(p), profile_to_json(q));
  EXPECT_EQ(q.layers[1].forward_ms_spread, p.layers[1].forward_ms_spread);
}

TEST(ProfileFormat, MalformedJsonNamesLineAndColumn) {
  const std::string e =
      profile_error("{\n  \"format\": \"pipetune.profile/1\",\n  \"model\" \"x\"\n}");
  EXPECT_THAT(e, HasSubstr("in.json: invalid JSON at line 3, column"));
}

TEST(ProfileFormat, TruncatedFileSaysWhereItEnds) {
  // A profile cut off mid-write (a full disk, a killed copy): one message, where it ends.
  const std::string text =
      std::string(kProfile).substr(0, std::string(kProfile).find("\"layers\": [") + 11);
  const std::string e = profile_error(text);
  EXPECT_THAT(e, HasSubstr("in.json: invalid JSON at line 9, column 14"));
  EXPECT_THAT(e, HasSubstr("unexpected end of input"));
}

TEST(ProfileFormat, EmptyFile) {
  EXPECT_EQ(profile_error("  \n"), "in.json: empty file, expected a JSON document");
}

TEST(ProfileFormat, WrongFormatTag) {
  EXPECT_EQ(profile_error(profile_with("pipetune.profile/1", "pipetune.profile/9")),
            "in.json: format: expected \"pipetune.profile/1\", got \"pipetune.profile/9\"");
}

TEST(ProfileFormat, TwoLayersOfOneNameAreRefusedNamingBoth) {
  // Traces and the GUI find a task's layer by name: a second "0" would be confused with the first.
  EXPECT_EQ(profile_error(profile_with(R"({"name": "1")", R"({"name": "0")")),
            "in.json: layers[1].name: \"0\" is also the name of layers[0]: every layer needs a "
            "name of its own");
  // Names that differ only past a common prefix are distinct.
  EXPECT_NO_THROW(parse_profile(profile_with(R"({"name": "1")", R"({"name": "01")"), "in.json"));
}

TEST(ProfileFormat, MissingField) {
  EXPECT_EQ(profile_error(profile_with("\"dtype\": \"float32\",", "")),
            "in.json: missing field \"dtype\"");
  EXPECT_EQ(profile_error(profile_with("\"param_bytes\": 400, ", "")),
            "in.json: layers[0]: missing field \"param_bytes\"");
}

TEST(ProfileFormat, WrongType) {
  EXPECT_EQ(profile_error(profile_with("\"batch_size\": 8", "\"batch_size\": \"8\"")),
            "in.json: batch_size: expected a positive integer, got \"8\"");
  EXPECT_EQ(profile_error(profile_with("\"forward_ms\": [0.5, 1.0]", "\"forward_ms\": 0.5")),
            "in.json: layers[0].forward_ms: expected an array of 2 non-negative numbers, one per "
            "micro-batch size, got 0.5");
}

TEST(ProfileFormat, NegativeCost) {
  EXPECT_EQ(
      profile_error(profile_with("\"backward_ms\": [1.0, 2.0]", "\"backward_ms\": [1.0, -2.0]")),
      "in.json: layers[0].backward_ms[1]: expected a non-negative number of milliseconds up to "
      "1e9, "
      "got -2.0");
  EXPECT_EQ(
      profile_error(profile_with("\"saved_bytes\": [4, 16]", "\"saved_bytes\": [4, -16]")),
      "in.json: layers[0].saved_bytes[1]: expected a byte count from 0 to 70368744177664 (64 TiB), "
      "got -16");
}

TEST(ProfileFormat, WrongArrayLength) {
  EXPECT_EQ(profile_error(profile_with("\"input_bytes\": [16, 64]", "\"input_bytes\": [16]")),
            "in.json: input_bytes: expected an array of 2 non-negative integers (bytes), one per "
            "micro-batch size, got an array of 1 element");
}

TEST(ProfileFormat, SizesMustIncrease) {
  EXPECT_EQ(
      profile_error(profile_with("\"micro_batch_sizes\": [1, 4]", "\"micro_batch_sizes\": [4, 4]")),
      "in.json: micro_batch_sizes[1]: expected a size above 4 (sizes must be strictly "
      "increasing), got 4");
}

TEST(ProfileFormat, UnknownFieldIsATypo) {
  EXPECT_EQ(
      profile_error(profile_with("\"dtype\"", "\"dtyp\": 1, \"dtype\"")),
      "in.json: dtyp: unknown field (expected one of: format, model, device, dtype, "
      "batch_size, micro_batch_sizes, min_micro_batch, input_bytes, layers, timer, co_runners, "
      "tied_parameters, meta)");
}

// kProfile with both layers holding 400 bytes and `tied` as its tied_parameters.
std::string tied_profile(const std::string& tied) {
  std::string text = profile_with("\"param_bytes\": 0", "\"param_bytes\": 400");
  return text.replace(text.find("\"layers\""), 0, "\"tied_parameters\": " + tied + ",\n  ");
}

TEST(ProfileFormat, TiedParametersRoundTrip) {
  const Profile p = parse_profile(
      tied_profile(R"([{"name": "0.weight", "layers": [0, 1], "bytes": 256}])"), "in.json");
  ASSERT_EQ(p.tied.size(), 1u);
  EXPECT_EQ(p.tied[0].name, "0.weight");
  EXPECT_EQ(p.tied[0].layers, (std::vector<int>{0, 1}));
  EXPECT_EQ(p.tied[0].bytes, 256);
  const Profile again = parse_profile(profile_to_json(p), "again.json");
  ASSERT_EQ(again.tied.size(), 1u);
  EXPECT_EQ(again.tied[0].layers, p.tied[0].layers);
  EXPECT_EQ(again.tied[0].bytes, 256);
  // Absent, nothing is tied and nothing is written.
  EXPECT_EQ(profile_to_json(parse_profile(kProfile, "in.json")).find("tied"), std::string::npos);
}

// A model that cannot train on fewer samples (batch norm over one value per channel) is
// profiled from there: the field round-trips, an old profile reads as 1 and writes nothing, and
// a size measured below it is refused.
TEST(ProfileFormat, TheFewestSamplesAMicroBatchMayHold) {
  const Profile p =
      parse_profile(profile_with(R"("micro_batch_sizes": [1, 4],)",
                                 R"("micro_batch_sizes": [2, 4], "min_micro_batch": 2,)"),
                    "in.json");
  EXPECT_EQ(p.min_micro_batch, 2);
  EXPECT_NE(profile_to_json(p).find(R"("min_micro_batch": 2)"), std::string::npos);
  EXPECT_EQ(parse_profile(profile_to_json(p), "again.json").min_micro_batch, 2);
  const Profile old = parse_profile(kProfile, "in.json");
  EXPECT_EQ(old.min_micro_batch, 1);
  EXPECT_EQ(profile_to_json(old).find("min_micro_batch"), std::string::npos);
  EXPECT_EQ(profile_error(profile_with(R"("micro_batch_sizes": [1, 4],)",
                                       R"("micro_batch_sizes": [1, 4], "min_micro_batch": 2,)")),
            "in.json: min_micro_batch: expected at most the smallest of micro_batch_sizes, 1 (no "
            "size measured below the fewest samples a micro-batch may hold), got 2");
}

TEST(ProfileFormat, TiedParametersAreCheckedAgainstTheLayers) {
  EXPECT_EQ(profile_error(tied_profile(R"([{"name": "w", "layers": [0, 2], "bytes": 1}])")),
            "in.json: tied_parameters[0].layers[1]: expected a layer index below 2, got 2");
  EXPECT_EQ(profile_error(tied_profile(R"([{"name": "w", "layers": [1, 0], "bytes": 1}])")),
            "in.json: tied_parameters[0].layers[1]: expected a layer after 1 (holders strictly "
            "increasing), got 0");
  EXPECT_EQ(profile_error(tied_profile(R"([{"name": "w", "layers": [0], "bytes": 1}])")),
            "in.json: tied_parameters[0].layers: expected at least two layers holding the tensor, "
            "got an array of 1 element");
  EXPECT_EQ(profile_error(tied_profile(R"([{"name": "w", "layers": [0, 1], "bytes": 500}])")),
            "in.json: tied_parameters[0].layers[0]: layers[0] holds 400 parameter bytes, fewer "
            "than the 500 of the tied tensor it is said to hold");
}

TEST(ProfileFormat, TimerSaysHowTimesWereTaken) {
  EXPECT_EQ(parse_profile(kProfile, "in.json").timer, "");  // older profiles have none
  EXPECT_EQ(profile_to_json(parse_profile(kProfile, "in.json")).find("\"timer\""),
            std::string::npos);
  for (const std::string timer : {"clock", "cupti", "cuda-events"}) {
    const Profile p = parse_profile(
        profile_with("\"dtype\"", "\"timer\": \"" + timer + "\", \"dtype\""), "in.json");
    EXPECT_EQ(p.timer, timer);
    EXPECT_EQ(parse_profile(profile_to_json(p), "again.json").timer, timer);
  }
  EXPECT_EQ(profile_error(profile_with("\"dtype\"", "\"timer\": \"stopwatch\", \"dtype\"")),
            "in.json: timer: expected \"clock\", \"cuda-events\" or \"cupti\", got \"stopwatch\"");
}

TEST(ProfileFormat, NoLayers) {
  const std::string text =
      std::string(kProfile).substr(0, std::string(kProfile).find("\"layers\"")) + "\"layers\": []}";
  EXPECT_EQ(profile_error(text),
            "in.json: layers: expected a non-empty array of layers, got an array of 0 elements");
}

// `text` with one substring replaced.
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

// kProfile with measured backward peaks on layer 0 (`first`, `accumulate`) and on layer 1.
std::string profile_with_peaks(
    const std::string& first = R"("backward_peak_bytes": [440, 560], )",
    const std::string& accumulate = R"("backward_accumulate_peak_bytes": [400, 400], )",
    const std::string& layer1 = R"("backward_peak_bytes": [40, 160], )"
                                R"("backward_accumulate_peak_bytes": [40, 160], )") {
  const std::string text = replaced(kProfile, R"("workspace_bytes": [0, 0])",
                                    first + accumulate + R"("workspace_bytes": [0, 0])");
  return replaced(text, R"("workspace_bytes": [8, 8])", layer1 + R"("workspace_bytes": [8, 8])");
}

// Frozen parameters (transfer learning): trainable_param_bytes, where written, is the part of
// param_bytes that trains; absent, all of it. A frozen tied tensor says so, and counts in no
// holder's trainable bytes.
TEST(ProfileFormat, TrainableParameterBytesRoundTripAndAreChecked) {
  const std::string frozen = R"("param_bytes": 400, "trainable_param_bytes": 100,)";
  const Profile p = parse_profile(profile_with(R"("param_bytes": 400,)", frozen), "in.json");
  EXPECT_EQ(p.layers[0].trainable_param_bytes, 100);
  EXPECT_EQ(p.layers[0].trained_bytes(), 100);
  EXPECT_EQ(p.layers[1].trainable_param_bytes, -1);
  const Profile q = parse_profile(profile_to_json(p), "again.json");
  EXPECT_EQ(q.layers[0].trainable_param_bytes, 100);
  EXPECT_EQ(q.layers[1].trainable_param_bytes, -1);
  EXPECT_EQ(profile_to_json(parse_profile(kProfile, "in.json")).find("trainable"),
            std::string::npos);
  EXPECT_EQ(profile_error(profile_with(R"("param_bytes": 400,)",
                                       R"("param_bytes": 400, "trainable_param_bytes": 500,)")),
            "in.json: layers[0].trainable_param_bytes: expected at most param_bytes (400), got "
            "500");
  // Both layers hold 400 bytes, 256 of them one tied tensor.
  const std::string tied = R"([{"name": "w", "layers": [0, 1], "bytes": 256}])";
  const std::string frozen_tied =
      R"([{"name": "w", "layers": [0, 1], "bytes": 256, "trainable": false}])";
  EXPECT_EQ(profile_error(replaced(tied_profile(tied), R"("param_bytes": 400,)",
                                   R"("param_bytes": 400, "trainable_param_bytes": 144,)")),
            "in.json: tied_parameters[0].layers[0]: layers[0] has 144 trainable parameter bytes, "
            "fewer than the 256 of the tied tensor it is said to train (\"trainable\": false if "
            "it is frozen)");
  std::string text = tied_profile(frozen_tied);
  for (const std::string forward : {R"("forward_ms": [0.5)", R"("forward_ms": [0.1)"})
    text = replaced(text, forward, R"("trainable_param_bytes": 144, )" + forward);
  const Profile r = parse_profile(text, "in.json");
  ASSERT_EQ(r.tied.size(), 1u);
  EXPECT_FALSE(r.tied[0].trained);
  EXPECT_FALSE(parse_profile(profile_to_json(r), "again.json").tied[0].trained);
  // The cost model: the tensor held once, its gradient and state nowhere; trained, once.
  const CostModel costs(r);
  EXPECT_EQ(costs.param_bytes(0, 2), 800 - 256);
  EXPECT_EQ(costs.trained_bytes(0, 2), 288);
  EXPECT_EQ(costs.trained_bytes_at_least(0, 2), 288);
  const Profile t = parse_profile(tied_profile(tied), "in.json");
  EXPECT_EQ(CostModel(t).trained_bytes(0, 2), 800 - 256);
  EXPECT_EQ(CostModel(t).trained_bytes_in(1, 0, 1), 400 - 256);
  // Layer 1's input needs a gradient only where layer 0 trains.
  EXPECT_FALSE(costs.input_needs_gradient(0));
  EXPECT_TRUE(costs.input_needs_gradient(1));
  const Profile stem = parse_profile(
      profile_with(R"("param_bytes": 400,)", R"("param_bytes": 400, "trainable_param_bytes": 0,)"),
      "in.json");
  EXPECT_FALSE(CostModel(stem).input_needs_gradient(1));
}

// A layer's buffers: optional, written only where there are some, never negative.
TEST(ProfileFormat, BufferBytesRoundTripAndAreChecked) {
  const Profile p = parse_profile(
      profile_with(R"("param_bytes": 400,)", R"("param_bytes": 400, "buffer_bytes": 96,)"),
      "in.json");
  EXPECT_EQ(p.layers[0].buffer_bytes, 96);
  EXPECT_EQ(p.layers[1].buffer_bytes, 0);
  const Profile q = parse_profile(profile_to_json(p), "again.json");
  EXPECT_EQ(q.layers[0].buffer_bytes, 96);
  EXPECT_EQ(profile_to_json(parse_profile(kProfile, "in.json")).find("buffer"), std::string::npos);
  const CostModel costs(p);
  EXPECT_EQ(costs.buffer_bytes(0, 2), 96);
  EXPECT_EQ(costs.held_bytes(0, 1), 496);
  EXPECT_EQ(costs.held_bytes(1, 2), 0);
  EXPECT_EQ(costs.held_bytes_at_least(0, 2), 496);
  EXPECT_EQ(costs.param_bytes(0, 2), 400);  // parameters alone
  EXPECT_THAT(profile_error(profile_with(R"("param_bytes": 400,)",
                                         R"("param_bytes": 400, "buffer_bytes": -1,)")),
              ::testing::HasSubstr("in.json: layers[0].buffer_bytes: "));
}

TEST(ProfileFormat, MeasuredBackwardPeaksParseAndRoundTrip) {
  const Profile p = parse_profile(profile_with_peaks(), "in.json");
  EXPECT_EQ(p.layers[0].backward_peak_bytes, (std::vector<std::int64_t>{440, 560}));
  EXPECT_EQ(p.layers[0].backward_accumulate_peak_bytes, (std::vector<std::int64_t>{400, 400}));
  EXPECT_EQ(p.layers[1].backward_peak_bytes, (std::vector<std::int64_t>{40, 160}));
  const Profile q = parse_profile(profile_to_json(p), "again.json");
  EXPECT_EQ(q.layers[0].backward_peak_bytes, p.layers[0].backward_peak_bytes);
  EXPECT_EQ(q.layers[1].backward_accumulate_peak_bytes, p.layers[1].backward_accumulate_peak_bytes);
  // Without them, none is written.
  EXPECT_EQ(profile_to_json(parse_profile(kProfile, "in.json")).find("backward_peak_bytes"),
            std::string::npos);
}

TEST(ProfileFormat, InnerBackwardPeaksParseRoundTripAndComeWithTheOthers) {
  const std::string inner = R"("inner_backward_peak_bytes": [300, 420], )"
                            R"("inner_backward_accumulate_peak_bytes": [260, 260], )";
  const std::string inner1 = R"("inner_backward_peak_bytes": [40, 160], )"
                             R"("inner_backward_accumulate_peak_bytes": [40, 160], )";
  const std::string peaks1 =
      R"("backward_peak_bytes": [40, 160], "backward_accumulate_peak_bytes": [40, 160], )";
  const Profile p = parse_profile(
      profile_with_peaks(R"("backward_peak_bytes": [440, 560], )" + inner,
                         R"("backward_accumulate_peak_bytes": [400, 400], )", peaks1 + inner1),
      "in.json");
  EXPECT_EQ(p.layers[0].inner_backward_peak_bytes, (std::vector<std::int64_t>{300, 420}));
  EXPECT_EQ(p.layers[0].inner_backward_accumulate_peak_bytes,
            (std::vector<std::int64_t>{260, 260}));
  const Profile q = parse_profile(profile_to_json(p), "again.json");
  EXPECT_EQ(q.layers[0].inner_backward_peak_bytes, p.layers[0].inner_backward_peak_bytes);
  EXPECT_EQ(q.layers[1].inner_backward_accumulate_peak_bytes,
            p.layers[1].inner_backward_accumulate_peak_bytes);
  // Without them the held peaks stand in, and none is written.
  const Profile old = parse_profile(profile_with_peaks(), "in.json");
  EXPECT_TRUE(old.layers[0].inner_backward_peak_bytes.empty());
  EXPECT_EQ(profile_to_json(old).find("inner_backward"), std::string::npos);
  EXPECT_EQ(CostModel(old).at(4).inner_backward_peak_bytes,
            CostModel(old).at(4).backward_peak_bytes);
  EXPECT_EQ(CostModel(p).at(4).inner_backward_peak_bytes, (std::vector<std::int64_t>{420, 160}));

  EXPECT_EQ(profile_error(profile_with_peaks(
                R"("backward_peak_bytes": [440, 560], "inner_backward_peak_bytes": [1, 1], )")),
            "in.json: layers[0]: missing field \"inner_backward_accumulate_peak_bytes\" "
            "(inner_backward_peak_bytes "
            "and inner_backward_accumulate_peak_bytes come together)");
  EXPECT_EQ(profile_error(profile_with_peaks(R"("backward_peak_bytes": [440, 560], )" + inner)),
            "in.json: layers[1]: missing field \"inner_backward_peak_bytes\" (layers[0] has it: "
            "every layer or none)");
  EXPECT_EQ(profile_error(profile_with_peaks(inner, "", "")),
            "in.json: layers[0]: has inner_backward_peak_bytes, but no backward_peak_bytes (they "
            "refine them)");
}

TEST(ProfileFormat, SplitBackwardPeaksParseRoundTripAndComeWithThePeaks) {
  const std::string split = R"("backward_input_peak_bytes": [300, 900], )"
                            R"("backward_weight_peak_bytes": [100, 120], )";
  const std::string split1 = R"("backward_input_peak_bytes": [40, 160], )"
                             R"("backward_weight_peak_bytes": [8, 8], )";
  const std::string peaks1 =
      R"("backward_peak_bytes": [40, 160], "backward_accumulate_peak_bytes": [40, 160], )";
  const Profile p = parse_profile(
      profile_with_peaks(R"("backward_peak_bytes": [440, 560], )" + split,
                         R"("backward_accumulate_peak_bytes": [400, 400], )", peaks1 + split1),
      "in.json");
  EXPECT_EQ(p.layers[0].backward_input_peak_bytes, (std::vector<std::int64_t>{300, 900}));
  EXPECT_EQ(p.layers[0].backward_weight_peak_bytes, (std::vector<std::int64_t>{100, 120}));
  const Profile q = parse_profile(profile_to_json(p), "again.json");
  EXPECT_EQ(q.layers[0].backward_input_peak_bytes, p.layers[0].backward_input_peak_bytes);
  EXPECT_EQ(q.layers[1].backward_weight_peak_bytes, p.layers[1].backward_weight_peak_bytes);
  // Interpolated between the sizes (1 and 4 samples: 2 is a third of the way).
  EXPECT_EQ(CostModel(p).at(2).backward_input_peak_bytes, (std::vector<std::int64_t>{500, 80}));
  // Without them none is written, and the cost model has none.
  const Profile old = parse_profile(profile_with_peaks(), "in.json");
  EXPECT_EQ(profile_to_json(old).find("backward_input_peak"), std::string::npos);
  EXPECT_TRUE(CostModel(old).at(4).backward_weight_peak_bytes.empty());

  EXPECT_EQ(profile_error(profile_with_peaks(
                R"("backward_peak_bytes": [440, 560], "backward_input_peak_bytes": [1, 1], )")),
            "in.json: layers[0]: missing field \"backward_weight_peak_bytes\" "
            "(backward_input_peak_bytes and backward_weight_peak_bytes come together)");
  EXPECT_EQ(profile_error(profile_with_peaks(R"("backward_peak_bytes": [440, 560], )" + split)),
            "in.json: layers[1]: missing field \"backward_input_peak_bytes\" (layers[0] has it: "
            "every layer or none)");
  EXPECT_EQ(profile_error(profile_with_peaks(split, "", "")),
            "in.json: layers[0]: has backward_input_peak_bytes, but no backward_peak_bytes (they "
            "refine them)");
}

TEST(ProfileFormat, BackwardPeakEndsParseRoundTripAndComeWithThePeaks) {
  const std::string ends = R"("backward_peak_end": [0.25, 0.5], )"
                           R"("backward_peak_drop_bytes": [100, 400], )";
  const std::string ends1 = R"("backward_peak_end": [1, 1], "backward_peak_drop_bytes": [0, 0], )";
  const std::string peaks1 =
      R"("backward_peak_bytes": [40, 160], "backward_accumulate_peak_bytes": [40, 160], )";
  const Profile p = parse_profile(
      profile_with_peaks(R"("backward_peak_bytes": [440, 560], )" + ends,
                         R"("backward_accumulate_peak_bytes": [400, 400], )", peaks1 + ends1),
      "in.json");
  EXPECT_EQ(p.layers[0].backward_peak_end, (std::vector<double>{0.25, 0.5}));
  EXPECT_EQ(p.layers[0].backward_peak_drop_bytes, (std::vector<std::int64_t>{100, 400}));
  const Profile q = parse_profile(profile_to_json(p), "again.json");
  EXPECT_EQ(q.layers[0].backward_peak_end, p.layers[0].backward_peak_end);
  EXPECT_EQ(q.layers[1].backward_peak_drop_bytes, p.layers[1].backward_peak_drop_bytes);
  // At a measured size, its record; between two (1 and 4), the later share and the smaller
  // drop, which both sizes' records allow (interpolated apart, 0.33 and 200, neither does).
  EXPECT_DOUBLE_EQ(CostModel(p).at(4).backward_peak_end[0], 0.5);
  EXPECT_EQ(CostModel(p).at(4).backward_peak_drop_bytes[0], 400);
  EXPECT_DOUBLE_EQ(CostModel(p).at(2).backward_peak_end[0], 0.5);
  EXPECT_EQ(CostModel(p).at(2).backward_peak_drop_bytes[0], 100);
  // Without them nothing is written and the cost model has none.
  const Profile old = parse_profile(profile_with_peaks(), "in.json");
  EXPECT_EQ(profile_to_json(old).find("backward_peak_end"), std::string::npos);
  EXPECT_TRUE(CostModel(old).at(4).backward_peak_end.empty());

  EXPECT_EQ(profile_error(profile_with_peaks(R"("backward_peak_bytes": [440, 560], )"
                                             R"("backward_peak_end": [0.25, 0.5], )")),
            "in.json: layers[0]: missing field \"backward_peak_drop_bytes\" (backward_peak_end "
            "and backward_peak_drop_bytes come together)");
  EXPECT_EQ(profile_error(profile_with_peaks(R"("backward_peak_bytes": [440, 560], )" + ends)),
            "in.json: layers[1]: missing field \"backward_peak_end\" (layers[0] has it: every "
            "layer or none)");
  EXPECT_EQ(profile_error(profile_with_peaks(ends, "", "")),
            "in.json: layers[0]: has backward_peak_end, but no backward_peak_bytes (it belongs to "
            "them)");
  EXPECT_EQ(profile_error(profile_with_peaks(R"("backward_peak_bytes": [440, 560], )"
                                             R"("backward_peak_end": [0.25, 1.5], )"
                                             R"("backward_peak_drop_bytes": [100, 400], )",
                                             R"("backward_accumulate_peak_bytes": [400, 400], )",
                                             peaks1 + ends1)),
            "in.json: layers[0].backward_peak_end[1]: expected a number from 0 to 1 (a share), "
            "got 1.5");
}

TEST(ProfileFormat, NoGradForwardTimesParseAndRoundTrip) {
  const Profile p =
      parse_profile(profile_with(R"("forward_ms": [0.5, 1.0])",
                                 R"("forward_ms": [0.5, 1.0], "forward_nograd_ms": [0.25, 0.75])"),
                    "in.json");
  EXPECT_EQ(p.layers[0].forward_nograd_ms, (std::vector<double>{0.25, 0.75}));
  EXPECT_TRUE(p.layers[1].forward_nograd_ms.empty());  // optional per layer: forward_ms stands in
  EXPECT_EQ(parse_profile(profile_to_json(p), "again.json").layers[0].forward_nograd_ms,
            p.layers[0].forward_nograd_ms);
  EXPECT_EQ(
      profile_error(profile_with(R"("forward_ms": [0.5, 1.0])",
                                 R"("forward_ms": [0.5, 1.0], "forward_nograd_ms": [0.25, -1])")),
      "in.json: layers[0].forward_nograd_ms[1]: expected a non-negative number of milliseconds "
      "up to 1e9, got -1");
}

// kProfile with launch times added to layer 0 (`first`) and layer 1 (`second`).
std::string profile_with_launches(const std::string& first, const std::string& second) {
  std::string text =
      profile_with(R"("forward_ms": [0.5, 1.0])", first + R"("forward_ms": [0.5, 1.0])");
  const std::string from = R"("forward_ms": [0.1, 0.2])";
  return text.replace(text.find(from), from.size(), second + from);
}

TEST(ProfileFormat, LaunchTimesParseRoundTripAndComeTogetherOnEveryLayer) {
  const std::string both =
      R"("forward_launch_ms": [0.75, 0.8], "backward_launch_ms": [1.5, 1.6], )";
  const Profile p =
      parse_profile(profile_with_launches(both + R"("forward_nograd_launch_ms": [0.5, 0.6], )",
                                          both + R"("forward_nograd_launch_ms": [0.1, 0.1], )"),
                    "in.json");
  EXPECT_TRUE(p.has_launch_times());
  EXPECT_EQ(p.layers[0].forward_launch_ms, (std::vector<double>{0.75, 0.8}));
  EXPECT_EQ(p.layers[1].backward_launch_ms, (std::vector<double>{1.5, 1.6}));
  EXPECT_EQ(p.layers[0].forward_nograd_launch_ms, (std::vector<double>{0.5, 0.6}));
  const Profile q = parse_profile(profile_to_json(p), "again.json");
  EXPECT_EQ(profile_to_json(q), profile_to_json(p));
  EXPECT_EQ(q.layers[1].forward_nograd_launch_ms, p.layers[1].forward_nograd_launch_ms);
  EXPECT_FALSE(parse_profile(kProfile, "in.json").has_launch_times());
  EXPECT_EQ(profile_error(profile_with(R"("memory_bytes": 0})",
                                       R"("memory_bytes": 0, "backward_call_ms": 0.1})")),
            "in.json: device.backward_call_ms: is given, but no layer has launch times "
            "(forward_launch_ms), "
            "which it belongs with");
  EXPECT_EQ(profile_error(profile_with_launches(R"("forward_launch_ms": [0.75, 0.8], )", "")),
            "in.json: layers[0]: missing field \"backward_launch_ms\" (forward_launch_ms and "
            "backward_launch_ms come together)");
  EXPECT_EQ(profile_error(profile_with_launches(both, "")),
            "in.json: layers[1]: missing field \"forward_launch_ms\" (layers[0] has it: every "
            "layer or none)");
  EXPECT_EQ(
      profile_error(profile_with_launches("", both)),
      "in.json: layers[1]: has forward_launch_ms, but layers[0] has none (every layer or none)");
  EXPECT_EQ(profile_error(profile_with_launches(R"("forward_nograd_launch_ms": [0.5, 0.6], )", "")),
            "in.json: layers[0]: has forward_nograd_launch_ms, but no forward_launch_ms (they come "
            "with it)");
  EXPECT_EQ(profile_error(
                profile_with_launches(both + R"("forward_nograd_launch_ms": [0.5, 0.6], )", both)),
            "in.json: layers[1]: missing field \"forward_nograd_launch_ms\" (layers[0] has it: "
            "every layer or "
            "none)");
  EXPECT_EQ(profile_error(profile_with_launches(
                R"("forward_launch_ms": [0.75, -2], "backward_launch_ms": [1, 1], )", both)),
            "in.json: layers[0].forward_launch_ms[1]: expected a non-negative number of "
            "milliseconds up to 1e9, got -2");
}

// Launch-bound where the whole model's launches and one backward call outlast its device time.
TEST(ProfileFormat, LaunchBoundSizesAreWhereTheLaunchesOutlastTheDevice) {
  Profile p = parse_profile(kProfile, "in.json");  // device: 1.7 ms at 1 sample, 3.4 ms at 4
  EXPECT_TRUE(launch_bound_sizes(p).empty());      // no launch times: nothing to say
  for (auto& l : p.layers) {
    l.forward_launch_ms = {0.4, 0.4};
    l.backward_launch_ms = {0.4, 0.4};
  }
  EXPECT_EQ(launch_bound_sizes(p), (std::vector<std::int64_t>{}));  // 1.6 < 1.7
  p.device.backward_call_ms = 0.2;                                  // 1.8 > 1.7, < 3.4
  EXPECT_EQ(launch_bound_sizes(p), (std::vector<std::int64_t>{1}));
  p.layers[0].backward_launch_ms[1] = 2.5;  // 3.7 + 0.2 > 3.4
  EXPECT_EQ(launch_bound_sizes(p), (std::vector<std::int64_t>{1, 4}));
}

TEST(ProfileFormat, WhatAutogradKeepsParsesAndRoundTrips) {
  // Absent: the input kept, the output neither kept by the layer nor a view (older profiles).
  const Profile old = parse_profile(kProfile, "in.json");
  EXPECT_TRUE(old.layers[0].keeps_input);
  EXPECT_FALSE(old.layers[0].keeps_output);
  EXPECT_FALSE(old.layers[0].output_aliases_input);
  EXPECT_FALSE(old.layers[0].modifies_input);
  EXPECT_EQ(old.device.library_bytes, 0);
  EXPECT_EQ(profile_to_json(old).find("keeps_"), std::string::npos);  // defaults are not written
  EXPECT_EQ(profile_to_json(old).find("modifies_"), std::string::npos);
  const Profile p = parse_profile(
      profile_with(
          R"("forward_ms": [0.5, 1.0])",
          R"("forward_ms": [0.5, 1.0], "keeps_input": false, "keeps_output": true, "output_aliases_input": true, "modifies_input": true)"),
      "in.json");
  EXPECT_FALSE(p.layers[0].keeps_input);
  EXPECT_TRUE(p.layers[0].keeps_output);
  EXPECT_TRUE(p.layers[0].output_aliases_input);
  EXPECT_TRUE(p.layers[0].modifies_input);
  EXPECT_TRUE(p.layers[1].keeps_input);
  EXPECT_FALSE(p.layers[1].modifies_input);
  const Profile q = parse_profile(profile_to_json(p), "again.json");
  EXPECT_FALSE(q.layers[0].keeps_input);
  EXPECT_TRUE(q.layers[0].keeps_output);
  EXPECT_TRUE(q.layers[0].output_aliases_input);
  EXPECT_TRUE(q.layers[0].modifies_input);
  EXPECT_FALSE(q.layers[1].modifies_input);
  EXPECT_EQ(profile_error(profile_with(R"("forward_ms": [0.5, 1.0])",
                                       R"("forward_ms": [0.5, 1.0], "keeps_input": 1)")),
            "in.json: layers[0].keeps_input: expected true or false, got 1");
  EXPECT_EQ(profile_error(profile_with(R"("forward_ms": [0.5, 1.0])",
                                       R"("forward_ms": [0.5, 1.0], "modifies_input": "yes")")),
            "in.json: layers[0].modifies_input: expected true or false, got \"yes\"");
  // What torch's zero-bubble I keeps and frees (an eager profile's): both or neither, every
  // layer or none.
  Profile torch_counts = parse_profile(kProfile, "in.json");
  for (auto& l : torch_counts.layers) {
    l.torch_weight_gradient_bytes = {30, 60};
    l.torch_freed_by_input_bytes = {2, 4};
    l.torch_weight_peak_bytes = {40, 80};
    l.torch_weight_accumulate_peak_bytes = {20, 40};
    l.torch_weight_freed_bytes = {6, 12};
  }
  torch_counts.layers[0].torch_keeps_output_gradient = true;
  torch_counts.layers[1].torch_weight_frees_input = true;
  const Profile torch_again = parse_profile(profile_to_json(torch_counts), "again.json");
  EXPECT_EQ(torch_again.layers[1].torch_weight_gradient_bytes, (std::vector<std::int64_t>{30, 60}));
  EXPECT_EQ(torch_again.layers[0].torch_freed_by_input_bytes, (std::vector<std::int64_t>{2, 4}));
  EXPECT_TRUE(torch_again.layers[0].torch_keeps_output_gradient);
  EXPECT_FALSE(torch_again.layers[1].torch_keeps_output_gradient);
  EXPECT_EQ(torch_again.layers[1].torch_weight_accumulate_peak_bytes,
            (std::vector<std::int64_t>{20, 40}));
  EXPECT_EQ(torch_again.layers[0].torch_weight_freed_bytes, (std::vector<std::int64_t>{6, 12}));
  EXPECT_FALSE(torch_again.layers[0].torch_weight_frees_input);
  EXPECT_TRUE(torch_again.layers[1].torch_weight_frees_input);
  EXPECT_EQ(profile_error(
                profile_with(R"("forward_ms": [0.5, 1.0])",
                             R"("forward_ms": [0.5, 1.0], "torch_weight_freed_bytes": [6, 12])")),
            "in.json: layers[0]: has torch_weight_freed_bytes, but no torch_weight_peak_bytes (it "
            "comes with them)");
  EXPECT_EQ(profile_error(profile_with(
                R"("forward_ms": [0.5, 1.0])",
                R"("forward_ms": [0.5, 1.0], "torch_weight_gradient_bytes": [30, 60])")),
            "in.json: layers[0]: missing field \"torch_freed_by_input_bytes\" "
            "(torch_weight_gradient_bytes and torch_freed_by_input_bytes come together)");
  EXPECT_EQ(
      profile_error(profile_with(R"("forward_ms": [0.5, 1.0])",
                                 R"("forward_ms": [0.5, 1.0], "torch_weight_gradient_bytes": )"
                                 R"([30, 60], "torch_freed_by_input_bytes": [2, 4])")),
      "in.json: layers[1]: missing field \"torch_weight_gradient_bytes\" (layers[0] has it: "
      "every layer or none)");
  // The device's library workspaces.
  const Profile gpu = parse_profile(
      profile_with(R"("memory_bytes": 0})", R"("memory_bytes": 0, "library_bytes": 33554432})"),
      "in.json");
  EXPECT_EQ(gpu.device.library_bytes, 33554432);
  EXPECT_EQ(parse_profile(profile_to_json(gpu), "again.json").device.library_bytes, 33554432);
  EXPECT_EQ(profile_error(profile_with(R"("memory_bytes": 0})",
                                       R"("memory_bytes": 0, "library_bytes": -1})")),
            "in.json: device.library_bytes: expected a byte count from 0 to 70368744177664 (64 "
            "TiB), got -1");
}

TEST(ProfileFormat, MeasuredBackwardPeaksBothOrNeitherOnEveryLayer) {
  EXPECT_EQ(profile_error(profile_with_peaks(R"("backward_peak_bytes": [440, 560], )", "")),
            "in.json: layers[0]: missing field \"backward_accumulate_peak_bytes\" "
            "(backward_peak_bytes and "
            "backward_accumulate_peak_bytes come together)");
  EXPECT_EQ(
      profile_error(profile_with_peaks(R"("backward_peak_bytes": [440, 560], )",
                                       R"("backward_accumulate_peak_bytes": [400, 400], )", "")),
      "in.json: layers[1]: missing field \"backward_peak_bytes\" (layers[0] has it: every layer or "
      "none)");
  EXPECT_EQ(
      profile_error(profile_with_peaks("", "")),
      "in.json: layers[1]: has backward_peak_bytes, but layers[0] has none (every layer or none)");
  EXPECT_EQ(profile_error(profile_with_peaks(R"("backward_peak_bytes": [440], )")),
            "in.json: layers[0].backward_peak_bytes: expected an array of 2 non-negative integers "
            "(bytes), one "
            "per micro-batch size, got an array of 1 element");
}

TEST(ProfileFormat, SmSharesAreReadWrittenOnlyWhenSetAndMustCountShares) {
  EXPECT_EQ(parse_profile(kProfile, "in.json").device.sm_shares, 0);  // the whole device
  EXPECT_EQ(profile_to_json(parse_profile(kProfile, "in.json")).find("sm_shares"),
            std::string::npos);
  std::string text = kProfile;
  text.replace(text.find("\"memory_bytes\": 0}"), 18, "\"memory_bytes\": 0, \"sm_shares\": 2}");
  const Profile p = parse_profile(text, "in.json");
  EXPECT_EQ(p.device.sm_shares, 2);
  EXPECT_EQ(parse_profile(profile_to_json(p), "again").device.sm_shares, 2);
  text.replace(text.find("\"sm_shares\": 2"), 14, "\"sm_shares\": 0");
  EXPECT_EQ(profile_error(text), "in.json: device.sm_shares: expected a positive integer, got 0");
  text.replace(text.find("\"sm_shares\": 0"), 14, "\"sm_shares\": 1025");
  EXPECT_EQ(profile_error(text),
            "in.json: device.sm_shares: expected a count of shares from 1 to 1024, got 1025");
}

TEST(ProfileFormat, MissingFileIsClear) {
  try {
    load_profile("/nonexistent/profile.json");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "/nonexistent/profile.json: cannot open: No such file or directory");
  }
}

const char* const kHardware = R"({
  "format": "pipetune.hardware/1",
  "devices": [{"name": "gpu0", "memory_bytes": 1000, "speed": 2.0},
              {"name": "gpu1", "memory_bytes": 2000}],
  "link": {"bandwidth_bytes_per_s": 1e9, "latency_ms": 0.01},
  "links": [{"between": ["gpu0", "gpu1"], "bandwidth_bytes_per_s": 5e9, "latency_ms": 0.002}],
  "launch_overhead_ms": 0.004
})";

std::string hardware_error(const std::string& text) {
  return error_of([](const std::string& t, const std::string& s) { parse_hardware(t, s); }, text);
}

TEST(HardwareFormat, ParsesAndRoundTrips) {
  const Hardware hw = parse_hardware(kHardware, "hw.json");
  ASSERT_EQ(hw.devices.size(), 2u);
  EXPECT_EQ(hw.devices[0].speed, 2.0);
  EXPECT_EQ(hw.devices[1].speed, 1.0);  // documented default
  EXPECT_EQ(hw.link_between(0, 1).bandwidth_bytes_per_s, 5e9);
  EXPECT_EQ(hw.link_between(1, 0).latency_ms, 0.002);
  EXPECT_EQ(hw.launch_overhead_ms, 0.004);
  EXPECT_EQ(hardware_to_json(parse_hardware(hardware_to_json(hw), "again")), hardware_to_json(hw));
}

TEST(HardwareFormat, PostedReceivesAreReadWrittenOnlyWhenSetAndMustBeABoolean) {
  EXPECT_FALSE(parse_hardware(kHardware, "hw.json").posted_receives);  // documented default
  std::string text = kHardware;
  text.insert(text.rfind('}'), ", \"posted_receives\": true");
  const Hardware hw = parse_hardware(text, "hw.json");
  EXPECT_TRUE(hw.posted_receives);
  EXPECT_TRUE(parse_hardware(hardware_to_json(hw), "again").posted_receives);
  Hardware off = hw;
  off.posted_receives = false;
  EXPECT_EQ(hardware_to_json(off).find("posted_receives"), std::string::npos);
  text.replace(text.find("true"), 4, "1");
  EXPECT_EQ(hardware_error(text), "in.json: posted_receives: expected true or false, got 1");
}

TEST(HardwareFormat, RuntimeIsReadWrittenOnlyWhenTorchsAndMustBeOneOfTwo) {
  EXPECT_EQ(parse_hardware(kHardware, "hw.json").runtime, Runtime::Pipetune);  // the default
  EXPECT_EQ(hardware_to_json(parse_hardware(kHardware, "hw.json")).find("runtime"),
            std::string::npos);
  std::string text = kHardware;
  text.insert(text.rfind('}'), ", \"runtime\": \"torch.distributed.pipelining\"");
  const Hardware hw = parse_hardware(text, "hw.json");
  EXPECT_EQ(hw.runtime, Runtime::TorchPipelining);
  EXPECT_EQ(parse_hardware(hardware_to_json(hw), "again").runtime, Runtime::TorchPipelining);
  std::string named = kHardware;
  named.insert(named.rfind('}'), ", \"runtime\": \"pipetune\"");
  EXPECT_EQ(parse_hardware(named, "hw.json").runtime, Runtime::Pipetune);
  text.replace(text.find("torch.distributed.pipelining"), 28, "megatron");
  EXPECT_EQ(hardware_error(text),
            "in.json: runtime: expected \"pipetune\" or \"torch.distributed.pipelining\", got "
            "\"megatron\"");
}

TEST(HardwareFormat, ShareOfIsReadWrittenOnlyWhenSetAndMustNameAGpu) {
  EXPECT_EQ(parse_hardware(kHardware, "hw.json").devices[0].share_of, "");  // a whole device
  EXPECT_EQ(hardware_to_json(parse_hardware(kHardware, "hw.json")).find("share_of"),
            std::string::npos);
  std::string text = kHardware;
  text.replace(text.find("\"speed\": 2.0"), 12, "\"speed\": 2.0, \"share_of\": \"cuda:0\"");
  const Hardware hw = parse_hardware(text, "hw.json");
  EXPECT_EQ(hw.devices[0].share_of, "cuda:0");
  EXPECT_EQ(parse_hardware(hardware_to_json(hw), "again").devices[0].share_of, "cuda:0");
  text.replace(text.find("\"cuda:0\""), 8, "\"\"");
  EXPECT_EQ(hardware_error(text),
            "in.json: devices[0].share_of: expected a non-empty string, got \"\"");
}

// The simulator's and the planner's GPUs: those two or more devices name, numbered by name;
// and the memory each device allocates from.
TEST(HardwareFormat, SharedGpusAreThoseTwoOrMoreDevicesNameNumberedByName) {
  Hardware hw = replicate_device({"cuda", "x", 0}, 6);
  const char* share_of[] = {"gpu-b", "", "gpu-a", "gpu-b", "gpu-c", "gpu-a"};
  for (int d = 0; d < 6; ++d) hw.devices[d].share_of = share_of[d];
  EXPECT_EQ(shared_gpus(hw), (std::vector<int>{1, -1, 0, 1, -1, 0}));  // gpu-c: one share only
  EXPECT_EQ(shared_gpus(replicate_device({"cuda", "x", 0}, 2)), (std::vector<int>{-1, -1}));
  // Their memories: each share's that of the GPU's first share.
  EXPECT_EQ(device_memories(hw), (std::vector<int>{0, 1, 2, 0, 4, 2}));
  EXPECT_EQ(device_memories(replicate_device({"cuda", "x", 0}, 2)), (std::vector<int>{0, 1}));
}

TEST(HardwareFormat, IdealLinkSurvivesARoundTrip) {
  const Hardware hw = replicate_device({"cpu", "x", 0}, 2);
  const Hardware again = parse_hardware(hardware_to_json(hw), "again");
  EXPECT_TRUE(again.link.ideal());
}

TEST(HardwareFormat, BadInput) {
  std::string text = kHardware;
  EXPECT_EQ(
      hardware_error(std::string(text).replace(text.find("\"gpu1\", \"memory"), 6, "\"gpu0\"")),
      "in.json: devices[1].name: duplicate device name \"gpu0\"");
  EXPECT_EQ(
      hardware_error(
          std::string(text).replace(text.find("[\"gpu0\", \"gpu1\"]"), 16, "[\"gpu0\", \"gpu7\"]")),
      "in.json: links[0].between[1]: expected the name of a device in \"devices\", got \"gpu7\"");
  EXPECT_EQ(
      hardware_error(std::string(text).replace(text.find("1e9"), 3, "-1")),
      "in.json: link.bandwidth_bytes_per_s: expected at least 1 (bytes per second), or null for "
      "unlimited, got -1");
  EXPECT_EQ(
      hardware_error(std::string(text).replace(text.find("\"speed\": 2.0"), 12, "\"speed\": 0")),
      "in.json: devices[0].speed: expected a number from 1e-6 to 1e6, got 0");
}

const char* const kPlan = R"({"format": "pipetune.plan/1", "balance": [1, 1], "chunks": 4,
  "checkpoint": "except_last", "schedule": "1f1b", "optimizer_state_factor": 2})";

std::string plan_error(const std::string& text) {
  return error_of([](const std::string& t, const std::string& s) { parse_plan(t, s); }, text);
}

std::string plan_with(const std::string& from, const std::string& to) {
  std::string text = kPlan;
  return text.replace(text.find(from), from.size(), to);
}

TEST(PlanFormat, ParsesAndRoundTrips) {
  const Plan plan = parse_plan(kPlan, "plan.json");
  EXPECT_EQ(plan.balance, (std::vector<int>{1, 1}));
  EXPECT_EQ(plan.chunks, 4);
  EXPECT_EQ(plan.checkpoint, CheckpointMode::ExceptLast);
  EXPECT_EQ(plan.schedule, ScheduleKind::OneFOneB);
  EXPECT_EQ(plan.optimizer_state_factor, 2.0);
  EXPECT_EQ(parse_plan(plan_to_json(plan), "again"), plan);
}

TEST(PlanFormat, TiedTensorsAreWrittenForTheReaderAndReadPast) {
  Profile profile = testing::uniform_profile(6, 1.0, 2.0, 8);
  profile.tied.push_back({"embed.weight", {0, 5}, 100});
  const Plan plan = testing::make_plan({2, 2, 2}, 4, CheckpointMode::Never);
  const std::string text = plan_to_json(plan, profile);
  EXPECT_THAT(text,
              HasSubstr(R"("tied_parameters": [{"name": "embed.weight", "stages": [0, 2]}])"));
  EXPECT_EQ(parse_plan(text, "plan.json"), plan);
  // Nothing tied, nothing written: the plain file.
  EXPECT_EQ(plan_to_json(plan, testing::uniform_profile(6, 1.0, 2.0, 8)), plan_to_json(plan));
}

TEST(PlanFormat, BadValues) {
  EXPECT_EQ(plan_error(plan_with("[1, 1]", "[1, 0]")),
            "in.json: balance[1]: expected a positive integer (every stage needs at least one "
            "layer), got 0");
  EXPECT_EQ(plan_error(plan_with("\"chunks\": 4", "\"chunks\": 0")),
            "in.json: chunks: expected a positive integer, got 0");
  EXPECT_EQ(plan_error(plan_with("except_last", "sometimes")),
            "in.json: checkpoint: expected one of \"always\", \"except_last\", \"never\", got "
            "\"sometimes\"");
  EXPECT_EQ(plan_error(plan_with("1f1b", "zb-v")),
            "in.json: schedule: expected one of \"gpipe\", \"1f1b\", \"interleaved-1f1b\", "
            "\"interleaved-zb\", \"zbv\", \"looped-bfs\", \"dualpipev\", got \"zb-v\"");
  EXPECT_EQ(plan_error(plan_with("\"balance\": [1, 1]", "\"balance\": []")),
            "in.json: balance: expected a non-empty array of layer counts, one per stage, got an "
            "array of 0 elements");
}

TEST(PlanFormat, CheckAgainstProfileAndHardware) {
  const Profile profile = testing::uniform_profile(4, 1.0, 2.0, 8);
  const Hardware hw = replicate_device(profile.device, 2);
  auto error = [&](const Plan& plan) -> std::string {
    try {
      check_plan(plan, profile, hw, "plan.json");
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  Plan plan = testing::make_plan({2, 2}, 4, CheckpointMode::Never);
  EXPECT_EQ(error(plan), "");
  plan.balance = {2, 1};
  EXPECT_EQ(error(plan),
            "plan.json: balance: expected layer counts summing to 4 (the profile's layers), got "
            "2+1 = 3");
  plan.balance = {2, 2};
  plan.chunks = 9;
  EXPECT_EQ(error(plan), "plan.json: chunks: expected 1 to 8 (the batch size), got 9");
  {
    // Fewest samples 2: tensor.chunk's last micro-batch decides. Batch 10 in 4 chunks is
    // 3, 3, 3, 1 where 5 to 9 chunks are all micro-batches of 2.
    Profile least = testing::uniform_profile(4, 1.0, 2.0, 10);
    least.min_micro_batch = 2;
    Plan split = testing::make_plan({2, 2}, 4, CheckpointMode::Never);
    try {
      check_plan(split, least, hw, "plan.json");
      ADD_FAILURE() << "micro-batches of one sample accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()),
                "plan.json: chunks: 4 split the batch of 10 into micro-batches as small as 1 "
                "sample, but the model trains on no fewer than 2 (the profile's min_micro_batch: "
                "a layer cannot train on fewer); expected a chunk count in {1, 2, 3, 5, 6, 7, 8, "
                "9}");
    }
    split.chunks = 5;
    EXPECT_NO_THROW(check_plan(split, least, hw, "plan.json"));
  }
  plan.chunks = 8;
  plan.balance = {1, 1, 2};
  EXPECT_EQ(error(plan),
            "plan.json: balance: expected at most 2 stages (one per device; name \"devices\" to "
            "put several stages on one device), got 3");
  plan.devices = {"cpu:0", "cpu:0", "cpu:2"};
  EXPECT_EQ(error(plan), "plan.json: devices[2]: expected one of cpu:0, cpu:1, got \"cpu:2\"");
  plan.devices = {"cpu:0", "cpu:0", "cpu:1"};
  EXPECT_EQ(error(plan), "");
}

TEST(FileIo, AtomicWriteLeavesNoTemporaryAndKeepsOldFileOnFailure) {
  const auto dir = testing::scratch_dir() / "file_io_test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "out.json").string();
  write_text_file_atomically(path, "first");
  write_text_file_atomically(path, "second");
  EXPECT_EQ(read_text_file(path), "second");
  int files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1);
  EXPECT_THROW(write_text_file_atomically((dir / "missing" / "x.json").string(), "x"), InputError);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pipetune
