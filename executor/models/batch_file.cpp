#include "executor/models/batch_file.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <filesystem>

#include "executor/models/loss.hpp"
#include "sim/error.hpp"
#include "sim/file_io.hpp"

namespace pipetune::models {

namespace {

std::string kind_of(const c10::IValue& v) {
  if (v.isTuple()) return fmt::format("a tuple of {}", v.toTupleRef().elements().size());
  if (v.isList()) return fmt::format("a list of {}", v.toListRef().size());
  return fmt::format("a {}", v.tagKind());
}

}  // namespace

BatchFile load_batch_file(const std::string& path) {
  if (!std::filesystem::is_regular_file(path))
    throw InputError(Input::Model, fmt::format("batch: {}: no such file", path));
  const std::string bytes = read_text_file(path);
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw InputError(Input::Model, fmt::format("batch: {}: not a file torch.save wrote ({})", path,
                                               what.substr(0, what.find('\n'))));
  }
  std::vector<c10::IValue> items;
  if (value.isTuple()) {
    for (const auto& item : value.toTupleRef().elements()) items.push_back(item);
  } else if (value.isList()) {
    for (const auto& item : value.toListRef()) items.push_back(item);
  }
  if (items.size() != 2 || !items[0].isTensor() || !items[1].isTensor()) {
    throw InputError(
        Input::Model,
        fmt::format("batch: {}: expected a pair of tensors, as torch.save((inputs, "
                    "targets), FILE) writes; got {}",
                    path,
                    items.size() == 2
                        ? fmt::format("a pair of {} and {}", items[0].tagKind(), items[1].tagKind())
                        : kind_of(value)));
  }
  BatchFile file{items[0].toTensor().detach().contiguous(),
                 items[1].toTensor().detach().contiguous()};
  if (file.inputs.dim() == 0 || file.targets.dim() == 0 ||
      file.inputs.size(0) != file.targets.size(0) || file.inputs.size(0) == 0) {
    throw InputError(Input::Model,
                     fmt::format("batch: {}: inputs {} and targets {} must have the same number of "
                                 "samples, at least one, in dimension 0",
                                 path, describe(file.inputs), describe(file.targets)));
  }
  return file;
}

std::pair<at::Tensor, at::Tensor> take_samples(const BatchFile& file, std::int64_t batch,
                                               std::int64_t step) {
  const std::int64_t n = file.samples();
  const at::Tensor index = (at::arange(batch, at::kLong) + (step % n) * (batch % n)).remainder(n);
  return {file.inputs.index_select(0, index), file.targets.index_select(0, index)};
}

}  // namespace pipetune::models
