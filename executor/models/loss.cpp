#include "executor/models/loss.hpp"

#include <c10/util/ArrayRef.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/functional/loss.h>

#include "sim/error.hpp"

namespace pipetune::models {

namespace {

namespace F = torch::nn::functional;

std::string shape_of(c10::IntArrayRef sizes) {
  return fmt::format("[{}]", fmt::join(sizes, ", "));
}

// As Python names dtypes, which is how users wrote them.
std::string dtype_name(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kShort:
      return "int16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    default:
      return c10::toString(type);
  }
}

}  // namespace

std::string describe(const at::Tensor& t) {
  return fmt::format("{} {}", dtype_name(t.scalar_type()), shape_of(t.sizes()));
}

LossKind parse_loss(const std::string& name) {
  if (name == "cross_entropy") return LossKind::CrossEntropy;
  if (name == "mse") return LossKind::MeanSquaredError;
  throw InputError(Input::Model,
                   fmt::format("loss: expected cross_entropy or mse, got \"{}\"", name));
}

at::Tensor cross_entropy(const at::Tensor& output, const at::Tensor& target) {
  if (output.dim() < 2) {
    throw InputError(fmt::format(
        "loss: the model's output {} has no last dimension to classify over (cross entropy needs "
        "[samples, …, classes]; for regression use loss=mse)",
        describe(output)));
  }
  const auto classes = output.size(-1);
  if (at::isFloatingType(target.scalar_type()) && target.sizes() == output.sizes()) {
    return F::cross_entropy(output.reshape({-1, classes}),
                            target.reshape({-1, classes}).to(output.scalar_type()));
  }
  if (at::isFloatingType(target.scalar_type()) ||
      target.sizes() != output.sizes().slice(0, output.dim() - 1)) {
    throw InputError(fmt::format(
        "loss: targets {} cannot match the output {}: cross entropy takes class indices of shape "
        "{} "
        "(the output's without its last dimension) or class probabilities of the output's shape",
        describe(target), describe(output), shape_of(output.sizes().slice(0, output.dim() - 1))));
  }
  return F::cross_entropy(output.reshape({-1, classes}), target.reshape({-1}).to(at::kLong));
}

at::Tensor mean_squared_error(const at::Tensor& output, const at::Tensor& target) {
  if (target.sizes() != output.sizes() || !at::isFloatingType(target.scalar_type())) {
    throw InputError(
        fmt::format("loss: targets {} cannot match the output {}: mse takes floating targets of "
                    "the output's shape",
                    describe(target), describe(output)));
  }
  return F::mse_loss(output, target.to(output.scalar_type()));
}

at::Tensor loss_of(LossKind kind, const at::Tensor& output, const at::Tensor& target) {
  return kind == LossKind::CrossEntropy ? cross_entropy(output, target)
                                        : mean_squared_error(output, target);
}

}  // namespace pipetune::models
