// The firing perceptron's learning rules (optim/firing_rules.h): each term of docs/firing.md §4-5 as a line of
// tensor arithmetic on the snapshot, in float32 (float64 for a float64 layer), inside Optimizer::step(). Rule B's
// passes over the (N, P) batch are fused ops of ops/firing.h: the per-neuron sums (firing_batch_sums), the weight
// update's coefficients (firing_rule_b_coef) and the update itself (firing_weight_update_).
#include "optim/firing_rules.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <utility>

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
  ASC_CHECK(t.W.defined() && t.f.defined() && t.SP.defined() && t.W.dim() == 2 && t.f.dim() == 2 && t.SP.dim() == 1,
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

// Every option is a finite number: an infinite rate or bound turns the first step's arithmetic into Inf − Inf =
// NaN (eta_w = +inf makes W NaN), a NaN one makes every comparison below false.
void check_finite(const char* rule, std::initializer_list<std::pair<const char*, double>> options) {
  for (const auto& [name, v] : options)
    ASC_CHECK(std::isfinite(v), "{}: option {} must be a finite number, got {}", rule, name, v);
}

// The layer's W and f must lie in the rule's clip range when it is attached: the first step would otherwise clip them
// silently (a layer with signed weights under the default range [0, w_max] loses half of them to 0). NaN entries
// are not "outside": they stay NaN, visible, as NaN input does everywhere. (SP is not checked: its range, ±1e9 by
// default, is a bound the user sets for the homeostasis, and a threshold outside it is moved into it on purpose.)
void check_in_range(const char* rule, const char* what, const Tensor& t, double lo, double hi, const std::string& fix) {
  if (t.numel() == 0) return;
  NoGradGuard ng;
  const Tensor v = t.detach().to(kFloat64);
  const int64_t outside = sum(logical_or(lt(v, lo), gt(v, hi)).to(kInt64)).item<int64_t>();
  if (outside == 0) return;
  ASC_THROW(
      "{}: {} of the {} entries of the layer's {} lie outside the rule's clip range [{}, {}] (they span [{}, "
      "{}]); the first step would clip them. {}",
      rule, outside, t.numel(), what, lo, hi, amin(v).item<double>(), amax(v).item<double>(), fix);
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

bool is_float(DType dt) { return dt == kFloat32 || dt == kFloat64 || dt == kBFloat16 || dt == kFloat16; }

// Everything the rules read from a snapshot, against the layer's tensors: called by prepare(), before step()
// modifies anything, so a bad snapshot (handed to observe() by hand, or stale after the layer changed) fails there.
void check_snapshot(const std::string& rule, const FiringSnapshot& s, const FiringTensors& t) {
  const int64_t P = t.W.size(0), cols = t.W.size(1);
  auto desc = [](const Tensor& x) {
    return x.defined() ? fmt::format("{} {} on {}", x.dtype(), x.shape(), x.device()) : std::string("undefined");
  };
  ASC_CHECK(s.Z.defined() && s.F.defined() && s.f.defined() && s.SP.defined(),
            "{}: the snapshot needs Z, F, f and SP; got Z {}, F {}, f {}, SP {}", rule, desc(s.Z), desc(s.F), desc(s.f),
            desc(s.SP));
  ASC_CHECK(s.Z.dim() == 2 && s.Z.size(1) == P && s.F.shape() == s.Z.shape() && s.SP.dim() == 1 && s.SP.size(0) == P &&
                s.f.shape() == t.f.shape(),
            "{}: snapshot Z {}, F {}, f {}, SP {} do not match {} neurons with {} outputs", rule, s.Z.shape(),
            s.F.shape(), s.f.shape(), s.SP.shape(), P, t.f.size(1));
  ASC_CHECK(is_float(s.Z.dtype()) && s.F.dtype() == s.Z.dtype() && is_float(s.f.dtype()) && is_float(s.SP.dtype()),
            "{}: snapshot Z, F, f and SP must be floating (Z and F of one dtype); got {}, {}, {}, {}", rule,
            s.Z.dtype(), s.F.dtype(), s.f.dtype(), s.SP.dtype());
  ASC_CHECK(s.X.defined() != s.tok.defined(), "{}: the snapshot needs exactly one of X and tok", rule);
  const int64_t N = s.Z.size(0);
  const Device dev = t.W.device();
  if (s.X.defined()) {
    const bool ok = (s.X.dim() == 2 || (s.X.dim() == 3 && s.X.size(2) == P)) && is_float(s.X.dtype()) &&
                    s.X.size(0) == N && s.X.size(1) == cols;
    ASC_CHECK(ok, "{}: snapshot X must be floating ({}, {}) or ({}, {}, {}) for W {}; got {}", rule, N, cols, N, cols,
              P, t.W.shape(), desc(s.X));
  } else {
    ASC_CHECK(s.tok.dtype() == kInt64 && s.tok.dim() == 1 && s.tok.size(0) == N,
              "{}: snapshot tok must be int64 ({}); got {}", rule, N, desc(s.tok));
    if (N > 0) {
      const int64_t lo = amin(s.tok).item<int64_t>(), hi = amax(s.tok).item<int64_t>();
      ASC_CHECK(lo >= 0 && hi < cols, "{}: snapshot token {} out of range [0, {}) (the columns of W {})", rule,
                lo < 0 ? lo : hi, cols, t.W.shape());
    }
  }
  if (s.dZ && s.dZ->defined())
    ASC_CHECK(s.dZ->shape() == s.Z.shape() && is_float(s.dZ->dtype()),
              "{}: the deferred gradient dL/dZ is {}, expected floating {}", rule, desc(*s.dZ), s.Z.shape());
  for (const Tensor* x : std::initializer_list<const Tensor*>{&s.Z, &s.F, &s.f, &s.SP, &s.X, &s.tok, s.dZ.get()})
    if (x && x->defined())
      ASC_CHECK(x->device() == dev, "{}: snapshot tensor {} is on {} but the layer's W is on {}", rule, x->shape(),
                x->device(), dev);
}

}  // namespace

// ---- FiringRule ----------------------------------------------------------------------------------------------

void FiringRule::prepare(const Optimizer&) {
  if (!has_snapshot() && !snap_.X.defined() && !snap_.tok.defined() && !holds_deferred_gradient()) return;
  try {
    check_snapshot(name(), snap_, t_);
  } catch (...) {
    clear();  // it can never become valid: drop it, so the next training forward starts afresh
    throw;
  }
}

void FiringRule::zero_grad() {
  if (snap_.dZ) *snap_.dZ = Tensor();  // the layer's backward node keeps the same slot: a later backward refills it
}

// ---- rule B ----------------------------------------------------------------------------------------------------

FiringRuleB::FiringRuleB(FiringTensors t, RuleBOptions o) : FiringRule(std::move(t)), o_(o) {
  check_tensors("FiringRuleB", t_, true);
  check_finite("FiringRuleB", {{"eta_w", o.eta_w},
                               {"eta_f", o.eta_f},
                               {"eta_sp", o.eta_sp},
                               {"z_ref", o.z_ref},
                               {"y_ref", o.y_ref},
                               {"eps_z", o.eps_z},
                               {"eps_y", o.eps_y},
                               {"beta_r", o.beta_r},
                               {"beta_m", o.beta_m},
                               {"r_target", o.r_target},
                               {"m_target", o.m_target},
                               {"lambda_r", o.lambda_r},
                               {"lambda_m", o.lambda_m},
                               {"w_min", o.w_min},
                               {"w_max", o.w_max},
                               {"f_min", o.f_min},
                               {"f_max", o.f_max},
                               {"sp_min", o.sp_min},
                               {"sp_max", o.sp_max}});
  ASC_CHECK(o.eta_w >= 0 && o.eta_f >= 0 && o.eta_sp >= 0 && o.lambda_r >= 0 && o.lambda_m >= 0,
            "FiringRuleB: learning rates and lambdas must be >= 0 (eta_w {}, eta_f {}, eta_sp {}, lambda_r {}, "
            "lambda_m {})",
            o.eta_w, o.eta_f, o.eta_sp, o.lambda_r, o.lambda_m);
  ASC_CHECK(o.z_ref > 0 && o.y_ref > 0 && o.eps_z > 0 && o.eps_y > 0,
            "FiringRuleB: z_ref, y_ref, eps_z, eps_y must be > 0 (got {}, {}, {}, {})", o.z_ref, o.y_ref, o.eps_z,
            o.eps_y);
  ASC_CHECK(std::isfinite(o.z_ref * o.z_ref + o.eps_z) && std::isfinite(o.y_ref * o.y_ref + o.eps_y),
            "FiringRuleB: z_ref^2 + eps_z and y_ref^2 + eps_y must be finite (z_ref {}, y_ref {}): the Oja decay "
            "divides by them",
            o.z_ref, o.y_ref);
  ASC_CHECK(o.beta_r > 0 && o.beta_r <= 1 && o.beta_m > 0 && o.beta_m <= 1,
            "FiringRuleB: beta_r {} and beta_m {} must lie in (0, 1]", o.beta_r, o.beta_m);
  ASC_CHECK(o.r_target >= 0 && o.r_target <= 1 && o.m_target >= 0 && o.m_target <= 1,
            "FiringRuleB: r_target {} and m_target {} must lie in [0, 1]", o.r_target, o.m_target);
  ASC_CHECK(o.w_min <= o.w_max && o.f_min <= o.f_max && o.sp_min < o.sp_max,
            "FiringRuleB: needs w_min <= w_max ({}, {}), f_min <= f_max ({}, {}), sp_min < sp_max ({}, {})", o.w_min,
            o.w_max, o.f_min, o.f_max, o.sp_min, o.sp_max);
  check_in_range("FiringRuleB", "W", t_.W, o.w_min, o.w_max,
                 fmt::format("Either give the rule a signed range (w_min = -w_max, e.g. .w_min = {}, .w_max = {}) or "
                             "build the layer with non-negative weights (nn::FiringOptions::init(nn::FiringInit::"
                             "NonNegative)) and a w_max that holds them",
                             -std::abs(o.w_max), std::abs(o.w_max)));
  check_in_range("FiringRuleB", "output weights f", t_.f, o.f_min, o.f_max,
                 fmt::format("Either give the rule a signed range (f_min = -f_max, e.g. .f_min = {}, .f_max = {}) or "
                             "one that holds the layer's f (a layer's f starts at 1: f_min <= 1 <= f_max)",
                             -std::max(1.0, std::abs(o.f_max)), std::max(1.0, std::abs(o.f_max))));
  set_mask(t_.W, o.mask_w);
  set_mask(t_.f, o.mask_f);
  set_range(t_.W, o.w_min, o.w_max);
  set_range(t_.f, o.f_min, o.f_max);
  set_range(t_.SP, o.sp_min, o.sp_max);
}

void FiringRuleB::prepare(const Optimizer& opt) {
  FiringRule::prepare(opt);
  const int64_t g = opt.group_of(t_.W);
  w_moves_ = g >= 0 && t_.W.grad().defined();
  if (!o_.fuse_sgd) return;
  ASC_CHECK(g >= 0,
            "FiringRuleB (fuse_sgd): W {} is not a parameter of the {} optimizer the rule is attached to; "
            "fuse_sgd takes that optimizer's SGD step on W",
            t_.W.shape(), opt.name());
  ASC_CHECK(opt.name() == "SGD" && opt.option(g, "momentum") == 0,
            "FiringRuleB (fuse_sgd): folds plain SGD (momentum 0) on W into its Oja product; W is in a {} group{}. "
            "Use fuse_sgd = false with this optimizer",
            opt.name(),
            opt.name() == "SGD" ? fmt::format(" with momentum {}", opt.option(g, "momentum")) : std::string());
  for (const auto& rule : opt.local_rules())
    ASC_CHECK(rule.get() == this || !rule->masks(t_.W),
              "FiringRuleB (fuse_sgd): rule '{}' also masks W's update; fuse_sgd applies only its own mask_w",
              rule->name());
  ASC_CHECK(!(holds_deferred_gradient() && t_.W.grad().defined()),
            "FiringRuleB (fuse_sgd): W {} has a .grad besides the gradient the layer deferred to the rule (W was used "
            "outside the layer's forward); its SGD step would be taken twice",
            t_.W.shape());
  lr_w_ = opt.lr(static_cast<size_t>(g));
  wd_w_ = opt.option(static_cast<size_t>(g), "weight_decay");
}

void FiringRuleB::clear() {
  FiringRule::clear();
  st_ = Staged{};
}

// The simultaneous update's terms, from the pre-step W, f and the snapshot; nothing is written here.
void FiringRuleB::pre_update() {
  st_ = Staged{};
  if (o_.sequential || !has_snapshot()) return;
  const int64_t N = snap_.Z.size(0), P = t_.W.size(0);
  NoGradGuard ng;
  const DType acc = acc_of(t_.W);
  const bool fused = holds_deferred_gradient();
  if (N == 0) {
    // An empty batch: no local terms, no observation for the EMAs; the fused SGD step is its weight decay alone.
    if (fused && lr_w_ * wd_w_ != 0) {
      const Tensor mask = row_mask(t_.W);
      const Tensor m = mask.defined() ? mask.to(acc) : ones({P}, {acc, t_.W.device()});
      st_.keep = 1.0 - m * (lr_w_ * wd_w_);
    }
    st_.ready = true;
    return;
  }
  const Tensor Z = snap_.Z.to(acc), F = snap_.F.to(acc), SP0 = snap_.SP.to(acc);
  const Tensor W = t_.W.to(acc), f = t_.f.to(acc);
  const double z_ref2 = o_.z_ref * o_.z_ref + o_.eps_z, y_ref2 = o_.y_ref * o_.y_ref + o_.eps_y;
  // One pass over the batch: Σ_b F Z², Σ_b F, Σ_b F max(0, Z − SP) per neuron.
  const FiringBatchSums sums = firing_batch_sums(Z, F, SP0);
  const Tensor c = sums.fz2 * (o_.eta_w / (N * z_ref2));  // (P): the Oja decay's rate, c_p = η_w/N Σ_b F Z² / Z_ref2
  // Oja on W: η_w mean_b F (Z x_b − Z² / Z_ref2 · W_p), W the pre-step W.
  if (snap_.tok.defined()) {
    // Index path: x_b is the one-hot column tok_b, so the decay too acts on that column only.
    const Tensor FZ = F * Z, FZ2 = FZ * Z;               // (N, P)
    const Tensor Wcols = index_select(W, 1, snap_.tok);  // (P, N): W[p, tok_b]
    st_.dW = input_sum(snap_, FZ - FZ2 / z_ref2 * Wcols.t(), W) * (o_.eta_w / N);
  } else if (fused) {
    // W's SGD step and the Oja term from the same pre-step W, one product: W <- (1 − c − lr wd m) W +
    // (η_w/N F Z − lr m dZ)ᵀ X. Nothing else moves W before apply() (its gradient is here, not in W.grad).
    const Tensor mask = row_mask(t_.W);  // bool (P) or undefined: every row moves
    const Tensor m = mask.defined() ? mask.to(acc) : ones({P}, {acc, W.device()});
    st_.coef = firing_rule_b_coef(Z, F, o_.eta_w / N, snap_.dZ->to(acc), m * lr_w_);
    st_.keep = 1.0 - c - m * (lr_w_ * wd_w_);
  } else {
    const Tensor coef = firing_rule_b_coef(Z, F, o_.eta_w / N);  // (N, P): η_w/N F Z, zero where silent
    if (snap_.X.dim() == 3) {
      st_.dW = input_sum(snap_, coef, W) - W * c.view({P, 1});  // channels: X (N, d, P)
    } else if (!w_moves_) {
      // The gradient update leaves W alone (no .grad): the pre-step W is the one apply() sees, so W is updated in
      // place by one op, W <- (1 − c) W + coefᵀ X, without a copy.
      st_.keep = 1.0 - c;
      st_.coef = coef;
    } else {
      // dW = −c ∘ W + coefᵀ X into a copy of the pre-step W, added after the gradient update.
      st_.dW = W.is_same(t_.W) ? W.clone() : W;
      firing_weight_update_(st_.dW, -c, coef, snap_.X.to(acc));
    }
  }
  // Oja on f: η_f mean_b F (Y Z − Y² / Y_ref2 · f) with Y = F f' Z: η_f / N · Σ_b F Z² · (f' − f'² f / Y_ref2), f the
  // pre-step f.
  const Tensor f_fwd = snap_.f.to(acc);
  st_.df = sums.fz2.view({P, 1}) * (f_fwd - f_fwd * f_fwd * f / y_ref2) * (o_.eta_f / N);
  // Homeostasis: EMAs of the firing rate and margin (the forward's SP), then the threshold's push.
  const Tensor r_t = sums.fired / static_cast<double>(N);
  const Tensor m_t = sums.margin / (static_cast<double>(N) * (o_.z_ref + o_.eps_z));
  st_.r_bar = t_.r_bar.to(acc) * (1 - o_.beta_r) + r_t * o_.beta_r;
  st_.m_bar = t_.m_bar.to(acc) * (1 - o_.beta_m) + m_t * o_.beta_m;
  st_.dSP = ((st_.r_bar - o_.r_target) * o_.lambda_r + (st_.m_bar - o_.m_target) * o_.lambda_m) * o_.eta_sp;
  st_.ready = true;
}

namespace {
// t <- t + d in t's own dtype (d in the rules' arithmetic dtype).
void add_into(const Tensor& t, const Tensor& d) {
  if (t.dtype() == d.dtype())
    Tensor(t).add_(d);
  else
    Tensor(t).copy_(t.to(d.dtype()) + d);
}
}  // namespace

void FiringRuleB::apply() {
  if (o_.sequential) return apply_sequential();
  if (!st_.ready) return;  // no snapshot: nothing adapts
  NoGradGuard ng;
  const int64_t P = t_.W.size(0);
  if (st_.dW.defined()) {
    add_into(t_.W, st_.dW);
  } else if (st_.coef.defined()) {
    const Tensor X = snap_.X.to(st_.coef.dtype());
    if (t_.W.dtype() == st_.coef.dtype()) {
      firing_weight_update_(t_.W, st_.keep, st_.coef, X);
    } else {  // a bf16/f16 layer: update W's float32 copy, then round into W
      Tensor Wa = t_.W.to(st_.coef.dtype());
      firing_weight_update_(Wa, st_.keep, st_.coef, X);
      t_.W.copy_(Wa);
    }
  } else if (st_.keep.defined()) {  // an empty batch under fuse_sgd: the weight decay alone
    Tensor(t_.W).copy_(t_.W.to(st_.keep.dtype()) * st_.keep.view({P, 1}));
  }
  if (st_.df.defined()) add_into(t_.f, st_.df);
  if (st_.r_bar.defined()) {
    t_.r_bar.copy_(st_.r_bar);
    t_.m_bar.copy_(st_.m_bar);
    add_into(t_.SP, st_.dSP);
  }
}

// The sequential variant (RuleBOptions::sequential): the terms from the W and f the gradient update has just moved.
void FiringRuleB::apply_sequential() {
  if (!has_snapshot()) return;  // eval-mode forward or no forward: nothing adapts
  const int64_t N = snap_.Z.size(0), P = t_.W.size(0);
  if (N == 0) return;
  NoGradGuard ng;
  const DType acc = acc_of(t_.W);
  const Tensor Z = snap_.Z.to(acc), F = snap_.F.to(acc), SP0 = snap_.SP.to(acc);
  const Tensor W = t_.W.to(acc), f = t_.f.to(acc);
  const double z_ref2 = o_.z_ref * o_.z_ref + o_.eps_z, y_ref2 = o_.y_ref * o_.y_ref + o_.eps_y;
  const FiringBatchSums sums = firing_batch_sums(Z, F, SP0);
  const Tensor sum_FZ2 = sums.fz2.view({P, 1});  // (P, 1)
  if (snap_.tok.defined()) {
    const Tensor FZ = F * Z, FZ2 = FZ * Z;               // (N, P)
    const Tensor Wcols = index_select(W, 1, snap_.tok);  // (P, N): W[p, tok_b]
    t_.W.copy_(W + input_sum(snap_, FZ - FZ2 / z_ref2 * Wcols.t(), W) * (o_.eta_w / N));
  } else {
    // W (1 − η_w / N · Σ F Z² / Z_ref2) + η_w / N · Σ_b F Z x_b: one pass over W besides the product.
    Tensor keep = 1.0 - sum_FZ2 * (o_.eta_w / (N * z_ref2));  // (P, 1)
    Tensor coef;                                              // (N, P)
    if (holds_deferred_gradient()) {
      // fuse_sgd, sequential: k (1 − lr wd m) W + (η_w/N F Z − lr k m dZ)ᵀ X, the SGD step then the Oja term.
      const Tensor mask = row_mask(t_.W);
      const Tensor m = mask.defined() ? mask.to(acc).view({P, 1}) : ones({P, 1}, {acc, W.device()});
      coef = firing_rule_b_coef(Z, F, o_.eta_w / N, snap_.dZ->to(acc), (keep * m * lr_w_).view({P}));
      keep = keep * (1.0 - m * (lr_w_ * wd_w_));
    } else {
      coef = firing_rule_b_coef(Z, F, o_.eta_w / N);
    }
    if (snap_.X.dim() == 2) {
      const Tensor X = snap_.X.to(acc);
      if (t_.W.dtype() == acc) {
        firing_weight_update_(t_.W, keep.view({P}), coef, X);
      } else {
        Tensor Wa = W;
        firing_weight_update_(Wa, keep.view({P}), coef, X);
        t_.W.copy_(Wa);
      }
    } else {
      t_.W.copy_(W * keep + input_sum(snap_, coef, W));
    }
  }
  const Tensor f_fwd = snap_.f.to(acc);
  t_.f.copy_(f + sum_FZ2 * (f_fwd - f_fwd * f_fwd * f / y_ref2) * (o_.eta_f / N));
  const Tensor r_t = sums.fired / static_cast<double>(N);
  const Tensor m_t = sums.margin / (static_cast<double>(N) * (o_.z_ref + o_.eps_z));
  const Tensor r_bar = t_.r_bar.to(acc) * (1 - o_.beta_r) + r_t * o_.beta_r;
  const Tensor m_bar = t_.m_bar.to(acc) * (1 - o_.beta_m) + m_t * o_.beta_m;
  t_.r_bar.copy_(r_bar);
  t_.m_bar.copy_(m_bar);
  const Tensor push = (r_bar - o_.r_target) * o_.lambda_r + (m_bar - o_.m_target) * o_.lambda_m;
  t_.SP.copy_(t_.SP.to(acc) + push * o_.eta_sp);
}

// ---- rule A ----------------------------------------------------------------------------------------------------

FiringRuleA::FiringRuleA(FiringTensors t, RuleAOptions o) : FiringRule(std::move(t)), o_(o) {
  check_tensors("FiringRuleA", t_, false);
  check_finite("FiringRuleA", {{"eta_plus", o.eta_plus},
                               {"eta_minus", o.eta_minus},
                               {"rho_plus", o.rho_plus},
                               {"rho_minus", o.rho_minus},
                               {"eta_sp", o.eta_sp},
                               {"z_max", o.z_max},
                               {"w_max", o.w_max},
                               {"f_max", o.f_max},
                               {"beta", o.beta},
                               {"r_target", o.r_target},
                               {"sp_min", o.sp_min},
                               {"sp_max", o.sp_max}});
  ASC_CHECK(o.eta_plus >= 0 && o.eta_minus >= 0 && o.rho_plus >= 0 && o.rho_minus >= 0 && o.eta_sp >= 0,
            "FiringRuleA: learning rates must be >= 0 (eta_plus {}, eta_minus {}, rho_plus {}, rho_minus {}, "
            "eta_sp {})",
            o.eta_plus, o.eta_minus, o.rho_plus, o.rho_minus, o.eta_sp);
  ASC_CHECK(o.z_max > 0 && o.w_max > 0 && o.f_max > 0, "FiringRuleA: z_max {}, w_max {}, f_max {} must be > 0", o.z_max,
            o.w_max, o.f_max);
  ASC_CHECK(o.beta > 0 && o.beta <= 1 && o.r_target >= 0 && o.r_target <= 1 && o.sp_min < o.sp_max,
            "FiringRuleA: needs beta in (0, 1] (got {}), r_target in [0, 1] (got {}), sp_min < sp_max ({}, {})", o.beta,
            o.r_target, o.sp_min, o.sp_max);
  check_in_range("FiringRuleA", "W", t_.W, 0.0, o.w_max,
                 "Rule A keeps W in [0, w_max]: build the layer with non-negative weights (nn::FiringOptions::init("
                 "nn::FiringInit::NonNegative)) and a w_max that holds them (or use rule B, which has a signed range)");
  check_in_range("FiringRuleA", "output weights f", t_.f, 0.0, o.f_max,
                 "Rule A keeps f in [0, f_max]: a layer's f starts at 1, so f_max >= 1 holds it (or use rule B, which "
                 "has a signed range)");
  set_range(t_.W, 0.0, o.w_max);
  set_range(t_.f, 0.0, o.f_max);
  set_range(t_.SP, o.sp_min, o.sp_max);
}

void FiringRuleA::clear() {
  FiringRule::clear();
  st_ = Staged{};
}

void FiringRuleA::pre_update() {
  st_ = Staged{};
  if (!has_snapshot()) return;
  const int64_t N = snap_.Z.size(0), P = t_.W.size(0);
  if (N == 0) return;
  NoGradGuard ng;
  const DType acc = acc_of(t_.W);
  const Tensor Z = snap_.Z.to(acc), F = snap_.F.to(acc), SP0 = snap_.SP.to(acc).view({1, P});
  const Tensor W = t_.W.to(acc), f = t_.f.to(acc);
  // Potentiation on a firing margin, depression on a missing one, soft-bounded by the pre-step W / w_max.
  const Tensor pot = input_sum(snap_, relu(Z - SP0), W) / static_cast<double>(N);
  const Tensor dep = input_sum(snap_, relu(SP0 - Z), W) / static_cast<double>(N);
  st_.dW = pot * (1.0 - W / o_.w_max) * o_.eta_plus - dep * (W / o_.w_max) * o_.eta_minus;
  // Output weights grow while the neuron fires, decay while it is silent.
  const Tensor grow = mean(F * Z, {0}).view({P, 1}) / o_.z_max, silent = mean(1.0 - F, {0}).view({P, 1});
  st_.df = grow * (1.0 - f / o_.f_max) * o_.rho_plus - silent * (f / o_.f_max) * o_.rho_minus;
  // The threshold follows the firing rate's EMA towards r*.
  st_.f_bar = t_.f_bar.to(acc) * (1 - o_.beta) + mean(F, {0}) * o_.beta;
  st_.dSP = (st_.f_bar - o_.r_target) * o_.eta_sp;
  st_.ready = true;
}

void FiringRuleA::apply() {
  if (!st_.ready) return;
  NoGradGuard ng;
  add_into(t_.W, st_.dW);
  add_into(t_.f, st_.df);
  t_.f_bar.copy_(st_.f_bar);
  add_into(t_.SP, st_.dSP);
}

// ---- building a rule from a layer -------------------------------------------------------------------------------

std::shared_ptr<FiringRuleB> rule_b(FiringRuleHost& layer, const RuleBOptions& o) {
  layer.check_rule(o.fuse_sgd);  // what the layer refuses is named before the rule's own checks
  auto rule = std::make_shared<FiringRuleB>(layer.firing_tensors(), o);
  layer.attach_rule(rule, o.fuse_sgd);
  return rule;
}

std::shared_ptr<FiringRuleA> rule_a(FiringRuleHost& layer, const RuleAOptions& o) {
  layer.check_rule(false);
  auto rule = std::make_shared<FiringRuleA>(layer.firing_tensors(), o);
  layer.attach_rule(rule, false);
  return rule;
}

}  // namespace asc::optim
