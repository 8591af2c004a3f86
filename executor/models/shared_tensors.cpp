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
                       first->second.parameter || held[k].parameter,
                       key == tensors[k].unsafeGetTensorImpl()});
      }
    }
  }
  return out;
}

std::vector<TiedParameter> tied_parameters(Model& model) {
  std::vector<TiedParameter> out;
  std::map<const void*, std::size_t> index;  // a tensor -> its entry in out
  std::size_t layer = 0;
  for (auto it = model.layers->begin(); it != model.layers->end(); ++it, ++layer) {
    for (const auto& p : it->ptr()->named_parameters()) {
      const auto [at, fresh] = index.emplace(p.value().unsafeGetTensorImpl(), out.size());
      TiedParameter& t = fresh ? out.emplace_back() : out[at->second];
      if (fresh) {
        t.tensor = p.value();
        t.name = model.layer_names.at(layer) + "." + p.key();
      }
      t.holders.emplace_back(layer, p.key());
      if (t.layers.empty() || t.layers.back() != layer) t.layers.push_back(layer);
    }
  }
  std::erase_if(out, [](const TiedParameter& t) { return t.layers.size() < 2; });
  return out;
}

std::string describe(const Model& model, const SharedTensor& s) {
  const std::string& a = model.layer_names.at(s.first_layer);
  const std::string& b = model.layer_names.at(s.second_layer);
  return fmt::format("layers {} (\"{}\") and {} (\"{}\") share a {} ({}.{} is {}.{})",
                     s.first_layer, a, s.second_layer, b, s.parameter ? "parameter" : "buffer", a,
                     s.first_name, b, s.second_name);
}

std::vector<int> stage_of_layers(const std::vector<int>& balance) {
  std::vector<int> stage_of;
  for (std::size_t s = 0; s < balance.size(); ++s) {
    for (int k = 0; k < balance[s]; ++k) stage_of.push_back(static_cast<int>(s));
  }
  return stage_of;
}

std::optional<SharedTensor> split_by(const std::vector<SharedTensor>& shared,
                                     const std::vector<int>& balance) {
  const std::vector<int> stage_of = stage_of_layers(balance);
  for (const SharedTensor& s : shared) {
    if (s.second_layer >= stage_of.size()) continue;  // the balance's own check says more
    if (stage_of[s.first_layer] != stage_of[s.second_layer]) return s;
  }
  return std::nullopt;
}

std::string why_not_split(Model& model, const SharedTensor& shared) {
  if (!shared.parameter) return "a buffer is kept as one only on one stage";
  if (!shared.same_tensor)
    return "a view of another layer's tensor is kept as one only on one stage";
  torch::nn::Module& later = *model.layers->ptr(shared.second_layer);
  if (!can_repoint(later, shared.second_name)) {
    return fmt::format("layer {} is not a TorchScript layer, so it cannot hold a copy of its own",
                       shared.second_layer);
  }
  return {};
}

void check_tied_split(Model& model, const std::vector<int>& balance, const std::string& source) {
  const std::vector<int> stage_of = stage_of_layers(balance);
  for (const SharedTensor& s : shared_tensors(model)) {
    if (s.second_layer >= stage_of.size()) continue;  // the balance's own check says more
    if (stage_of[s.first_layer] == stage_of[s.second_layer]) continue;
    const std::string why = why_not_split(model, s);
    if (why.empty()) continue;
    throw InputError(fmt::format(
        "{}: {}, but the balance puts them on stages {} and {}, and {}; put both on "
        "one stage, or untie them",
        source, describe(model, s), stage_of[s.first_layer], stage_of[s.second_layer], why));
  }
}

}  // namespace pipetune::models
