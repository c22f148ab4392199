#pragma once
// The local learning rules of the firing-threshold perceptron (docs/firing.md §4-5) as LocalRules
// (optim/local_rule.h): rule B — backprop + Oja + homeostasis, the final design — and rule A — local only.
//
// A rule is bound to one firing layer's tensors and fed by that layer: in a training-mode forward pass the layer
// hands it a detached snapshot (inputs, Z, F, f, the thresholds); Optimizer::step() then runs the gradient update
// (with the rule's row masks), the rule's apply() and the clips. The rule's running state (r̄, m̄ or F̄) lives in
// buffers of the layer, so it is saved with the model's state_dict and a resumed run continues bit-identically.
// One line beside any optimizer (the layers: nn/firing.h):
//
//   asc::optim::Adam opt(model->parameters(), {.lr = 1e-3});
//   opt.add_local_rule(asc::optim::rule_b(*layer, {.eta_w = 1e-6, .eta_f = 1e-6, .eta_sp = 1e-2, .r_target = 0.1}));
//
// All of a rule's arithmetic runs in float32, or float64 for a float64 layer, whatever the model dtype.
#include <memory>

#include "ops/firing_rule_link.h"
#include "optim/local_rule.h"

namespace asc::optim {

// The snapshot a layer hands its rules and the layer's tensors they act on: ops/firing_rule_link.h.
using asc::FiringSnapshot;
using asc::FiringTensors;

// The rules' shared part: the snapshot, its validation, fired() for the masks, the deferred gradient of fuse_sgd.
class FiringRule : public LocalRule, public FiringObserver {
 public:
  explicit FiringRule(FiringTensors t) : t_(std::move(t)) {}
  void observe(FiringSnapshot s) override { snap_ = std::move(s); }
  bool has_snapshot() const { return snap_.Z.defined(); }
  // Rows of W and f whose neuron fired at least once in the snapshot's batch.
  Tensor fired(const Tensor&) const override { return has_snapshot() ? active_rows(snap_.F) : Tensor(); }
  // Validates the snapshot against the layer's tensors (shapes, dtypes, devices, token range) before step()
  // modifies anything; a snapshot it rejects is dropped (and with it a deferred gradient), then the error thrown.
  void prepare(const Optimizer& opt) override;
  void clear() override { snap_ = FiringSnapshot{}; }
  // Optimizer::zero_grad(): drops W's deferred gradient (fuse_sgd) — it is W's .grad in all but storage. The rest
  // of the snapshot stays: a step then runs the local terms without W's SGD step, like a step without fuse_sgd
  // whose gradients were zeroed.
  void zero_grad() override;
  void drop_deferred_gradient() override { zero_grad(); }
  // True when a backward pass left W's deferred gradient (fuse_sgd) that no step or zero_grad() has used yet.
  bool holds_deferred_gradient() const override { return snap_.dZ && snap_.dZ->defined(); }

 protected:
  FiringTensors t_;
  FiringSnapshot snap_;
};

// Rule B (docs/firing.md §4). The backprop part is the optimizer's step on W and f, restricted to the rows mask_w /
// mask_f allow; the rule adds, with means over the N rows of the snapshot, ONE simultaneous update: its terms read
// the pre-step W, f (and the forward's SP), computed in pre_update() before the optimizer moves anything:
//   W_p    += η_w mean_b F (Z X_b − Z² / Z_ref2 · W_p)          (index path: only column tok_b, with X = 1)
//   f[p,g] += η_f mean_b F (Y Z − Y² / Y_ref2 · f[p,g])
//   r̄ ← (1 − β_r) r̄ + β_r mean_b F,   m̄ ← (1 − β_m) m̄ + β_m mean_b F max(0, (Z − SP) / (Z_ref + ε_Z))
//   SP += η_SP (λ_r (r̄ − r*) + λ_m (m̄ − m*))
// then the clips W ∈ [w_min, w_max], f ∈ [f_min, f_max], SP ∈ [sp_min, sp_max]. Z_ref2 = Z_ref² + ε_Z,
// Y_ref2 = Y_ref² + ε_Y. The f term uses Y = F f' Z (f' the forward's f): mean_b F (Y Z − Y² / Y_ref2 · f) =
// mean_b F Z² · (f' − f'² f / Y_ref2), one pass over (N, P) instead of (N, P, α). With `sequential`, the terms are
// computed after the gradient step instead, from the W and f the optimizer has just moved (the framework's
// behaviour before the simultaneous form; it differs at second order, η_bp · η_w).
//
// The rule's clip range must hold the layer when the rule is attached: a W or f outside [w_min, w_max],
// [f_min, f_max] is an error (the first step would clip it; the default range [0, 1] and a
// layer's default signed initialisation would lose half the weights), naming both fixes: a signed range (w_min =
// −w_max) or the layer's non-negative initialisation (nn::FiringOptions::init(nn::FiringInit::NonNegative)).
//
// fuse_sgd (FiringLinear, dense input; the optimizer plain SGD on W: momentum 0): the rule takes W's SGD step
// itself. W's gradient dZᵀ X and the Oja product (F Z)ᵀ X read the same X, so with c = η_w/N Σ F Z² / Z_ref2, m the
// rows mask_w lets move, lr and wd the optimizer's for W:
//   W <- (1 − c − lr wd m) W + (η_w/N F Z − lr m dZ)ᵀ X                    (simultaneous, the default)
//   W <- (1 − c)(1 − lr wd m) W + (η_w/N F Z − lr (1 − c) m dZ)ᵀ X          (sequential: SGD, then Oja)
// is the SGD step together with the Oja term, one GEMM instead of two. The layer's backward then leaves dL/dZ in
// the snapshot and W.grad undefined: W's gradient is not seen by gradient clipping or DistributedDataParallel, and
// a second training forward before step() (gradient accumulation) is refused. The deferred gradient is W's .grad in
// all but storage: Optimizer::zero_grad() and Module::zero_grad() of a module holding the layer drop it, and a
// step() after them runs the local terms without W's SGD step.
struct RuleBOptions {
  // The Oja rates' default is the largest rate that measurably does no harm (docs/firing.md, experiment 7): at 1e-3
  // the Oja terms pull every neuron of the layer onto one direction, and a network lost 40 points of accuracy.
  double eta_w = 1e-6, eta_f = 1e-6, eta_sp = 1e-2;
  double z_ref = 1.0, y_ref = 1.0, eps_z = 1e-6, eps_y = 1e-6;
  double beta_r = 0.1, beta_m = 0.1;
  double r_target = 0.1, m_target = 0.1, lambda_r = 1.0, lambda_m = 0.0;
  double w_min = 0.0, w_max = 1.0, f_min = 0.0, f_max = 1.0;  // signed weights: w_min = -w_max, f_min = -f_max
  double sp_min = -1e9, sp_max = 1e9;
  UpdateMask mask_w = UpdateMask::All, mask_f = UpdateMask::All;  // rows the backprop update may move
  bool fuse_sgd = false;                                          // fold W's SGD step into the Oja product (above)
  bool sequential = false;  // the local terms from the post-step W and f (above); default: the pre-step ones
};

class FiringRuleB : public FiringRule {
 public:
  FiringRuleB(FiringTensors t, RuleBOptions o);
  std::string name() const override { return "FiringRuleB"; }
  void prepare(const Optimizer& opt) override;
  void pre_update() override;
  void apply() override;
  void clear() override;
  const RuleBOptions& options() const { return o_; }

 private:
  void apply_sequential();
  RuleBOptions o_;
  double lr_w_ = 0, wd_w_ = 0;  // fuse_sgd: the optimizer's lr and weight decay for W, read by prepare()
  bool w_moves_ = true;  // whether this step's gradient update moves W (prepare()): W in the optimizer with a .grad
  // What pre_update() computed from the pre-step tensors, added by apply(). W: either dW (added), or keep and coef
  // (W <- keep ∘ W + coefᵀ X in place, exact when nothing else moves W in between: fuse_sgd, or W without a .grad).
  struct Staged {
    bool ready = false;
    Tensor dW, keep, coef, df, r_bar, m_bar, dSP;
  } st_;
};

// Rule A (docs/firing.md §5), local only: pair it with an optimizer over no gradient (or lr 0). With means over
// the N rows of the snapshot and [u]_+ = max(u, 0), from the pre-step W and f (like rule B, one simultaneous update
// with whatever the optimizer does):
//   W_p    += η₊ mean_b [Z − SP]_+ X_b ⊙ (1 − W_p / w_max) − η₋ mean_b [SP − Z]_+ X_b ⊙ W_p / w_max   (index: X = 1
//             on column tok_b)
//   f[p,g] += ρ₊ mean_b F Z / Z_max · (1 − f / f_max) − ρ₋ mean_b (1 − F) · f / f_max
//   F̄ ← (1 − β) F̄ + β mean_b F,   SP += η_SP (F̄ − r*)
// then W ∈ [0, w_max], f ∈ [0, f_max], SP ∈ [sp_min, sp_max]; attaching it to a layer whose W or f lie outside
// these ranges is an error (the fix: the layer's non-negative initialisation, and w_max, f_max that hold the layer).
struct RuleAOptions {
  double eta_plus = 1e-2, eta_minus = 1e-2, rho_plus = 1e-2, rho_minus = 1e-2, eta_sp = 1e-2;
  double z_max = 1.0, w_max = 1.0, f_max = 1.0, beta = 0.1, r_target = 0.1;
  double sp_min = -1e9, sp_max = 1e9;
};

class FiringRuleA : public FiringRule {
 public:
  FiringRuleA(FiringTensors t, RuleAOptions o);
  std::string name() const override { return "FiringRuleA"; }
  void pre_update() override;
  void apply() override;
  void clear() override;
  const RuleAOptions& options() const { return o_; }

 private:
  RuleAOptions o_;
  struct Staged {
    bool ready = false;
    Tensor dW, df, f_bar, dSP;
  } st_;
};

// Rule B / A built from a firing layer's tensors (nn::FiringLinear, nn::FiringEmbedding, or any FiringRuleHost) and
// attached to it: it receives a snapshot from every training-mode forward pass of the layer. Hand the result to an
// optimizer's add_local_rule(). A rule whose options or range do not hold the layer is refused (asc::Error) and
// nothing is attached.
std::shared_ptr<FiringRuleB> rule_b(FiringRuleHost& layer, const RuleBOptions& o = {});
std::shared_ptr<FiringRuleA> rule_a(FiringRuleHost& layer, const RuleAOptions& o = {});

}  // namespace asc::optim
