#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace pipetune {

/// An input a library call takes that is not a file: what a front end lets its user set (the
/// CLI by a flag, the GUI by a field), so each front end can name it its own way.
enum class Input : std::uint8_t {
  Model,
  Device,
  BatchSize,
  MicroBatchSizes,
  Timer,
  Repeats,
  Steps,
  Stages,
  Devices,
  Chunks,
  Balance,
  Top,
  OutputFolder,
  Distributed,
};

/// The library's words for an input: "model", "device", "batch size", "micro-batch sizes",
/// "timer", "repeats", "steps", "stages", "devices", "chunks", "balance", "top",
/// "output folder", "distributed run".
constexpr std::string_view to_string(Input input) {
  switch (input) {
    case Input::Model:
      return "model";
    case Input::Device:
      return "device";
    case Input::BatchSize:
      return "batch size";
    case Input::MicroBatchSizes:
      return "micro-batch sizes";
    case Input::Timer:
      return "timer";
    case Input::Repeats:
      return "repeats";
    case Input::Steps:
      return "steps";
    case Input::Stages:
      return "stages";
    case Input::Devices:
      return "devices";
    case Input::Chunks:
      return "chunks";
    case Input::Balance:
      return "balance";
    case Input::Top:
      return "top";
    case Input::OutputFolder:
      return "output folder";
    case Input::Distributed:
      return "distributed run";
  }
  return "input";
}

/// Bad input from a user: a file, a field of it, or an input such as the model or the batch
/// size. The message already names the file (or input), the JSON path and what was expected,
/// in the library's words, so front ends print it as one line and exit non-zero. Anything else
/// thrown is a bug in pipetune, not in the input.
class InputError : public std::runtime_error {
 public:
  /// A message that names the file or field itself.
  using std::runtime_error::runtime_error;
  /// "<input>: <detail>", e.g. "model: unknown model \"vgg\" …".
  InputError(Input input, std::string_view detail)
      : InputError(input, std::string(": ").append(detail), Tail{}) {}
  /// "<input> <value>: <detail>", e.g. "device cuda: no CUDA device on this machine".
  InputError(Input input, std::string_view value, std::string_view detail)
      : InputError(input, std::string(" ").append(value).append(": ").append(detail), Tail{}) {}

  /// The input at fault, when the error is about one.
  std::optional<Input> input() const { return input_; }
  /// The message with the input named `name` (a front end's own name for it, such as a flag)
  /// instead of in the library's words; what() itself when no input is at fault.
  std::string naming_input_as(std::string_view name) const {
    if (!input_) return what();
    return std::string(name).append(tail_);
  }

 private:
  struct Tail {};
  InputError(Input input, std::string tail, Tail)
      : std::runtime_error(std::string(to_string(input)).append(tail)),
        input_(input),
        tail_(std::move(tail)) {}

  std::optional<Input> input_;
  std::string tail_;  // what follows the input's name
};

/// The input was fine but the work could not be done: no plan fits the devices, a stage failed
/// while running, the build lacks what the command needs. Front ends print the message as one
/// line and exit 1, apart from bad input (2) and pipetune's own bugs ("internal error").
class WorkError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Work that waited its whole time bound for someone else (a peer rank that neither answered
/// nor died). A type, so callers tell a hang from a failure without reading the message.
class TimeoutError : public WorkError {
 public:
  using WorkError::WorkError;
};

}  // namespace pipetune
