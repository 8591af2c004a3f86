#include "cli/error_text.hpp"

namespace pipetune::cli {

std::string_view flag_of(Input input) {
  switch (input) {
    case Input::Model:
      return "--model";
    case Input::Device:
      return "--device";
    case Input::BatchSize:
      return "--batch";
    case Input::MicroBatchSizes:
      return "--micro-batch-sizes";
    case Input::Timer:
      return "--timer";
    case Input::Repeats:
      return "--repeats";
    case Input::Steps:
      return "--steps";
    case Input::Stages:
      return "--stages";
    case Input::Devices:
      return "--devices";
    case Input::Chunks:
      return "--chunks";
    case Input::Balance:
      return "--balance";
    case Input::Top:
      return "--top";
    case Input::OutputFolder:
      return "--out";
    case Input::Distributed:
      return "--distributed";
  }
  return "--?";
}

std::string error_text(const InputError& error) {
  const auto input = error.input();
  return input ? error.naming_input_as(flag_of(*input)) : std::string(error.what());
}

}  // namespace pipetune::cli
