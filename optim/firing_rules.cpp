// The firing perceptron's learning rules (optim/firing_rules.h): each term of docs/firing.md §4-5 as a line of
// tensor arithmetic on the snapshot, in float32 (float64 for a float64 layer), inside Optimizer::step(). Rule B's
// passes over the (N, P) batch are fused ops of ops/firing.h: the per-neuron sums (firing_batch_sums), the weight
// update's coefficients (firing_rule_b_coef) and the update itself (firing_weight_update_).
#include "optim/firing_rules.h"

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "core/format.h"
#include "ops/firing.h"
#include "ops/ops.h"
#include "optim/optimizer.h"

namespace asc::optim {

namespace {

// The rules' arithmetic type: float64 for a float64 layer, else float32.
DType acc_of(const Tensor& W) { return W.dtype() == kFloat64 ? kFloat64 : kFloat32; }

void check_tensors(const char* rule, const FiringTensors& t, bool rule_b) {
  ASC_CHECK(t.W.defined() && t.f.defined() && t.SP.defined() && t.W.dim() == 2 && t.f.dim() == 2 &&
                t.SP.dim() == 1,
            "{}: needs W (P, d), f (P, alpha) and SP (P)", rule);
  const int64_t P = t.W.size(0);
  ASC_CHECK(t.f.size(0) == P && t.SP.size(0) == P, "{}: W {}, f {} and SP {} disagree on the number of neurons", rule,
            t.W.shape(), t.f.shape(), t.SP.shape());
  auto check_state = [&](const Tensor& b) {
    ASC_CHECK(b.defined() && b.dim() == 1 && b.size(0) == P, "{}: its state buffers must be ({}) tensors", rule, P);
  };
  if (rule_b) {
    check_state(t.r_bar);
    check_state(t.m_bar);
  } else {
    check_state(t.f_bar);
  }
}

// Σ_b coef[b, p] x_b(p) for each neuron p, where x_b(p) is what neuron p read in row b: X_b (dense), X[b, :, p]
// (channels), or the one-hot column tok_b of W (index path). coef (N, P) -> (P, d) or (P, V).
Tensor input_sum(const FiringSnapshot& s, const Tensor& coef, const Tensor& W) {
  const int64_t N = coef.size(0), P = coef.size(1);
  if (s.tok.defined()) {
    Tensor idx = s.tok.view({1, N}).expand({P, N}).contiguous();
    return scatter_add(zeros(W.shape(), {coef.dtype(), coef.device()}), 1, idx, coef.t().contiguous());
  }
  const Tensor X = s.X.to(coef.dtype());
  if (X.dim() == 3) return sum(X * coef.view({N, 1, P}), {0}).t().contiguous();  // (d, P) -> (P, d)
  return matmul(coef.t(), X);
}

void check_snapshot(const char* rule, const FiringSnapshot& s, const FiringTensors& t) {
  const int64_t P = t.W.size(0);
  ASC_CHECK(s.Z.dim() == 2 && s.Z.size(1) == P && s.F.shape() == s.Z.shape() && s.SP.numel() == P &&
                s.f.shape() == t.f.shape(),
            "{}: snapshot Z {}, F {}, f {}, SP {} do not match {} neurons with {} outputs", rule, s.Z.shape(),
            s.F.shape(), s.f.shape(), s.SP.shape(), P, t.f.size(1));
  ASC_CHECK(s.X.defined() != s.tok.defined(), "{}: the snapshot needs exactly one of X and tok", rule);
}

}  // namespace

FiringRuleB::FiringRuleB(FiringTensors t, RuleBOptions o) : FiringRule(std::move(t)), o_(o) {
  check_tensors("FiringRuleB", t_, true);
  ASC_CHECK(o.eta_w >= 0 && o.eta_f >= 0 && o.eta_sp >= 0 && o.lambda_r >= 0 && o.lambda_m >= 0,
            "FiringRuleB: learning rates and lambdas must be >= 0 (eta_w {}, eta_f {}, eta_sp {}, lambda_r {}, "
            "lambda_m {})", o.eta_w, o.eta_f, o.eta_sp, o.lambda_r, o.lambda_m);
  ASC_CHECK(o.z_ref > 0 && o.y_ref > 0 && o.eps_z > 0 && o.eps_y > 0,
            "FiringRuleB: z_ref, y_ref, eps_z, eps_y must be > 0 (got {}, {}, {}, {})", o.z_ref, o.y_ref, o.eps_z,
            o.eps_y);
  ASC_CHECK(o.beta_r > 0 && o.beta_r <= 1 && o.beta_m > 0 && o.beta_m <= 1,
            "FiringRuleB: beta_r {} and beta_m {} must lie in (0, 1]", o.beta_r, o.beta_m);
  ASC_CHECK(o.r_target >= 0 && o.r_target <= 1 && o.m_target >= 0 && o.m_target <= 1,
            "FiringRuleB: r_target {} and m_target {} must lie in [0, 1]", o.r_target, o.m_target);
  ASC_CHECK(o.w_min <= o.w_max && o.f_min <= o.f_max && o.sp_min < o.sp_max,
            "FiringRuleB: needs w_min <= w_max ({}, {}), f_min <= f_max ({}, {}), sp_min < sp_max ({}, {})", o.w_min,
            o.w_max, o.f_min, o.f_max, o.sp_min, o.sp_max);
  set_mask(t_.W, o.mask_w);
  set_mask(t_.f, o.mask_f);
  set_range(t_.W, o.w_min, o.w_max);
  set_range(t_.f, o.f_min, o.f_max);
  set_range(t_.SP, o.sp_min, o.sp_max);
}

void FiringRuleB::prepare(const Optimizer& opt) {
  if (!o_.fuse_sgd) return;
  const int64_t g = opt.group_of(t_.W);
  ASC_CHECK(g >= 0, "FiringRuleB (fuse_sgd): W {} is not a parameter of the {} optimizer the rule is attached to; "
            "fuse_sgd takes that optimizer's SGD step on W", t_.W.shape(), opt.name());
  ASC_CHECK(opt.name() == "SGD" && opt.option(g, "momentum") == 0,
            "FiringRuleB (fuse_sgd): folds plain SGD (momentum 0) on W into its Oja product; W is in a {} group{}. "
            "Use fuse_sgd = false with this optimizer", opt.name(),
            opt.name() == "SGD" ? fmt::format(" with momentum {}", opt.option(g, "momentum")) : std::string());
  for (const auto& rule : opt.local_rules())
    ASC_CHECK(rule.get() == this || !rule->masks(t_.W),
              "FiringRuleB (fuse_sgd): rule '{}' also masks W's update; fuse_sgd applies only its own mask_w",
              rule->name());
  ASC_CHECK(!(holds_deferred_gradient() && t_.W.grad().defined()),
            "FiringRuleB (fuse_sgd): W {} has a .grad besides the gradient the layer deferred to the rule (W was used "
            "outside the layer's forward); its SGD step would be taken twice", t_.W.shape());
  lr_w_ = opt.lr(static_cast<size_t>(g));
  wd_w_ = opt.option(static_cast<size_t>(g), "weight_decay");
}

void FiringRuleB::apply() {
  if (!has_snapshot()) return;  // eval-mode forward or no forward: nothing adapts
  check_snapshot("FiringRuleB", snap_, t_);
  const int64_t N = snap_.Z.size(0), P = t_.W.size(0);
  if (N == 0) return;
  NoGradGuard ng;
  const DType acc = acc_of(t_.W);
  const Tensor Z = snap_.Z.to(acc), F = snap_.F.to(acc), SP0 = snap_.SP.to(acc);
  const Tensor W = t_.W.to(acc), f = t_.f.to(acc);
  const double z_ref2 = o_.z_ref * o_.z_ref + o_.eps_z, y_ref2 = o_.y_ref * o_.y_ref + o_.eps_y;
  // One pass over the batch: Σ_b F Z², Σ_b F, Σ_b F max(0, Z − SP) per neuron.
  const FiringBatchSums sums = firing_batch_sums(Z, F, SP0);
  const Tensor sum_FZ2 = sums.fz2.view({P, 1});  // (P, 1)
  // Oja on W: η_w mean_b F (Z x_b − Z² / Z_ref2 · W_p); on the index path x_b is the one-hot column tok_b, so the
  // decay too acts on that column only.
  if (snap_.tok.defined()) {
    const Tensor FZ = F * Z, FZ2 = FZ * Z;               // (N, P)
    const Tensor Wcols = index_select(W, 1, snap_.tok);  // (P, N): W[p, tok_b]
    t_.W.copy_(W + input_sum(snap_, FZ - FZ2 / z_ref2 * Wcols.t(), W) * (o_.eta_w / N));
  } else {
    // W (1 − η_w / N · Σ F Z² / Z_ref2) + η_w / N · Σ_b F Z x_b: one pass over W besides the product.
    Tensor keep = 1.0 - sum_FZ2 * (o_.eta_w / (N * z_ref2));  // (P, 1)
    Tensor coef;                                               // (N, P)
    if (holds_deferred_gradient()) {
      // fuse_sgd: W's SGD step folded into the same product (header): k (1 − lr wd m) W + (η_w/N F Z − lr k m dZ)ᵀ X.
      const Tensor mask = row_mask(t_.W);  // bool (P) or undefined: every row moves
      const Tensor m = mask.defined() ? mask.to(acc).view({P, 1}) : ones({P, 1}, {acc, W.device()});
      coef = firing_rule_b_coef(Z, F, o_.eta_w / N, snap_.dZ->to(acc), (keep * m * lr_w_).view({P}));
      keep = keep * (1.0 - m * (lr_w_ * wd_w_));
    } else {
      coef = firing_rule_b_coef(Z, F, o_.eta_w / N);
    }
    if (snap_.X.dim() == 2) {
      // One op: W <- keep ∘ W + coefᵀ X, which skips the zero coefficients of silent neurons on the CPU.
      const Tensor X = snap_.X.to(acc);
      if (t_.W.dtype() == acc) {
        firing_weight_update_(t_.W, keep.view({P}), coef, X);
      } else {  // a bf16/f16 layer: update W's float32 copy (not read again below), then round into W
        Tensor Wa = W;
        firing_weight_update_(Wa, keep.view({P}), coef, X);
        t_.W.copy_(Wa);
      }
    } else {  // channels: X (N, d, P)
      t_.W.copy_(W * keep + input_sum(snap_, coef, W));
    }
  }
  // Oja on f: η_f mean_b F (Y Z − Y² / Y_ref2 · f) with Y = F f' Z: η_f / N · Σ_b F Z² · (f' − f'² f / Y_ref2).
  const Tensor f_fwd = snap_.f.to(acc);
  t_.f.copy_(f + sum_FZ2 * (f_fwd - f_fwd * f_fwd * f / y_ref2) * (o_.eta_f / N));
  // Homeostasis: EMAs of the firing rate and margin, then the threshold.
  const Tensor r_t = sums.fired / static_cast<double>(N);
  const Tensor m_t = sums.margin / (static_cast<double>(N) * (o_.z_ref + o_.eps_z));
  const Tensor r_bar = t_.r_bar.to(acc) * (1 - o_.beta_r) + r_t * o_.beta_r;
  const Tensor m_bar = t_.m_bar.to(acc) * (1 - o_.beta_m) + m_t * o_.beta_m;
  t_.r_bar.copy_(r_bar);
  t_.m_bar.copy_(m_bar);
  const Tensor push = (r_bar - o_.r_target) * o_.lambda_r + (m_bar - o_.m_target) * o_.lambda_m;
  t_.SP.copy_(t_.SP.to(acc) + push * o_.eta_sp);
}

FiringRuleA::FiringRuleA(FiringTensors t, RuleAOptions o) : FiringRule(std::move(t)), o_(o) {
  check_tensors("FiringRuleA", t_, false);
  ASC_CHECK(o.eta_plus >= 0 && o.eta_minus >= 0 && o.rho_plus >= 0 && o.rho_minus >= 0 && o.eta_sp >= 0,
            "FiringRuleA: learning rates must be >= 0 (eta_plus {}, eta_minus {}, rho_plus {}, rho_minus {}, "
            "eta_sp {})", o.eta_plus, o.eta_minus, o.rho_plus, o.rho_minus, o.eta_sp);
  ASC_CHECK(o.z_max > 0 && o.w_max > 0 && o.f_max > 0, "FiringRuleA: z_max {}, w_max {}, f_max {} must be > 0",
            o.z_max, o.w_max, o.f_max);
  ASC_CHECK(o.beta > 0 && o.beta <= 1 && o.r_target >= 0 && o.r_target <= 1 && o.sp_min < o.sp_max,
            "FiringRuleA: needs beta in (0, 1] (got {}), r_target in [0, 1] (got {}), sp_min < sp_max ({}, {})",
            o.beta, o.r_target, o.sp_min, o.sp_max);
  set_range(t_.W, 0.0, o.w_max);
  set_range(t_.f, 0.0, o.f_max);
  set_range(t_.SP, o.sp_min, o.sp_max);
}

void FiringRuleA::apply() {
  if (!has_snapshot()) return;
  check_snapshot("FiringRuleA", snap_, t_);
  const int64_t N = snap_.Z.size(0), P = t_.W.size(0);
  if (N == 0) return;
  NoGradGuard ng;
  const DType acc = acc_of(t_.W);
  const Tensor Z = snap_.Z.to(acc), F = snap_.F.to(acc), SP0 = snap_.SP.to(acc).view({1, P});
  const Tensor W = t_.W.to(acc), f = t_.f.to(acc);
  // Potentiation on a firing margin, depression on a missing one, soft-bounded by W / w_max.
  const Tensor pot = input_sum(snap_, relu(Z - SP0), W) / static_cast<double>(N);
  const Tensor dep = input_sum(snap_, relu(SP0 - Z), W) / static_cast<double>(N);
  t_.W.copy_(W + pot * (1.0 - W / o_.w_max) * o_.eta_plus - dep * (W / o_.w_max) * o_.eta_minus);
  // Output weights grow while the neuron fires, decay while it is silent.
  const Tensor grow = mean(F * Z, {0}).view({P, 1}) / o_.z_max, silent = mean(1.0 - F, {0}).view({P, 1});
  t_.f.copy_(f + grow * (1.0 - f / o_.f_max) * o_.rho_plus - silent * (f / o_.f_max) * o_.rho_minus);
  // The threshold follows the firing rate's EMA towards r*.
  const Tensor f_bar = t_.f_bar.to(acc) * (1 - o_.beta) + mean(F, {0}) * o_.beta;
  t_.f_bar.copy_(f_bar);
  t_.SP.copy_(t_.SP.to(acc) + (f_bar - o_.r_target) * o_.eta_sp);
}

}  // namespace asc::optim
