#pragma once
// What a firing layer (nn/firing.h) and its local learning rules (optim/firing_rules.h) exchange. nn/ and optim/
// are siblings that include nothing of each other (docs/architecture.md), so the two interfaces they meet through
// live here, below both:
//
//   FiringRuleHost  a layer whose tensors rules act on (nn::FiringLayer): it names its tensors and feeds every rule
//                   attached to it a snapshot of each training-mode forward pass
//   FiringObserver  a rule as the layer sees it (optim::FiringRule): it takes snapshots and drops W's deferred
//                   gradient on zero_grad()
//
// A rule is built from the layer's tensors and attached in one call, beside any optimizer:
//
//   opt.add_local_rule(asc::optim::rule_b(*layer, {.eta_w = 1e-6, .r_target = 0.1, .w_min = -1}));
#include <memory>

#include "core/tensor.h"

namespace asc {

// A training-mode forward pass of a firing layer, detached, batch and time axes flattened into N rows. Exactly one of
// X and tok is defined.
struct FiringSnapshot {
  Tensor X;     // dense (N, d), or (N, d, P) when neuron p reads channel p of its input (stacked layers)
  Tensor tok;   // index path: (N) int64, the columns of W (P, V) looked up
  Tensor Z, F;  // (N, P)
  Tensor f;     // (P, α): the output weights of the forward pass, so the local output Y = F f Z need not be stored
  Tensor SP;    // (P), the thresholds the forward pass compared with
  // With rule B's fuse_sgd: the layer's backward pass leaves dL/dZ (N, P) here instead of forming W's gradient.
  std::shared_ptr<Tensor> dZ;
};

// The tensors of the layer a rule acts on (the layer's own parameters and buffers, updated in place).
struct FiringTensors {
  Tensor W;      // (P, d) or (P, V) (index path)
  Tensor f;      // (P, α)
  Tensor SP;     // (P)
  Tensor r_bar;  // (P) float32/float64 buffer: rule B's EMA of the firing rate
  Tensor m_bar;  // (P): rule B's EMA of the firing margin
  Tensor f_bar;  // (P): rule A's EMA of the firing rate
};

class FiringObserver {
 public:
  virtual ~FiringObserver() = default;
  // After each training-mode forward pass of the layer.
  virtual void observe(FiringSnapshot s) = 0;
  // The layer's zero_grad(): W's gradient deferred to the rule (fuse_sgd) is dropped like every .grad.
  virtual void drop_deferred_gradient() = 0;
  // True while a backward pass's deferred gradient of W waits for the optimizer's step.
  virtual bool holds_deferred_gradient() const = 0;
};

class FiringRuleHost {
 public:
  virtual ~FiringRuleHost() = default;
  virtual FiringTensors firing_tensors() const = 0;
  // Throws asc::Error when a rule of this kind cannot be attached (takes_w_step: it takes W's SGD step itself, rule
  // B's fuse_sgd — a dense FiringLinear only, and one such rule per layer). Checked before the rule is built, and
  // again by attach_rule().
  virtual void check_rule(bool takes_w_step) const = 0;
  virtual void attach_rule(std::shared_ptr<FiringObserver> rule, bool takes_w_step) = 0;
};

}  // namespace asc
