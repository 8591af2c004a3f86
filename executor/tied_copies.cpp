#include "executor/tied_copies.hpp"

#include <ATen/ATen.h>

#include <stdexcept>

#include "executor/models/shared_tensors.hpp"
#include "executor/stage_backward.hpp"

namespace pipetune::exec {

namespace {

at::Tensor own_copy(const at::Tensor& original) {
  at::NoGradGuard no_grad;
  at::Tensor copy = original.detach().clone();
  copy.set_requires_grad(original.requires_grad());
  return copy;
}

}  // namespace

TiedCopies::TiedCopies(models::Model& model, const std::vector<int>& balance,
                       const std::function<bool(int stage)>& local)
    : waits_(balance.size(), 0) {
  const std::vector<int> stage_of = models::stage_of_layers(balance);
  for (const models::TiedParameter& tied : models::tied_parameters(model)) {
    TiedStages tie;
    tie.label = tied.name;
    for (std::size_t layer : tied.layers) {
      const int s = stage_of.at(layer);
      if (tie.stages.empty() || tie.stages.back() != s) tie.stages.push_back(s);
    }
    if (tie.stages.size() < 2) continue;  // one stage: its optimizer lists the tensor once
    // A frozen tensor takes no update: its copies stay equal without a sum.
    const bool trained = tied.tensor.requires_grad();
    for (int s : tie.stages) {
      if (trained) waits_[s] = 1;
      if (!local(s)) continue;
      // The first local holder keeps the original; each later one gets a copy of its own.
      const bool first = tie.local_stages.empty();
      const at::Tensor tensor = first ? tied.tensor : own_copy(tied.tensor);
      tie.local_stages.push_back(s);
      tie.tensors.push_back(tensor);
      if (first) continue;
      for (const auto& [layer, name] : tied.holders) {
        if (stage_of[layer] != s) continue;
        const std::shared_ptr<torch::nn::Module> module = model.layers->ptr(layer);
        if (!models::repoint_parameter(*module, name, tensor)) {
          throw std::logic_error("tied parameter " + tie.label + ": layer " +
                                 model.layer_names[layer] + " cannot hold a copy (not checked)");
        }
        repointed_.push_back({module, name, tied.tensor});
      }
    }
    if (trained) ties_.push_back(std::move(tie));
  }
}

TiedCopies::~TiedCopies() {
  for (const Repointed& r : repointed_) models::repoint_parameter(*r.layer, r.name, r.original);
}

bool TiedCopies::waits_for_sum(int stage) const {
  return waits_.at(static_cast<std::size_t>(stage)) != 0;
}

at::Tensor TiedCopies::sum_of(std::size_t tie,
                              const std::function<bool(int stage)>& on_device) const {
  at::NoGradGuard no_grad;
  const TiedStages& t = ties_.at(tie);
  at::Tensor sum;
  for (std::size_t k = 0; k < t.tensors.size(); ++k) {
    if (on_device(t.local_stages[k])) accumulate_into(sum, t.tensors[k].grad());
  }
  return sum;
}

void TiedCopies::set_gradients(std::size_t tie, const at::Tensor& total,
                               const std::function<bool(int stage)>& on_device) {
  at::NoGradGuard no_grad;
  TiedStages& t = ties_.at(tie);
  for (std::size_t k = 0; k < t.tensors.size(); ++k) {
    if (!on_device(t.local_stages[k])) continue;
    at::Tensor& g = t.tensors[k].mutable_grad();
    if (g.defined() && g.is_same(total)) continue;
    if (g.defined()) {
      g.copy_(total);
    } else {
      g = total.to(t.tensors[k].device(), /*non_blocking=*/false, /*copy=*/true);
    }
  }
}

}  // namespace pipetune::exec
