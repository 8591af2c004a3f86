#pragma once

// Real training data for a brought model: what `torch.save((inputs, targets), "BATCH.pt")`
// writes in Python, read with LibTorch's unpickler (no Python at run time). Dimension 0 is
// samples; each step takes the next samples, wrapping around.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>

namespace pipetune::models {

struct BatchFile {
  at::Tensor inputs, targets;  ///< contiguous, on the CPU, the same count of samples
  std::int64_t samples() const { return inputs.size(0); }
};

/// Throws InputError when the file is missing, not written by torch.save, or not a pair (tuple
/// or list) of tensors with at least one dimension and the same number of samples.
BatchFile load_batch_file(const std::string& path);

/// Step `step`'s `batch` samples: those from step * batch on, modulo the file's samples.
std::pair<at::Tensor, at::Tensor> take_samples(const BatchFile& file, std::int64_t batch,
                                               std::int64_t step);

}  // namespace pipetune::models
