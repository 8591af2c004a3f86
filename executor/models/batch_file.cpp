#include "executor/models/batch_file.hpp"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <fmt/format.h>
#include <torch/csrc/jit/serialization/import_read.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>

#include "executor/models/loss.hpp"
#include "sim/error.hpp"
#include "sim/file_io.hpp"

namespace pipetune::models {

namespace {

// LibTorch's own in-memory reader (behind torch::jit::pickle_load) copies whatever range the zip
// directory asks for, so a file whose directory points past its end made pipetune read out of
// bounds (found by fuzzing). This one hands out only the bytes that exist; the archive reader
// then fails on the short read and says so, which becomes "not a file torch.save wrote".
class BoundedReader final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BoundedReader(const std::string& bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    const size_t available = std::min<uint64_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, available);
    return available;
  }

 private:
  const std::string& bytes_;
};

// What torch::jit::pickle_load does, with the bounded reader: the pickle is the archive's
// "data.pkl", its tensors the archive's "data/" records.
c10::IValue unpickle_archive(const std::string& bytes) {
  caffe2::serialize::PyTorchStreamReader archive(std::make_shared<BoundedReader>(bytes));
  return torch::jit::readArchiveAndTensors("data", /*pickle_prefix=*/"", /*tensor_prefix=*/"",
                                           std::nullopt, std::nullopt, std::nullopt, archive);
}

// LibTorch takes a loaded tensor's shape, strides and offset from the file as they are, so a
// corrupted file can describe more elements than its storage holds; every later read (the
// copy to contiguous, a step's index_select) would then go past the buffer (found by fuzzing).
void check_within_storage(const at::Tensor& t, const std::string& which, const std::string& path) {
  const auto refuse = [&](const std::string& why) {
    throw InputError(Input::Model, fmt::format("batch: {}: the {} {}", path, which, why));
  };
  if (t.layout() != at::kStrided || !t.has_storage()) refuse("are not a dense tensor");
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 0) return;  // no elements: nothing is read
  }
  // Sizes, strides and offset are the file's, up to 2^63 each: checked arithmetic.
  std::int64_t last = t.storage_offset(), extent = 0, needed = 0;
  if (last < 0) refuse("start before their storage");
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) < 0 || t.stride(d) < 0) refuse("have a negative size or stride");
    if (__builtin_mul_overflow(t.size(d) - 1, t.stride(d), &extent) ||
        __builtin_add_overflow(last, extent, &last)) {
      refuse("describe more elements than any file can hold");
    }
  }
  if (__builtin_add_overflow(last, 1, &needed) ||
      __builtin_mul_overflow(needed, static_cast<std::int64_t>(t.element_size()), &needed)) {
    refuse("describe more elements than any file can hold");
  }
  if (needed > static_cast<std::int64_t>(t.storage().nbytes())) {
    refuse(fmt::format("{} need {} bytes, but the file stores {}", describe(t), needed,
                       t.storage().nbytes()));
  }
}

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
    value = unpickle_archive(bytes);
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
  check_within_storage(items[0].toTensor(), "inputs", path);
  check_within_storage(items[1].toTensor(), "targets", path);
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
