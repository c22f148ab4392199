#pragma once
// Optimizer: the base of SGD / Adam / AdamW / RMSprop (optim/optimizers.h). Parameters are leaf Tensors in
// groups with their own options (lr, weight decay, ...); per-parameter state (step count, momentum buffers, ...)
// is keyed by the parameter's impl, so the caller's Tensor handles stay valid: updates are in place, without grad.
//
//   asc::optim::AdamW opt(model->parameters(), {.lr = 1e-3, .weight_decay = 0.01});
//   opt.add_step_post_hook([](asc::optim::Optimizer& o) { /* logging, EMA of weights, ... */ });
//   for (...) {
//     opt.zero_grad();
//     loss(model, batch).backward();
//     asc::optim::clip_grad_norm(model->parameters(), 1.0);
//     opt.step();                     // pre hooks, masked fused updates, local rules, clamps, post hooks
//   }
//   asc::StateDict sd = opt.state_dict();   // resume bit-identically with load_state_dict(sd)
//
// step() order: pre hooks -> LocalRule::prepare() (options and snapshots) and the validation of every gradient and
// row mask (nothing is modified when one is bad) -> LocalRule::pre_update() of every rule (each computes its update
// from the pre-step parameters) -> the fused update of every parameter with a defined .grad (parameters without one
// are skipped, their state untouched) restricted to the rows the local rules allow -> LocalRule::apply() of every
// rule -> clamps of the ranges the rules registered -> post hooks -> LocalRule::clear(). See optim/local_rule.h.
//
// state_dict() layout (positions, not names, identify parameters, as in torch.optim):
//   groups.{g}.{option}     float64 scalar per option (bools as 0/1); groups.{g}.num_params int64 scalar
//   state.{g}.{i}.step      int64 scalar (updates done on parameter i of group g)
//   state.{g}.{i}.{buffer}  the state tensors, parameter's shape and dtype (exp_avg, momentum_buffer, ...)
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/state_dict.h"
#include "core/tensor.h"
#include "optim/local_rule.h"

namespace asc::optim {

// The index in a state-dict key ("groups.3.lr", "base_lrs.12"): canonical decimal (no sign, no leading zeros, at
// most 12 digits), else -1. Shared by the optimizer and scheduler loaders so "00" can never alias "0".
int64_t parse_state_index(const std::string& s);

class Optimizer {
 public:
  using Hook = std::function<void(Optimizer&)>;

  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  void step();
  // Drops the .grad of every parameter (sets it to undefined, so the next step skips parameters that get none) and
  // every gradient a local rule holds in a parameter's place (LocalRule::zero_grad(): rule B's fuse_sgd).
  void zero_grad();

  const std::string& name() const { return name_; }
  size_t num_groups() const { return groups_.size(); }
  double lr(size_t group) const;
  void set_lr(size_t group, double lr);
  // Any option of a group by name (the names of the options struct; bools read as 0/1).
  double option(size_t group, const std::string& option) const;
  void set_option(size_t group, const std::string& option, double value);
  const std::vector<Tensor>& params(size_t group) const;
  // The group holding `param` (the same tensor, not a copy), or -1.
  int64_t group_of(const Tensor& param) const;

  // The optimizer state of one parameter: its step count (0 before its first update) and a named state tensor
  // (undefined when not allocated). For inspection and tests.
  int64_t step_count(const Tensor& param) const;
  Tensor state(const Tensor& param, const std::string& buffer) const;

  StateDict state_dict() const;
  // Replaces the group options and the whole per-parameter state. Validates every entry (names, group and
  // parameter counts, shapes, dtypes, option values) before changing anything. Tensors are copied.
  void load_state_dict(const StateDict& sd);

  // Hooks run in registration order; the ids are unique per optimizer.
  int add_step_pre_hook(Hook hook);
  int add_step_post_hook(Hook hook);
  void remove_hook(int id);

  void add_local_rule(std::shared_ptr<LocalRule> rule);
  const std::vector<std::shared_ptr<LocalRule>>& local_rules() const { return rules_; }

 protected:
  struct ParamState {
    int64_t step = 0;
    std::vector<Tensor> bufs;  // indexed like state_names(); undefined until allocated
  };

  // option_names[0] must be "lr".
  Optimizer(std::string name, std::vector<std::string> option_names, std::vector<std::string> state_names);

  // Validates the parameters (defined, float32/float64, leaf, contiguous, not already in a group) and the options,
  // then appends the group.
  void add_group(std::vector<Tensor> params, std::vector<double> options);
  // Throws asc::Error naming the bad option when `options` is not valid for this optimizer.
  virtual void check_options(const std::vector<double>& options) const = 0;
  // One parameter's update. grad: contiguous, param's shape/dtype/device. row_mask: undefined or bool (rows,).
  // Allocates missing state buffers itself (any subset may be absent after load_state_dict).
  virtual void update(const std::vector<double>& options, const Tensor& param, const Tensor& grad, ParamState& st,
                      const Tensor& row_mask) = 0;

  const std::vector<std::string>& state_names() const { return state_names_; }

 private:
  struct Group {
    std::vector<Tensor> params;
    std::vector<double> options;
  };
  struct HookEntry {
    int id;
    Hook fn;
  };

  size_t option_index(const std::string& option, const char* what) const;
  void check_group(size_t group, const char* what) const;
  void run_hooks(const std::vector<HookEntry>& hooks);

  std::string name_;
  std::vector<std::string> option_names_;
  std::vector<std::string> state_names_;
  std::vector<Group> groups_;
  std::unordered_map<const TensorImpl*, ParamState> state_;
  std::vector<HookEntry> pre_hooks_, post_hooks_;
  int next_hook_id_ = 0;
  std::vector<std::shared_ptr<LocalRule>> rules_;
};

}  // namespace asc::optim
