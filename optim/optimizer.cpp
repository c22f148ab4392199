#include "optim/optimizer.h"

#include <limits>

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/ranges.h>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "core/format.h"
#include "ops/dispatch.h"
#include "ops/kernels.h"
#include "ops/ops.h"

namespace asc::optim {

int64_t parse_state_index(const std::string& s) {
  if (s.empty() || s.size() > 12 || (s.size() > 1 && s[0] == '0')) return -1;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

namespace {

std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == '.')
      out.emplace_back();
    else
      out.back() += c;
  }
  return out;
}

// Non-negative decimal index, or -1.
// The one value of a one-element tensor of dtype `dt`, else an error naming the entry.
double scalar_entry(const std::string& opt, const std::string& key, const Tensor& t, DType dt) {
  ASC_CHECK(t.defined() && t.dtype() == dt && t.numel() == 1,
            "{}.load_state_dict: entry '{}' must be a one-element {} tensor, got {}", opt, key, dtype_name(dt),
            t.defined() ? fmt::format("{} of shape {}", t.dtype(), t.shape()) : std::string("an undefined tensor"));
  return t.item<double>();
}

}  // namespace

Optimizer::Optimizer(std::string name, std::vector<std::string> option_names, std::vector<std::string> state_names)
    : name_(std::move(name)), option_names_(std::move(option_names)), state_names_(std::move(state_names)) {
  ASC_CHECK(!option_names_.empty() && option_names_[0] == "lr", "{}: the first option must be lr", name_);
}

void Optimizer::check_group(size_t group, const char* what) const {
  ASC_CHECK(group < groups_.size(), "{}.{}: group {} out of range (the optimizer has {} groups)", name_, what, group,
            groups_.size());
}

size_t Optimizer::option_index(const std::string& option, const char* what) const {
  for (size_t i = 0; i < option_names_.size(); ++i)
    if (option_names_[i] == option) return i;
  ASC_THROW("{}.{}: no option named '{}' (options: {})", name_, what, option, fmt::join(option_names_, ", "));
}

void Optimizer::add_group(std::vector<Tensor> params, std::vector<double> options) {
  ASC_CHECK(options.size() == option_names_.size(), "{}: expected {} options, got {}", name_, option_names_.size(),
            options.size());
  check_options(options);
  // As in PyTorch: a group with nothing to update is almost always a model that did not register its parameters.
  ASC_CHECK(!params.empty(), "{}: got an empty parameter list (group {}); did the model register its parameters?",
            name_, groups_.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    ASC_CHECK(p.defined(), "{}: parameter {} of the new group is an undefined tensor", name_, i);
    ASC_CHECK(p.dtype() == kFloat32 || p.dtype() == kFloat64,
              "{}: parameter {} (shape {}) has dtype {}; optimizers update float32/float64 parameters", name_, i,
              p.shape(), p.dtype());
    ASC_CHECK(p.is_leaf(), "{}: parameter {} (shape {}) is not a leaf tensor (it has a grad_fn)", name_, i, p.shape());
    ASC_CHECK(p.is_contiguous(), "{}: parameter {} (shape {}) is not contiguous", name_, i, p.shape());
    bool dup = false;
    for (const auto& g : groups_)
      for (const auto& q : g.params) dup = dup || q.impl() == p.impl();
    for (size_t j = 0; j < i; ++j) dup = dup || params[j].impl() == p.impl();
    ASC_CHECK(!dup, "{}: parameter {} (shape {}) appears in more than one place (each parameter belongs to one group)",
              name_, i, p.shape());
  }
  groups_.push_back({std::move(params), std::move(options)});
}

double Optimizer::lr(size_t group) const {
  check_group(group, "lr");
  return groups_[group].options[0];
}

void Optimizer::set_lr(size_t group, double lr) { set_option(group, "lr", lr); }

int64_t Optimizer::group_of(const Tensor& param) const {
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (const Tensor& p : groups_[gi].params)
      if (p.impl() == param.impl()) return static_cast<int64_t>(gi);
  return -1;
}

double Optimizer::option(size_t group, const std::string& option) const {
  check_group(group, "option");
  return groups_[group].options[option_index(option, "option")];
}

void Optimizer::set_option(size_t group, const std::string& option, double value) {
  check_group(group, "set_option");
  std::vector<double> o = groups_[group].options;
  o[option_index(option, "set_option")] = value;
  check_options(o);
  groups_[group].options = std::move(o);
}

const std::vector<Tensor>& Optimizer::params(size_t group) const {
  check_group(group, "params");
  return groups_[group].params;
}

int64_t Optimizer::step_count(const Tensor& param) const {
  auto it = state_.find(param.impl());
  return it == state_.end() ? 0 : it->second.step;
}

Tensor Optimizer::state(const Tensor& param, const std::string& buffer) const {
  auto idx = std::find(state_names_.begin(), state_names_.end(), buffer);
  ASC_CHECK(idx != state_names_.end(), "{}.state: no state buffer named '{}' (buffers: {})", name_, buffer,
            fmt::join(state_names_, ", "));
  auto it = state_.find(param.impl());
  if (it == state_.end()) return {};
  return it->second.bufs[static_cast<size_t>(idx - state_names_.begin())];
}

void Optimizer::zero_grad() {
  for (auto& g : groups_)
    for (auto& p : g.params) p.zero_grad();
  // A gradient a rule holds for a parameter (rule B's fuse_sgd) is that parameter's .grad in all but storage.
  for (const auto& rule : rules_) rule->zero_grad();
}

// ---- hooks and rules ------------------------------------------------------------------------------------------

int Optimizer::add_step_pre_hook(Hook hook) {
  ASC_CHECK(static_cast<bool>(hook), "{}.add_step_pre_hook: empty function", name_);
  pre_hooks_.push_back({next_hook_id_, std::move(hook)});
  return next_hook_id_++;
}

int Optimizer::add_step_post_hook(Hook hook) {
  ASC_CHECK(static_cast<bool>(hook), "{}.add_step_post_hook: empty function", name_);
  post_hooks_.push_back({next_hook_id_, std::move(hook)});
  return next_hook_id_++;
}

void Optimizer::remove_hook(int id) {
  for (auto* list : {&pre_hooks_, &post_hooks_}) {
    auto it = std::find_if(list->begin(), list->end(), [&](const HookEntry& h) { return h.id == id; });
    if (it != list->end()) {
      list->erase(it);
      return;
    }
  }
  ASC_THROW("{}.remove_hook: no hook with id {}", name_, id);
}

void Optimizer::run_hooks(const std::vector<HookEntry>& hooks) {
  // A copy, so a hook may add or remove hooks without invalidating the iteration.
  std::vector<HookEntry> copy = hooks;
  for (auto& h : copy) h.fn(*this);
}

void Optimizer::add_local_rule(std::shared_ptr<LocalRule> rule) {
  ASC_CHECK(rule != nullptr, "{}.add_local_rule: null rule", name_);
  for (const auto& r : rules_)
    ASC_CHECK(r != rule, "{}.add_local_rule: rule '{}' is already attached", name_, rule->name());
  rules_.push_back(std::move(rule));
}

// ---- step -----------------------------------------------------------------------------------------------------

void Optimizer::step() {
  run_hooks(pre_hooks_);

  // 1. Validate every gradient and resolve every row mask before anything is modified; the rules check the options
  //    they depend on and their snapshots.
  for (const auto& rule : rules_) rule->prepare(*this);
  struct Work {
    size_t group;
    Tensor param, grad, mask;
  };
  std::vector<Work> work;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (size_t i = 0; i < groups_[gi].params.size(); ++i) {
      const Tensor& p = groups_[gi].params[i];
      Tensor g = p.grad();
      if (!g.defined()) continue;
      ASC_CHECK(g.shape() == p.shape() && g.dtype() == p.dtype() && g.device() == p.device(),
                "{}.step: parameter {} of group {} is {} {} on {} but its .grad is {} {} on {}", name_, i, gi,
                p.dtype(), p.shape(), p.device(), g.dtype(), g.shape(), g.device());
      // Module::to() may have re-pointed the parameter since it was added: the fused kernels take float32/float64.
      ASC_CHECK(p.dtype() == kFloat32 || p.dtype() == kFloat64,
                "{}.step: parameter {} of group {} is {}; optimizers update float32/float64 parameters (keep "
                "float32 master weights for lower-precision models, optim/amp.h)",
                name_, i, gi, p.dtype());
      Tensor mask;
      for (const auto& rule : rules_) {
        if (!rule->masks(p)) continue;
        Tensor m = rule->row_mask(p);  // validates shape and dtype
        if (!m.defined()) continue;
        ASC_CHECK(m.device() == p.device(), "{}.step: rule '{}' gave a row mask on {} for a parameter on {}", name_,
                  rule->name(), m.device(), p.device());
        NoGradGuard ng;
        mask = mask.defined() ? logical_and(mask, m).contiguous() : m.contiguous();
      }
      work.push_back({gi, p, g.contiguous(), mask});
    }
  }

  NoGradGuard no_grad;
  // After Module::to() re-pointed a parameter, its state follows to the parameter's dtype and device — converted
  // here, before the first update, so a failing conversion leaves every parameter untouched.
  std::vector<std::pair<Tensor*, Tensor>> moved;
  for (auto& w : work) {
    auto it = state_.find(w.param.impl());
    if (it == state_.end()) continue;
    for (auto& b : it->second.bufs)
      if (b.defined() && (b.dtype() != w.param.dtype() || b.device() != w.param.device()))
        moved.emplace_back(&b, b.to(w.param.dtype()).to(w.param.device()).contiguous());
  }
  // 2. The rules compute their updates from the pre-step parameters (one simultaneous update with the gradient
  //    step); they modify nothing until apply().
  for (const auto& rule : rules_) rule->pre_update();
  for (auto& [buf, converted] : moved) *buf = converted;
  // 3. The fused gradient updates.
  for (auto& w : work) {
    ParamState& st = state_[w.param.impl()];
    if (st.bufs.empty()) st.bufs.resize(state_names_.size());
    update(groups_[w.group].options, w.param, w.grad, st, w.mask);
    w.param.impl()->storage->bump_version();
  }
  // 4. Local rules add their own updates.
  for (const auto& rule : rules_) rule->apply();
  // 5. Clamps.
  for (const auto& rule : rules_) {
    for (const auto& r : rule->ranges()) {
      const Tensor& t = r.tensor;
      if (t.is_contiguous()) {
        ASC_KERNEL(t.device(), "Optimizer.step (clamp)", clamp_inplace, t, r.lo, r.hi);
        t.impl()->storage->bump_version();
      } else {
        Tensor(t).copy_(clamp(t, r.lo, r.hi));
      }
    }
  }
  run_hooks(post_hooks_);
  for (const auto& rule : rules_) rule->clear();
}

// ---- state dict ------------------------------------------------------------------------------------------------

StateDict Optimizer::state_dict() const {
  StateDict sd;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t k = 0; k < option_names_.size(); ++k)
      sd.set(fmt::format("groups.{}.{}", g, option_names_[k]),
             scalar_tensor(groups_[g].options[k], {.dtype = kFloat64}));
    sd.set(fmt::format("groups.{}.num_params", g),
           tensor(std::vector<int64_t>{static_cast<int64_t>(groups_[g].params.size())}, Shape{}));
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      auto it = state_.find(groups_[g].params[i].impl());
      if (it == state_.end()) continue;
      const ParamState& st = it->second;
      sd.set(fmt::format("state.{}.{}.step", g, i), tensor(std::vector<int64_t>{st.step}, Shape{}));
      for (size_t k = 0; k < st.bufs.size(); ++k)
        if (st.bufs[k].defined())
          sd.set(fmt::format("state.{}.{}.{}", g, i, state_names_[k]), st.bufs[k].detach().clone());
    }
  }
  return sd;
}

void Optimizer::load_state_dict(const StateDict& sd) {
  const char* who = name_.c_str();
  const size_t G = groups_.size();
  std::vector<std::vector<double>> options(G, std::vector<double>(option_names_.size(), std::nan("")));
  std::vector<std::vector<bool>> have_option(G, std::vector<bool>(option_names_.size() + 1, false));
  // New per-parameter state, by (group, index).
  std::map<std::pair<size_t, size_t>, ParamState> new_state;
  std::map<std::pair<size_t, size_t>, bool> have_step;

  for (const auto& [key, t] : sd) {
    auto parts = split_dots(key);
    if (parts.size() == 3 && parts[0] == "groups") {
      int64_t g = parse_state_index(parts[1]);
      ASC_CHECK(g >= 0, "{}.load_state_dict: unexpected entry '{}'", who, key);
      ASC_CHECK(static_cast<size_t>(g) < G,
                "{}.load_state_dict: entry '{}' names group {} but the optimizer has {} groups", who, key, g, G);
      if (parts[2] == "num_params") {
        double n = scalar_entry(name_, key, t, kInt64);
        ASC_CHECK(n == static_cast<double>(groups_[g].params.size()),
                  "{}.load_state_dict: group {} has {} parameters in the state dict but {} in the optimizer", who, g, n,
                  groups_[g].params.size());
        have_option[g][option_names_.size()] = true;
        continue;
      }
      auto it = std::find(option_names_.begin(), option_names_.end(), parts[2]);
      ASC_CHECK(it != option_names_.end(), "{}.load_state_dict: unexpected entry '{}' (no option '{}')", who, key,
                parts[2]);
      size_t k = static_cast<size_t>(it - option_names_.begin());
      options[g][k] = scalar_entry(name_, key, t, kFloat64);
      have_option[g][k] = true;
    } else if (parts.size() == 4 && parts[0] == "state") {
      int64_t g = parse_state_index(parts[1]), i = parse_state_index(parts[2]);
      ASC_CHECK(g >= 0 && i >= 0, "{}.load_state_dict: unexpected entry '{}'", who, key);
      ASC_CHECK(static_cast<size_t>(g) < G && static_cast<size_t>(i) < groups_[g].params.size(),
                "{}.load_state_dict: entry '{}' names parameter {} of group {}, which the optimizer does not have", who,
                key, i, g);
      auto id = std::make_pair(static_cast<size_t>(g), static_cast<size_t>(i));
      ParamState& st = new_state[id];
      if (st.bufs.empty()) st.bufs.resize(state_names_.size());
      const Tensor& p = groups_[g].params[i];
      if (parts[3] == "step") {
        scalar_entry(name_, key, t, kInt64);  // validates dtype and shape
        // Read as int64, not through a double: 2^53 + 1 would round, INT64_MAX would convert back undefined (found
        // by tests/test_fuzz_loaders). The step is incremented by the next update, so INT64_MAX is refused too.
        const int64_t s = t.item<int64_t>();
        ASC_CHECK(s >= 0 && s < std::numeric_limits<int64_t>::max(),
                  "{}.load_state_dict: entry '{}' is {}; a step count must be in [0, 2^63 - 1)", who, key, s);
        st.step = s;
        have_step[id] = true;
        continue;
      }
      auto it = std::find(state_names_.begin(), state_names_.end(), parts[3]);
      ASC_CHECK(it != state_names_.end(),
                "{}.load_state_dict: unexpected entry '{}' (no state buffer '{}'; buffers: {})", who, key, parts[3],
                fmt::join(state_names_, ", "));
      ASC_CHECK(t.defined() && t.shape() == p.shape() && t.dtype() == p.dtype(),
                "{}.load_state_dict: entry '{}' is {} but parameter {} of group {} is {} {}", who, key,
                t.defined() ? fmt::format("{} {}", t.dtype(), t.shape()) : std::string("undefined"), i, g, p.dtype(),
                p.shape());
      st.bufs[static_cast<size_t>(it - state_names_.begin())] = t;  // copied at commit
    } else {
      ASC_THROW("{}.load_state_dict: unexpected entry '{}'", who, key);
    }
  }
  for (size_t g = 0; g < G; ++g) {
    for (size_t k = 0; k <= option_names_.size(); ++k)
      ASC_CHECK(have_option[g][k], "{}.load_state_dict: missing entry 'groups.{}.{}'", who, g,
                k < option_names_.size() ? option_names_[k] : std::string("num_params"));
    check_options(options[g]);
  }
  for (const auto& [id, st] : new_state)
    ASC_CHECK(have_step.count(id), "{}.load_state_dict: missing entry 'state.{}.{}.step'", who, id.first, id.second);

  // Commit: nothing below throws on validated input.
  for (size_t g = 0; g < G; ++g) groups_[g].options = options[g];
  state_.clear();
  NoGradGuard ng;
  for (auto& [id, st] : new_state) {
    const Tensor& p = groups_[id.first].params[id.second];
    for (auto& b : st.bufs)
      if (b.defined()) b = b.detach().to(p.device()).clone();
    state_[p.impl()] = std::move(st);
  }
}

}  // namespace asc::optim
