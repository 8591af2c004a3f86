#pragma once

// The losses a model trains with, and which targets each accepts, so that a target that cannot
// match the output is refused with both shapes named rather than deep inside a stage.

#include <ATen/core/Tensor.h>

#include <string>

namespace pipetune::models {

enum class LossKind { CrossEntropy, MeanSquaredError };

/// "cross_entropy" or "mse"; throws InputError otherwise.
LossKind parse_loss(const std::string& name);

/// Cross entropy over the output's last dimension: int64 class indices of the output's shape
/// without that dimension (one per sample, or one per token), or class probabilities of the
/// output's shape. Mean over every position.
at::Tensor cross_entropy(const at::Tensor& output, const at::Tensor& target);

/// Mean squared error against targets of the output's shape.
at::Tensor mean_squared_error(const at::Tensor& output, const at::Tensor& target);

at::Tensor loss_of(LossKind kind, const at::Tensor& output, const at::Tensor& target);

/// "int64 [8, 128]": how errors name a tensor.
std::string describe(const at::Tensor& t);

}  // namespace pipetune::models
