#include "nn/module.h"

#include <unordered_map>
#include <unordered_set>

#include "autograd/anomaly.h"
#include "autograd/grad_mode.h"
#include "core/error.h"
#include "core/format.h"

namespace asc::nn {

Tensor Module::forward(const Tensor&) {
  ASC_THROW("{}: this module has no single-tensor forward(); call its own forward(...) overload", type_name_);
}

// ---- hooks ----------------------------------------------------------------------------------------------------

int Module::add_forward_pre_hook(PreHook hook) {
  ASC_CHECK(hook != nullptr, "{}.add_forward_pre_hook: empty hook", type_name_);
  pre_hooks_.emplace(next_hook_id_, std::move(hook));
  return next_hook_id_++;
}

int Module::add_forward_post_hook(PostHook hook) {
  ASC_CHECK(hook != nullptr, "{}.add_forward_post_hook: empty hook", type_name_);
  post_hooks_.emplace(next_hook_id_, std::move(hook));
  return next_hook_id_++;
}

void Module::remove_hook(int id) {
  ASC_CHECK(pre_hooks_.erase(id) + post_hooks_.erase(id) == 1, "{}.remove_hook: no hook with id {}", type_name_, id);
}

Tensor Module::call_with_hooks(const Tensor& input, const std::function<Tensor(const Tensor&)>& body) {
  autograd::AnomalyScope scope(type_name_);  // names this module in anomaly reports (a flag test when off)
  if (pre_hooks_.empty() && post_hooks_.empty()) return body(input);
  // Iterate over copies: a hook may add or remove hooks while it runs.
  Tensor in = input;
  for (auto& [id, h] : std::map<int, PreHook>(pre_hooks_))
    if (auto r = h(*this, in)) in = *r;
  Tensor out = body(in);
  for (auto& [id, h] : std::map<int, PostHook>(post_hooks_))
    if (auto r = h(*this, in, out)) out = *r;
  return out;
}

// ---- registration ---------------------------------------------------------------------------------------------

void Module::check_new_name(const std::string& name, const char* what) const {
  ASC_CHECK(!name.empty() && name.find('.') == std::string::npos,
            "{}.register_{}: invalid name '{}' (must be non-empty and contain no '.')", type_name_, what, name);
  auto taken = [&](const auto& v) {
    for (const auto& e : v)
      if (e.name == name) return true;
    return false;
  };
  bool child = false;
  for (const auto& [n, m] : children_) child |= n == name;
  ASC_CHECK(!taken(params_) && !taken(buffers_) && !child, "{}.register_{}: the name '{}' is already registered",
            type_name_, what, name);
}

Tensor Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_new_name(name, "parameter");
  ASC_CHECK(t.defined(), "{}.register_parameter: '{}' is an undefined tensor", type_name_, name);
  ASC_CHECK(t.is_leaf(), "{}.register_parameter: '{}' must be a leaf tensor (detach it first)", type_name_, name);
  if (requires_grad) {
    ASC_CHECK(is_floating(t.dtype()), "{}.register_parameter: '{}' has dtype {}; trainable parameters must be floating",
              type_name_, name, t.dtype());
    t.set_requires_grad(true);
  }
  params_.push_back({name, t, true});
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t, bool persistent) {
  check_new_name(name, "buffer");
  ASC_CHECK(t.defined(), "{}.register_buffer: '{}' is an undefined tensor", type_name_, name);
  Tensor b = t.requires_grad() ? t.detach() : t;
  buffers_.push_back({name, b, persistent});
  return b;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name, "module");
  ASC_CHECK(module != nullptr, "{}.register_module: '{}' is null", type_name_, name);
  ASC_CHECK(module.get() != this, "{}.register_module: '{}' is the module itself", type_name_, name);
  children_.emplace_back(name, std::move(module));
}

// ---- introspection --------------------------------------------------------------------------------------------

void Module::collect(const std::string& prefix, bool params, bool recurse, bool persistent_only,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& e : params ? params_ : buffers_)
    if (!persistent_only || e.persistent) out.emplace_back(prefix + e.name, e.tensor);
  if (!recurse) return;
  for (const auto& [n, m] : children_) m->collect(prefix + n + ".", params, true, persistent_only, out);
}

namespace {
// Drops later occurrences of a tensor already listed (shared/tied parameters are trained once).
std::vector<std::pair<std::string, Tensor>> unique(std::vector<std::pair<std::string, Tensor>> v) {
  std::unordered_set<const TensorImpl*> seen;
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& e : v)
    if (seen.insert(e.second.impl()).second) out.push_back(std::move(e));
  return out;
}
std::vector<Tensor> values(const std::vector<std::pair<std::string, Tensor>>& v) {
  std::vector<Tensor> out;
  out.reserve(v.size());
  for (const auto& e : v) out.push_back(e.second);
  return out;
}
}  // namespace

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", true, recurse, false, out);
  return unique(std::move(out));
}
std::vector<Tensor> Module::parameters(bool recurse) const { return values(named_parameters(recurse)); }

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", false, recurse, false, out);
  return unique(std::move(out));
}
std::vector<Tensor> Module::buffers(bool recurse) const { return values(named_buffers(recurse)); }

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [n, m] : children_) out.push_back(m);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  // shared_from_this() needs the module to be owned by a shared_ptr; a stack-allocated root gets a non-owning one.
  std::shared_ptr<Module> self = weak_from_this().lock();
  if (!self) self = std::shared_ptr<Module>(this, [](Module*) {});
  out.emplace_back("", self);
  for (const auto& [n, m] : children_)
    for (auto& [sub, mod] : m->named_modules()) out.emplace_back(sub.empty() ? n : n + "." + sub, mod);
  return out;
}

int64_t Module::num_parameters(bool trainable_only) const {
  int64_t n = 0;
  for (const auto& [name, p] : named_parameters())
    if (!trainable_only || p.requires_grad()) n += p.numel();
  return n;
}

void Module::print(std::string& out, int indent) const {
  out += type_name_ + "(" + extra_repr();
  if (children_.empty()) {
    out += ")";
    return;
  }
  if (!extra_repr().empty()) out += ",";
  out += "\n";
  std::string pad(static_cast<size_t>(indent + 2), ' ');
  for (const auto& [n, m] : children_) {
    out += pad + "(" + n + "): ";
    m->print(out, indent + 2);
    out += "\n";
  }
  out += std::string(static_cast<size_t>(indent), ' ') + ")";
}

std::string Module::to_string() const {
  std::string s;
  print(s, 0);
  return s;
}

// ---- mode, device, gradients ----------------------------------------------------------------------------------

Module& Module::apply(const std::function<void(Module&)>& fn) {
  ASC_CHECK(static_cast<bool>(fn), "{}.apply: empty function", type_name_);
  for (auto& [n, m] : children_) m->apply(fn);
  fn(*this);
  return *this;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
}

template <class F>
void Module::for_each_tensor(F&& f) {
  std::unordered_set<const TensorImpl*> seen;
  std::vector<Tensor> all = parameters();
  for (auto& b : buffers()) all.push_back(b);
  for (auto& t : all)
    if (seen.insert(t.impl()).second) f(t);
}

void Module::to(Device device) {
  // Copy everything first, then re-point: a failing copy leaves the module on its old device.
  std::vector<std::pair<Tensor, Tensor>> moves;
  NoGradGuard g;
  for_each_tensor([&](Tensor& t) {
    if (t.device() != device) moves.emplace_back(t, t.to(device));
  });
  for (auto& [t, moved] : moves) t.set_data(moved);
}

void Module::to(DType dtype) {
  ASC_CHECK(is_floating(dtype), "{}.to: modules convert to floating dtypes only, got {}", type_name_, dtype);
  std::vector<std::pair<Tensor, Tensor>> moves;
  NoGradGuard g;
  for_each_tensor([&](Tensor& t) {
    if (is_floating(t.dtype()) && t.dtype() != dtype) moves.emplace_back(t, t.to(dtype));
  });
  for (auto& [t, moved] : moves) t.set_data(moved);
}

void Module::zero_grad() {
  for (auto& p : parameters()) p.zero_grad();
  for (auto& [name, m] : named_modules()) m->on_zero_grad();
}

// ---- state --------------------------------------------------------------------------------------------------

StateDict Module::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> all;
  collect("", true, true, false, all);
  collect("", false, true, true, all);
  StateDict sd;
  for (auto& [n, t] : all) sd.set(n, t);
  return sd;
}

namespace {
// "'a' (shape [2]), 'b' (shape [])": at most `limit` of the names, then how many more.
std::string describe_keys(const std::vector<std::string>& names, const StateDict& sd, size_t limit = 8) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < limit; ++i) {
    const Tensor& t = sd.at(names[i]);
    out += fmt::format("{}'{}' (shape {})", i ? ", " : "", names[i], t.defined() ? t.shape() : Shape{});
  }
  if (names.size() > limit) out += fmt::format(" and {} more", names.size() - limit);
  return out;
}
}  // namespace

LoadStateDictResult Module::load_state_dict(const StateDict& state, bool strict) {
  StateDict mine = state_dict();
  LoadStateDictResult result;
  for (const auto& [name, dst] : mine)
    if (!state.contains(name)) result.missing_keys.push_back(name);
  for (const auto& [name, t] : state)
    if (!mine.contains(name)) result.unexpected_keys.push_back(name);
  // Strict: every key must match; the error names all that do not (a checkpoint with other names is recognisable).
  if (strict && !result.all_matched()) {
    std::string msg;
    if (!result.missing_keys.empty())
      msg += fmt::format("missing key{} {}", result.missing_keys.size() == 1 ? "" : "s",
                         describe_keys(result.missing_keys, mine));
    if (!result.unexpected_keys.empty())
      msg += fmt::format("{}unexpected key{} {}", msg.empty() ? "" : "; ",
                         result.unexpected_keys.size() == 1 ? "" : "s", describe_keys(result.unexpected_keys, state));
    if (result.unexpected_keys.size() == state.size() && !state.empty())
      msg += " (no key of the state dict matches: was it saved from another model, or with another prefix?)";
    ASC_THROW("{}.load_state_dict: {}; use strict = false to load only the keys that match", type_name_, msg);
  }
  // Validate everything before touching anything.
  std::vector<std::pair<Tensor, Tensor>> copies;
  std::unordered_map<std::string, size_t> copy_of;  // name -> index into copies
  for (const auto& [name, dst] : mine) {
    const Tensor* src = state.find(name);
    if (!src) continue;
    ASC_CHECK(src->defined(), "{}.load_state_dict: '{}' is an undefined tensor", type_name_, name);
    ASC_CHECK(src->shape() == dst.shape(), "{}.load_state_dict: shape mismatch for '{}': checkpoint {}, model {}",
              type_name_, name, src->shape(), dst.shape());
    ASC_CHECK(is_floating(src->dtype()) == is_floating(dst.dtype()),
              "{}.load_state_dict: dtype mismatch for '{}': checkpoint {}, model {}", type_name_, name, src->dtype(),
              dst.dtype());
    copy_of.emplace(name, copies.size());
    copies.emplace_back(dst, *src);
  }
  // Stage every value in the destination's dtype and on its device (a CPU checkpoint into a CUDA model, float16
  // into float32) before the first copy, so a conversion that fails leaves the module untouched.
  // A value that shares memory with one of the destinations (the module's own state dict with two entries swapped,
  // a view of another parameter) is staged as a copy: the loads must not see each other's writes.
  NoGradGuard g;
  std::unordered_set<const Storage*> destinations;
  for (const auto& [dst, src] : copies) destinations.insert(dst.impl()->storage.get());
  for (auto& [dst, src] : copies) {
    src = src.to(dst.dtype()).to(dst.device());
    if (destinations.count(src.impl()->storage.get())) src = src.clone();
  }
  // Each module checks the values meant for its own tensors, as its setters would (still before any copy).
  for (const auto& [prefix, m] : named_modules()) {
    StateDict incoming;
    auto add = [&](const std::vector<Entry>& entries) {
      for (const auto& e : entries) {
        if (!e.persistent) continue;
        auto it = copy_of.find(prefix.empty() ? e.name : prefix + "." + e.name);
        if (it != copy_of.end()) incoming.set(e.name, copies[it->second].second);
      }
    };
    add(m->params_);
    add(m->buffers_);
    if (!incoming.empty()) m->check_state(incoming);
  }
  for (auto& [dst, src] : copies) dst.copy_(src);
  return result;
}

}  // namespace asc::nn
