#pragma once

// Tied parameters split across stages, trained as the one tensor a single device trains.
//
// A language model's embedding and output projection often hold one matrix. One device gives it
// one gradient, the sum over both uses, and one update. A plan that puts the two layers on two
// stages would have each stage update its own part: another model. So, as Megatron does with its
// tied embeddings, every stage holding the tensor gets a copy of its own (on its device), the
// copies' gradients are summed once every holder's backward is done (within the process, then
// across the ranks holding it), and each stage's optimizer steps its copy with that sum: the same
// update on every copy, equal to the one-device update. When the pipeline ends, the layers hold
// the original tensor again, with the trained values.

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "executor/models/model.hpp"

namespace pipetune::exec {

/// One tied parameter held by several stages.
struct TiedStages {
  std::string label;                ///< "embed.weight", the first holder's name for it
  std::vector<int> stages;          ///< every stage holding it, in order (other ranks' too)
  std::vector<int> local_stages;    ///< those this process runs
  std::vector<at::Tensor> tensors;  ///< each local stage's tensor (the first keeps the original)
};

class TiedCopies {
 public:
  /// Re-points the holders on every local stage but the first at a copy of their own, so it must
  /// run before the stages' parameters are adopted by their devices. `balance` splits the layers;
  /// `local(stage)` says whether this process runs it. check_tied_split() must have passed.
  TiedCopies(models::Model& model, const std::vector<int>& balance,
             const std::function<bool(int stage)>& local);
  /// The layers hold the original tensors again (each copy took the same updates).
  ~TiedCopies();
  TiedCopies(const TiedCopies&) = delete;
  TiedCopies& operator=(const TiedCopies&) = delete;

  const std::vector<TiedStages>& ties() const { return ties_; }
  /// Whether `stage` holds a tie other stages hold too: its optimizer steps only after the sum.
  bool waits_for_sum(int stage) const;

  /// The sum of tie `tie`'s gradients on the local stages `on_device` accepts (one device's),
  /// added in place into the first defined one; undefined when none of them has a gradient (a
  /// backward that never reached the tensor adds nothing). On the device's own thread.
  at::Tensor sum_of(std::size_t tie, const std::function<bool(int stage)>& on_device) const;
  /// Tie `tie`'s copies on the stages `on_device` accepts take `total` as their gradient
  /// (copied onto their device unless it is already theirs). On the device's own thread.
  void set_gradients(std::size_t tie, const at::Tensor& total,
                     const std::function<bool(int stage)>& on_device);

 private:
  struct Repointed {
    std::shared_ptr<torch::nn::Module> layer;
    std::string name;
    at::Tensor original;
  };
  std::vector<TiedStages> ties_;
  std::vector<Repointed> repointed_;
  std::vector<char> waits_;  // per stage
};

}  // namespace pipetune::exec
