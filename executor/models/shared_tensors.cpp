#include "executor/models/shared_tensors.hpp"

#include <fmt/format.h>

#include <map>
#include <set>
#include <utility>

#include "sim/error.hpp"

namespace pipetune::models {

namespace {

struct Holder {
  std::size_t layer;
  std::string name;
  bool parameter;
};

// The keys a tensor is known by: itself, and its storage (a view shares the storage).
std::vector<const void*> identities(const at::Tensor& t) {
  std::vector<const void*> keys{t.unsafeGetTensorImpl()};
  if (t.has_storage() && t.storage().nbytes() > 0) {
    keys.push_back(t.storage().unsafeGetStorageImpl());
  }
  return keys;
}

}  // namespace

std::vector<SharedTensor> shared_tensors(Model& model) {
  std::map<const void*, Holder> first_holder;
  std::set<std::pair<std::size_t, std::size_t>> reported;
  std::vector<SharedTensor> out;
  std::size_t layer = 0;
  for (auto it = model.layers->begin(); it != model.layers->end(); ++it, ++layer) {
    std::vector<Holder> held;
    std::vector<at::Tensor> tensors;
    for (const auto& p : it->ptr()->named_parameters()) {
      held.push_back({layer, p.key(), true});
      tensors.push_back(p.value());
    }
    for (const auto& b : it->ptr()->named_buffers()) {
      if (!b.value().defined()) continue;
      held.push_back({layer, b.key(), false});
      tensors.push_back(b.value());
    }
    for (std::size_t k = 0; k < held.size(); ++k) {
      for (const void* key : identities(tensors[k])) {
        const auto [first, fresh] = first_holder.emplace(key, held[k]);
        if (fresh || first->second.layer == layer) continue;
        if (!reported.emplace(first->second.layer, layer).second) continue;
        out.push_back({first->second.layer, layer, first->second.name, held[k].name,
                       first->second.parameter || held[k].parameter});
      }
    }
  }
  return out;
}

std::string describe(const Model& model, const SharedTensor& s) {
  const std::string& a = model.layer_names.at(s.first_layer);
  const std::string& b = model.layer_names.at(s.second_layer);
  return fmt::format("layers {} (\"{}\") and {} (\"{}\") share a {} ({}.{} is {}.{})",
                     s.first_layer, a, s.second_layer, b, s.parameter ? "parameter" : "buffer", a,
                     s.first_name, b, s.second_name);
}

namespace {

std::vector<int> stage_of_layers(const std::vector<int>& balance) {
  std::vector<int> stage_of;
  for (std::size_t s = 0; s < balance.size(); ++s) {
    for (int k = 0; k < balance[s]; ++k) stage_of.push_back(static_cast<int>(s));
  }
  return stage_of;
}

}  // namespace

std::optional<SharedTensor> split_by(const std::vector<SharedTensor>& shared,
                                     const std::vector<int>& balance) {
  const std::vector<int> stage_of = stage_of_layers(balance);
  for (const SharedTensor& s : shared) {
    if (s.second_layer >= stage_of.size()) continue;  // the balance's own check says more
    if (stage_of[s.first_layer] != stage_of[s.second_layer]) return s;
  }
  return std::nullopt;
}

void check_shared_tensors_on_one_stage(Model& model, const std::vector<int>& balance,
                                       const std::string& source) {
  const std::optional<SharedTensor> split = split_by(shared_tensors(model), balance);
  if (!split) return;
  const std::vector<int> stage_of = stage_of_layers(balance);
  throw InputError(fmt::format(
      "{}: {}, but the balance puts them on stages {} and {}: each stage would train its own "
      "copy; put both on one stage, or untie them",
      source, describe(model, *split), stage_of[split->first_layer],
      stage_of[split->second_layer]));
}

}  // namespace pipetune::models
