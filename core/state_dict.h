#pragma once
// StateDict: named tensors in insertion order — what modules, optimizers, schedulers and generators save, and
// what checkpoints (nn/safetensors.h) write. Names are dotted paths ("encoder.0.attn.q_proj.weight").
//
//   asc::StateDict sd = model->state_dict();
//   for (const auto& [name, t] : sd) fmt::print("{} {}\n", name, t.shape());
//   asc::Tensor w = sd.at("fc1.weight");
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace asc {

class StateDict {
 public:
  using Item = std::pair<std::string, Tensor>;

  // Inserts or replaces `name` (a replaced entry keeps its position).
  void set(const std::string& name, Tensor t) {
    auto it = index_.find(name);
    if (it != index_.end()) {
      items_[it->second].second = std::move(t);
      return;
    }
    index_.emplace(name, items_.size());
    items_.emplace_back(name, std::move(t));
  }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // nullptr when absent.
  const Tensor* find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &items_[it->second].second;
  }
  const Tensor& at(const std::string& name) const {
    const Tensor* t = find(name);
    ASC_CHECK(t != nullptr, "StateDict: no entry named '{}'", name);
    return *t;
  }
  // Entries whose name starts with `prefix`, with the prefix removed ("optim." -> the optimizer's own dict).
  StateDict sub(const std::string& prefix) const {
    StateDict out;
    for (const auto& [n, t] : items_)
      if (n.compare(0, prefix.size(), prefix) == 0) out.set(n.substr(prefix.size()), t);
    return out;
  }
  // Adds every entry of `other` under `prefix`.
  void merge(const StateDict& other, const std::string& prefix = "") {
    for (const auto& [n, t] : other) set(prefix + n, t);
  }

  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  std::vector<Item>::const_iterator begin() const { return items_.begin(); }
  std::vector<Item>::const_iterator end() const { return items_.end(); }

 private:
  std::vector<Item> items_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace asc
