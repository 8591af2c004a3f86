#include "executor/models/batch_file.hpp"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <fmt/format.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
#include <string_view>

#include "executor/models/loss.hpp"
#include "executor/models/pickle_check.hpp"
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

// The pickle and the byte size of every storage record it referred to, by the record's buffer.
struct Unpickled {
  c10::IValue value;
  std::map<const void*, std::size_t> record_bytes;
};

// What torch::jit::pickle_load does (the pickle is the archive's "data.pkl", its storages the
// "data/" records), with the bounded reader, and keeping each record's true size: LibTorch
// sizes a storage by what the pickle claims, not by the record it reads.
Unpickled unpickle_archive(const std::string& bytes) {
  caffe2::serialize::PyTorchStreamReader archive(std::make_shared<BoundedReader>(bytes));
  auto pickle = archive.getRecord("data.pkl");
  const char* const pickle_data = static_cast<const char*>(std::get<0>(pickle).get());
  const std::size_t pickle_bytes = std::get<1>(pickle);
  if (auto why = pickle_refusal(std::string_view(pickle_data, pickle_bytes))) {
    throw std::runtime_error(*why);
  }
  std::size_t offset = 0;
  auto read_pickle = [&](char* out, std::size_t n) {
    n = std::min(n, pickle_bytes - offset);
    std::memcpy(out, pickle_data + offset, n);
    offset += n;
    return n;
  };
  Unpickled result;
  auto read_record = [&](const std::string& name) {
    auto [data, size] = archive.getRecord("data/" + name);
    result.record_bytes[data.get()] = size;
    return std::move(data);
  };
  torch::jit::Unpickler unpickler(read_pickle, nullptr, nullptr, read_record, std::nullopt);
  unpickler.set_version(archive.version());
  result.value = unpickler.parse_ivalue();
  return result;
}

// LibTorch takes a loaded tensor's storage size, shape, strides and offset from the pickle as
// they are, so a corrupted file can describe more elements than the record it read holds;
// every later read (the copy to contiguous, a step's index_select) would then go past the
// buffer (found by fuzzing). Checked against the record's true size.
void check_within_storage(const at::Tensor& t, const std::string& which, const std::string& path,
                          const std::map<const void*, std::size_t>& record_bytes) {
  const auto refuse = [&](const std::string& why) {
    throw InputError(Input::Model, fmt::format("batch: {}: the {} {}", path, which, why));
  };
  if (t.layout() != at::kStrided || !t.has_storage()) refuse("are not a dense tensor");
  // Quantized tensors (and any other exotic type) reach kernels that abort rather than throw
  // on a malformed quantizer (found by fuzzing): data is floats, integers or booleans.
  if (!at::isFloatingType(t.scalar_type()) && !at::isIntegralType(t.scalar_type(), true)) {
    refuse(fmt::format("are {}: expected floating-point, integer or boolean data", describe(t)));
  }
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
  const auto record = record_bytes.find(t.storage().data());
  const std::int64_t stored =
      record == record_bytes.end() ? 0 : static_cast<std::int64_t>(record->second);
  if (needed > stored) {
    refuse(fmt::format("{} need {} bytes, but the file stores {}", describe(t), needed, stored));
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
  Unpickled unpickled;
  try {
    unpickled = unpickle_archive(bytes);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw InputError(Input::Model, fmt::format("batch: {}: not a file torch.save wrote ({})", path,
                                               what.substr(0, what.find('\n'))));
  }
  const c10::IValue& value = unpickled.value;
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
  check_within_storage(items[0].toTensor(), "inputs", path, unpickled.record_bytes);
  check_within_storage(items[1].toTensor(), "targets", path, unpickled.record_bytes);
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
