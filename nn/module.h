#pragma once
// nn::Module — the base of every layer and model: ordered parameters, buffers and child modules with dotted
// names, train/eval mode, moving to a device or dtype, state dicts, forward hooks and a readable printout.
//
//   struct Net : asc::nn::Module {
//     std::shared_ptr<asc::nn::Linear> fc1, fc2;
//     Net() : Module("Net") {
//       fc1 = register_module("fc1", std::make_shared<asc::nn::Linear>(2, 32));
//       fc2 = register_module("fc2", std::make_shared<asc::nn::Linear>(32, 2));
//     }
//     asc::Tensor forward(const asc::Tensor& x) override { return (*fc2)(asc::relu((*fc1)(x))); }
//   };
//   auto net = std::make_shared<Net>();
//   for (auto& [name, p] : net->named_parameters()) fmt::print("{} {}\n", name, p.shape());  // fc1.weight (32, 2) ...
//   fmt::print("{}\n", net->to_string());
//
// Parameters are leaf Tensors with requires_grad; layers keep handles to them as members. Module::to() re-points
// those same handles (Tensor::set_data), so members, optimizers and hooks stay valid after a move.
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/state_dict.h"
#include "core/tensor.h"

namespace asc::nn {

// Fluent option setters: `ASC_ARG(int64_t, heads) = 4;` declares a field `heads_` (default 4), a setter
// `heads(int64_t)` returning *this for chaining, and a getter `heads()`.
#define ASC_ARG(T, name)                    \
 public:                                    \
  auto& name(const T& new_##name) {         \
    this->name##_ = new_##name;             \
    return *this;                           \
  }                                         \
  const T& name() const { return name##_; } \
                                            \
 private:                                   \
  T name##_

// What a forward pass leaves behind for the caller to read afterwards (attention weights, a gate, an auxiliary loss).
// Inference may run one module's forward from several threads at once, so the value is stored and read under a lock,
// and read by value (a Tensor is a handle); with concurrent calls it holds the result of whichever call stored last.
template <class T>
class LastForward {
 public:
  void set(T value) {
    std::lock_guard lock(mu_);
    value_ = std::move(value);
  }
  T get() const {
    std::lock_guard lock(mu_);
    return value_;
  }

 private:
  mutable std::mutex mu_;
  T value_{};
};

// What Module::load_state_dict left unmatched, as PyTorch's `_IncompatibleKeys`. A strict load throws instead of
// returning a non-empty one; a non-strict load returns it, so that a checkpoint whose names do not match the model
// (PyTorch's names, another prefix) cannot leave the model at its initialisation unnoticed:
//   auto r = model->load_state_dict(sd, /*strict=*/false);
//   ASC_CHECK(r.missing_keys.empty(), "not loaded: {}", fmt::join(r.missing_keys, ", "));
struct LoadStateDictResult {
  std::vector<std::string> missing_keys;     // the module's entries the state dict lacks: left as they were
  std::vector<std::string> unexpected_keys;  // the state dict's entries the module lacks: ignored
  bool all_matched() const { return missing_keys.empty() && unexpected_keys.empty(); }
};

class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // ---- forward ------------------------------------------------------------------------------------------------
  // Single-tensor modules override forward(); call them through operator(), which runs the forward hooks.
  // Modules with other signatures (attention: q, k, v, masks) define their own forward and wrap it in
  // call_with_hooks() with their primary input.
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) {
    return call_with_hooks(x, [this](const Tensor& in) { return forward(in); });
  }

  // A pre hook may replace the input (return a tensor) or leave it (nullopt); a post hook may replace the output.
  using PreHook = std::function<std::optional<Tensor>(Module&, const Tensor& input)>;
  using PostHook = std::function<std::optional<Tensor>(Module&, const Tensor& input, const Tensor& output)>;
  int add_forward_pre_hook(PreHook hook);
  int add_forward_post_hook(PostHook hook);
  void remove_hook(int id);  // error for an unknown id
  // Whether any forward hook is registered (a block that fuses a child's work into its own skips the fusion then).
  bool has_forward_hooks() const { return !pre_hooks_.empty() || !post_hooks_.empty(); }

  // ---- registration ---------------------------------------------------------------------------------------------
  // Names are unique per module and contain no '.'; a parameter is made a leaf that requires grad (floating
  // dtypes). Returns the handle to keep as a member.
  Tensor register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  // Buffers are state that is not trained by gradients (running statistics, thresholds, masks). Non-persistent
  // buffers move with to() but are not part of the state dict.
  Tensor register_buffer(const std::string& name, Tensor t, bool persistent = true);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  // ---- introspection --------------------------------------------------------------------------------------------
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const { return children_; }
  std::vector<std::shared_ptr<Module>> children() const;
  // This module ("") and every descendant, depth first, with dotted names.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules();
  // PyTorch's Module.apply: calls fn on every child's subtree first (depth first, in registration order), then on
  // this module; returns *this. The usual way to run an initialisation over a whole model:
  //   model->apply([](asc::nn::Module& m) { if (auto* l = dynamic_cast<asc::nn::Linear*>(&m)) init(*l); });
  Module& apply(const std::function<void(Module&)>& fn);
  // Number of parameter elements (a parameter shared by two modules counts once).
  int64_t num_parameters(bool trainable_only = false) const;

  const std::string& type_name() const { return type_name_; }
  // One line of configuration shown in the printout, e.g. "in_features=2, out_features=32, bias=true".
  virtual std::string extra_repr() const { return ""; }
  std::string to_string() const;  // the module tree, PyTorch style

  // ---- mode, device, gradients ----------------------------------------------------------------------------------
  void train(bool on = true);  // recursive
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves every parameter and buffer (recursively). to(dtype) converts floating tensors only.
  void to(Device device);
  void to(DType dtype);
  void zero_grad();  // drops every parameter's .grad (and what on_zero_grad() drops)

  // ---- state --------------------------------------------------------------------------------------------------
  // Parameters and persistent buffers with dotted names (shared tensors appear under each name).
  StateDict state_dict() const;
  // Copies values into the existing tensors (dtype converted, device kept), and returns the keys it did not match.
  // Everything is validated first — shapes, a non-floating source for a floating parameter, each module's
  // check_state(), and with strict (the default) every key: a missing or an unexpected key throws, naming all of
  // them — so on error the module is left untouched (nothing is half-loaded). With strict = false the entries that
  // match are loaded and the others are returned in the result (missing ones keep their current values).
  LoadStateDictResult load_state_dict(const StateDict& state, bool strict = true);

 protected:
  // Called by load_state_dict after the shapes and dtypes are checked and before anything is copied, once for each
  // place this module has in the tree, with the entries about to be loaded into this module's own parameters and
  // buffers (local names, values already in the destination's dtype and on its device; absent entries are not
  // listed). A layer whose setters refuse some values overrides it to refuse the same values here (throw
  // asc::Error); the whole load is then abandoned with every module untouched.
  virtual void check_state(const StateDict& incoming) const { (void)incoming; }
  // Called by zero_grad() on this module and each descendant, after every parameter's .grad is dropped: a layer
  // that holds a gradient in a parameter's place (a firing layer whose rule B takes W's SGD step) drops it too.
  virtual void on_zero_grad() {}
  Tensor call_with_hooks(const Tensor& input, const std::function<Tensor(const Tensor&)>& body);
  void add_child(const std::string& name, std::shared_ptr<Module> module);

 private:
  struct Entry {
    std::string name;
    Tensor tensor;
    bool persistent = true;
  };
  void check_new_name(const std::string& name, const char* what) const;
  void collect(const std::string& prefix, bool params, bool recurse, bool persistent_only,
               std::vector<std::pair<std::string, Tensor>>& out) const;
  void print(std::string& out, int indent) const;
  template <class F>
  void for_each_tensor(F&& f);  // every parameter and buffer, recursively, each impl once

  std::string type_name_;
  bool training_ = true;
  std::vector<Entry> params_;
  std::vector<Entry> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::map<int, PreHook> pre_hooks_;
  std::map<int, PostHook> post_hooks_;
  int next_hook_id_ = 0;
};

}  // namespace asc::nn
