#pragma once
// LocalRule: a local learning rule (Hebbian / Oja / homeostatic, docs/firing.md) that runs inside Optimizer::step().
//
// A rule object is shared by the layer that feeds it and the optimizer that runs it. In the forward pass (training
// mode only) the layer hands the rule DETACHED snapshots of what the rule needs (the rule class decides what it
// records, e.g. observe(x, z, f)). Optimizer::step() then, in this order:
//   1. calls prepare() on every rule: the rule checks the optimizer options it depends on AND its snapshot, and
//      throws asc::Error on what it cannot run with — before anything is modified (validate, then commit);
//   2. validates every gradient and asks every rule for a per-row mask of each parameter (row_mask(): bool
//      (size(0),), true = the row may move) from the mode registered with set_mask(param, UpdateMask::{All,
//      Active, Inactive}); Active / Inactive = rows whose neuron fired / did not fire in the snapshot (fired(),
//      decided by the rule, e.g. batch-mean F > 0). The masks of all rules on a parameter are AND-ed. A masked
//      row's gradient update is skipped in the fused kernel: the parameter row and its optimizer state (momentum,
//      exp_avg, ...) stay bit-identical;
//   3. calls pre_update() on every rule (inside NoGradGuard): the rule reads the PRE-step parameters and computes
//      its own update from them, without modifying anything yet;
//   4. runs the ordinary gradient update of every group;
//   5. calls apply() on every rule (inside NoGradGuard): the rule adds the update it computed in pre_update(), in
//      place, to the parameters / buffers it owns (local arithmetic in float32 or better, whatever the model
//      dtype). So the rule's terms and the gradient step form ONE simultaneous update,
//      p <- clip(p + Δp(gradient) + Δp(rule, from the pre-step p)); a rule that computes its terms in apply()
//      instead sees the parameters the optimizer has already moved (a sequential update, which a rule may offer
//      as an option);
//   6. clamps every tensor registered with set_range(t, lo, hi) to [lo, hi];
//   7. calls clear() on every rule: the snapshot is consumed, so a step without a new (training) forward pass —
//      e.g. after an eval-mode forward, which records nothing — leaves the rule's buffers untouched.
// When step() throws (in 1 or 2), no parameter, optimizer state or rule buffer has changed. A rule that rejects its
// own snapshot in prepare() drops it first (it can never become valid; the next training forward records a new one).
// Without a snapshot, fired() is undefined and Active / Inactive masks fall back to "every row moves" (the rule
// has no information); pre_update() and apply() should do nothing.
//
// A rule may also take over a parameter's gradient step (rule B's fuse_sgd folds plain SGD on W into its own
// product): prepare() reads what it needs of the optimizer. Such a rule holds that gradient until the step;
// Optimizer::zero_grad() calls zero_grad() on every rule, which drops it, as zero_grad() drops every .grad.
//
// Sketch of the firing perceptron of docs/firing.md (learning rule B) on this API (a layer with W (P, d), f (P, α),
// buffers SP, r̄, m̄ (P)):
//
//   class FiringRule : public asc::optim::LocalRule {
//    public:
//     FiringRule(Tensor W, Tensor f, Tensor SP, Tensor r_bar, Tensor m_bar, Options o) : ... {
//       set_mask(W, o.mask_w);                      // M_W
//       set_mask(f, o.mask_f);                      // M_f
//       set_range(W, o.w_min, o.w_max);             // clip(W, w_min, w_max) after all updates
//       set_range(f, o.f_min, o.f_max);
//       set_range(SP, o.sp_min, o.sp_max);
//     }
//     // Called by the layer's forward when training: X (B*, d), Z (B*, P), F (B*, P), Y (B*, P, α), detached.
//     void observe(Tensor X, Tensor Z, Tensor F, Tensor Y) { x_ = X; z_ = Z; f_ = F; y_ = Y; }
//     Tensor fired(const Tensor&) const override { return z_.defined() ? active_rows(f_) : Tensor(); }
//     void pre_update() override {                 // the pre-step W: one simultaneous update
//       if (!z_.defined()) return;                  // eval mode: nothing recorded, nothing adapts
//       // Oja on W: dW_ = η_w mean_b F Z (X - Z / Z_ref2 W)   (float32 or better)
//       // Oja on f, homeostatic EMA of r̄, m̄ and the SP update: see docs/firing.md
//     }
//     void apply() override { if (dW_.defined()) W_.add_(dW_); /* ... */ }
//     void clear() override { x_ = z_ = f_ = y_ = dW_ = Tensor(); }
//   };
//
//   auto rule = std::make_shared<FiringRule>(layer->W, layer->f, layer->SP, layer->r_bar, layer->m_bar, opts);
//   asc::optim::Adam opt(model->parameters(), {.lr = 1e-3});
//   opt.add_local_rule(rule);       // step(): Oja + homeostasis from the pre-step W, Adam on unmasked rows, the clips
#include <string>
#include <vector>

#include "core/tensor.h"

namespace asc::optim {

class Optimizer;

// Which rows of a parameter the optimizer's gradient update may move.
enum class UpdateMask { All, Active, Inactive };

class LocalRule {
 public:
  virtual ~LocalRule() = default;

  // ---- what a rule implements ---------------------------------------------------------------------------------
  // A short name for error messages.
  virtual std::string name() const { return "LocalRule"; }
  // Per-row "fired" flags of `param` (bool, (param.size(0),)) from the current snapshot; an undefined tensor
  // when the rule holds no snapshot. Only called for parameters registered with set_mask.
  virtual Tensor fired(const Tensor& /*param*/) const { return {}; }
  // Called at the start of Optimizer::step(), with the gradients' validation, before any tensor is modified: a
  // rule reads the optimizer's options it depends on, validates its snapshot, and throws asc::Error on what it
  // cannot run with (dropping a snapshot it rejects). Must not modify a parameter or buffer.
  virtual void prepare(const Optimizer& /*opt*/) {}
  // Called after every check of step() passed and before the gradient updates (inside NoGradGuard): reads the
  // pre-step parameters and computes the rule's update. Must not modify a parameter or buffer (apply() commits).
  virtual void pre_update() {}
  // The rule's own in-place update, after the gradient updates (called inside NoGradGuard).
  virtual void apply() = 0;
  // Drops the snapshot at the end of Optimizer::step().
  virtual void clear() {}
  // Called by Optimizer::zero_grad(): a rule holding a gradient of its own (rule B's fuse_sgd) drops it.
  virtual void zero_grad() {}

  // ---- registration (by the rule's constructor or the layer) --------------------------------------------------
  // Restricts the gradient update of `param` (dim >= 1) to the rows selected by `mode`. Re-registering replaces.
  void set_mask(const Tensor& param, UpdateMask mode);
  // Clamps `t` (a parameter or buffer, float32/float64) to [lo, hi] at the end of every step. Re-registering
  // replaces the range.
  void set_range(const Tensor& t, double lo, double hi);

  // ---- used by Optimizer ----------------------------------------------------------------------------------------
  // True when set_mask registered `param` with a mode other than All.
  bool masks(const Tensor& param) const;
  // The resolved mask of `param`: bool (param.size(0),), or an undefined tensor when every row may move (mode All,
  // not registered, or no snapshot). Throws asc::Error when fired() returns a tensor of the wrong shape/dtype.
  Tensor row_mask(const Tensor& param) const;
  struct Range {
    Tensor tensor;
    double lo, hi;
  };
  const std::vector<Range>& ranges() const { return ranges_; }

  // Helper for fired(): the rows (last axis) of a gate F (..., P) whose mean over all leading axes is > 0, as bool
  // (P,). For F in {0, 1} this is "the neuron fired at least once in the batch".
  static Tensor active_rows(const Tensor& F);

 private:
  struct MaskEntry {
    Tensor param;
    UpdateMask mode;
  };
  std::vector<MaskEntry> masks_;
  std::vector<Range> ranges_;
};

}  // namespace asc::optim
