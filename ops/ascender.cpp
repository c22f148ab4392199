// The ASCender attention core (ops/ascender.h): the readable reference composed from framework ops, one formula
// of docs/ascender.md per line, and its helpers.
#include "ops/ascender.h"

#include <cmath>
#include <limits>

#include <atomic>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/error.h"
#include "core/format.h"
#include "ops/ascender_scalars.h"
#include "ops/dispatch.h"
#include "ops/flops.h"
#include "ops/ops.h"

namespace asc {

namespace {

// (H) values as a (1, H, 1, 1) tensor that broadcasts over (B, H, T, T).
Tensor head_scalar(const std::vector<double>& v, const Tensor& like) {
  return tensor(v, {1, static_cast<int64_t>(v.size()), 1, 1}).to(like.dtype()).to(like.device());
}
Tensor head_scalar(const Tensor& t) { return t.view({1, t.numel(), 1, 1}); }

constexpr const char* kOp = "ascender_attention";
std::atomic<AscenderBackend> g_backend{AscenderBackend::Auto};

// A (B|1, H|1, T|1, T|1) tensor that broadcasts to the scores (B, H, T, T) without growing them.
void check_scores_operand(const Tensor& t, const Shape& scores, const char* what) {
  if (!t.defined()) return;
  bool ok = t.dim() <= 4;
  for (int64_t a = 0; ok && a < t.dim(); ++a) {
    const int64_t s = t.size(t.dim() - 1 - a), want = scores[3 - a];
    ok = s == want || s == 1;
  }
  ASC_CHECK(ok, "{}: {} of shape {} does not broadcast to the scores {}", kOp, what, t.shape(), scores);
}

bool finite(double x) { return std::isfinite(x); }

// Every argument of the op, checked before any kernel (or parallel region) runs, so that the reference, the CPU and
// the CUDA kernel refuse the same inputs with the same messages (docs/ascender.md, "Accepted options").
void check_core_inputs(const Tensor& q, const Tensor& k_rot, const Tensor& k, const Tensor& v, const Tensor& z,
                       const Tensor& e, const AscenderCoreArgs& a) {
  for (const Tensor* t : {&q, &k_rot, &k, &v, &z, &e})
    ASC_CHECK(t->defined() && t->dim() == 4, "{}: q, k_rot, k, v, z, e must be defined (B, H, T, ·) tensors", kOp);
  ASC_CHECK(is_floating(q.dtype()), "{}: the heads must be floating-point, got {}", kOp, q.dtype());
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2);
  for (const Tensor* t : {&k_rot, &k, &v, &z, &e})
    ASC_CHECK(t->size(0) == B && t->size(1) == H && t->size(2) == T && t->dtype() == q.dtype(),
              "{}: every head tensor must be ({}, {}, {}, ·) of dtype {}; got {} {}", kOp, B, H, T, q.dtype(),
              t->shape(), t->dtype());
  ASC_CHECK(k_rot.shape() == q.shape() && k.shape() == q.shape() && v.shape() == q.shape(),
            "{}: q, k_rot, k, v must share a shape, got {}, {}, {}, {}", kOp, q.shape(), k_rot.shape(), k.shape(),
            v.shape());
  // The (B, H, T, T) scores, and the (T, T) tiles times the widths the kernels' cost estimates form, fit int64.
  const int64_t widths = 16 * (1 + q.size(3) + z.size(3) + e.size(3));
  checked_mul(checked_mul(checked_mul(B, H, kOp, "B·H"), checked_mul(T, T, kOp, "T·T"), kOp, "B·H·T·T"), widths, kOp,
              "B·H·T·T·(d + d_z + d_a)");
  const Shape scores{B, H, T, T};
  check_same_device(kOp, {&q, &k_rot, &k, &v, &z, &e, &a.keep_mask, &a.bias, &a.omega_align, &a.omega_sep, &a.omega_coh,
                          &a.lambda_align, &a.lambda_sep, &a.lambda_coh, &a.delta, &a.kappa, &a.tau_score});
  ASC_CHECK(!a.keep_mask.defined() || a.keep_mask.dtype() == kBool,
            "{}: keep_mask must be bool (true = attend), got {}", kOp,
            a.keep_mask.defined() ? a.keep_mask.dtype() : kBool);
  check_scores_operand(a.keep_mask, scores, "keep_mask");
  ASC_CHECK(!a.bias.defined() || is_floating(a.bias.dtype()), "{}: bias must be floating-point, got {}", kOp,
            a.bias.defined() ? a.bias.dtype() : q.dtype());
  check_scores_operand(a.bias, scores, "bias");
  auto heads_of = [&](size_t n, const char* what) {
    ASC_CHECK(static_cast<int64_t>(n) == H, "{}: {} has {} values for {} heads", kOp, what, n, H);
  };
  heads_of(a.k.size(), "k");
  heads_of(a.tau_sep.size(), "tau_sep");
  heads_of(a.tau_coh.size(), "tau_coh");
  heads_of(a.alpha_align.size(), "alpha_align");
  heads_of(a.alpha_coh.size(), "alpha_coh");
  for (const Tensor* t : {&a.omega_align, &a.omega_sep, &a.omega_coh, &a.lambda_align, &a.lambda_sep, &a.lambda_coh,
                          &a.delta, &a.kappa, &a.tau_score})
    ASC_CHECK(t->defined() && t->numel() == H && is_floating(t->dtype()),
              "{}: every learnable scalar must be a floating tensor of {} (heads) values", kOp, H);
  // Bounds beyond which the computation is meaningless in floating point (docs: Accepted options): below
  // kMinTau, w = exp(-|z_i - z_j|² / τ) is decided by the rounding of |z_i - z_j|² (even w_ii = 1 is not safe);
  // below kMinNormEps, a term whose spread σ is so small that σ² underflows is standardised by σ + ε ≈ σ, i.e.
  // by rounding; above kMaxAlpha, the gates σ(-α Var) are decided by the rounding of Var (1 - |k̄|² of one unit key
  // is ~1e-16, not 0); above kMaxOmegaScale, the scores overflow.
  constexpr double kMinTau = 1e-6, kMinNormEps = 1e-12, kMaxAlpha = 1e6, kMaxOmegaScale = 1e6;
  for (int64_t h = 0; h < H; ++h)
    ASC_CHECK(a.k[h] >= 1 && a.tau_sep[h] >= kMinTau && finite(a.tau_sep[h]) && a.tau_coh[h] >= kMinTau &&
                  finite(a.tau_coh[h]) && a.alpha_align[h] >= 0 && a.alpha_align[h] <= kMaxAlpha &&
                  a.alpha_coh[h] >= 0 && a.alpha_coh[h] <= kMaxAlpha,
              "{}: head {} needs k >= 1, finite tau_sep and tau_coh >= 1e-6, alpha_align and alpha_coh in [0, 1e6]; "
              "got k {}, tau_sep {}, tau_coh {}, alpha_align {}, alpha_coh {}",
              kOp, h, a.k[h], a.tau_sep[h], a.tau_coh[h], a.alpha_align[h], a.alpha_coh[h]);
  ASC_CHECK(a.norm_eps >= kMinNormEps && finite(a.norm_eps), "{}: norm_eps must be finite and >= 1e-12, got {}", kOp,
            a.norm_eps);
  ASC_CHECK(a.dropout >= 0 && a.dropout < 1, "{}: dropout {} not in [0, 1)", kOp, a.dropout);
  ASC_CHECK(a.omega_scale >= 0 && a.omega_scale <= kMaxOmegaScale, "{}: omega_scale must be in [0, 1e6], got {}", kOp,
            a.omega_scale);
  ASC_CHECK(a.row_block >= 0, "{}: row_block must be >= 0 (0: the kernel's default), got {}", kOp, a.row_block);
  ASC_CHECK(a.window >= 0 && a.global_tokens >= 0, "{}: window {} and global_tokens {} must be >= 0 (window 0: none)",
            kOp, a.window, a.global_tokens);
}

// What only the reference produces or handles.
std::string op_unsupported(const AscenderCoreArgs& a, bool want_out, bool want_aux) {
  if (want_out) return "the decomposition was requested";
  if (want_aux) return "the auxiliary losses were requested";
  if (a.training && a.dropout > 0) return "attention dropout";
  if (a.bias.defined() && autograd::needs_grad(a.bias)) return "a bias that needs a gradient";
  return "";
}

std::string kernel_unsupported(const AscenderKernelInputs& in, const AscenderConfig& cfg) {
  std::string why;
  ASC_KERNEL(in.q.device(), kOp, ascender_unsupported, in, cfg, why);
  return why;
}

// The kernels' view of the arguments: contiguous heads, stacked scalars (differentiable), (B, H, T, T) mask views.
AscenderKernelInputs kernel_inputs(const Tensor& q, const Tensor& k_rot, const Tensor& k, const Tensor& v,
                                   const Tensor& z, const Tensor& e, const AscenderCoreArgs& a) {
  const Shape scores{q.size(0), q.size(1), q.size(2), q.size(2)};
  AscenderKernelInputs in;
  in.q = q.contiguous(), in.k_rot = k_rot.contiguous(), in.k = k.contiguous(), in.v = v.contiguous();
  in.z = z.contiguous(), in.e = e.contiguous();
  auto as_q = [&](const Tensor& t) { return t.dtype() == q.dtype() ? t : t.to(q.dtype()); };
  in.scalars = stack(
                   {// rows in ascender::Scalar order (ops/ascender_scalars.h)
                    as_q(a.omega_align), as_q(a.omega_sep), as_q(a.omega_coh), as_q(a.lambda_align), as_q(a.lambda_sep),
                    as_q(a.lambda_coh), as_q(a.delta), as_q(a.kappa), as_q(a.tau_score)},
                   0)
                   .reshape({9, q.size(1)});
  if (a.keep_mask.defined()) in.keep = a.keep_mask.expand(scores);
  if (a.bias.defined()) in.bias = as_q(a.bias).detach().expand(scores);
  return in;
}

// The kernels' configuration, with the integer options clamped to what they can mean at length T (nothing changes
// in the result): a row has at most T keys to select (k), |i - j| < T holds for every pair (window), at most T
// tokens can be global and a block holds at most T rows. So no kernel sizes anything by an unclamped option
// (k = INT64_MAX would size its top-k lists; window = INT64_MAX would overflow the block's key range).
AscenderConfig kernel_config(const AscenderCoreArgs& a, int64_t T) {
  const int64_t t1 = std::max<int64_t>(T, 1);
  AscenderConfig cfg = a;  // the configuration part of the arguments
  for (int64_t& kh : cfg.k) kh = std::min(kh, t1);
  cfg.window = std::min(cfg.window, t1);
  cfg.global_tokens = std::min(cfg.global_tokens, t1);
  cfg.row_block = std::min(cfg.row_block, t1);
  return cfg;
}

// The kernels' FLOPs (ops/flops.h), every (batch, head) over its attended pairs.
double forward_flops(const AscenderKernelInputs& in, const AscenderConfig& cfg) {
  const int64_t T = in.q.size(2);
  const double P = cfg.window > 0 ? flops::windowed_pairs(T, cfg.window, cfg.global_tokens) : flops::dense_pairs(T, T);
  return static_cast<double>(in.q.size(0) * in.q.size(1)) *
         flops::ascender_head(P, in.q.size(3), in.z.size(3), in.e.size(3), cfg.select_by_scores);
}

// Forward through the kernel; one graph node whose backward is the kernel's backward.
Tensor ascender_fused(const AscenderKernelInputs& in, const AscenderConfig& cfg) {
  Tensor y = Tensor::empty(in.q.shape(), in.q.options());  // (B, H, T, d)
  const bool backward = autograd::needs_grad({&in.q, &in.k_rot, &in.k, &in.v, &in.z, &in.e, &in.scalars});
  AscenderKernelState state;  // the backend's own record for its backward (it sizes it: ops/kernel_list.inc)
  ASC_KERNEL_COUNTED(in.q.device(), kOp, forward_flops(in, cfg), ascender_forward, in, cfg, y,
                     backward ? &state : nullptr);
  if (backward) {
    using autograd::SavedTensor;
    autograd::record(
        kOp, {in.q, in.k_rot, in.k, in.v, in.z, in.e, in.scalars}, {y},
        [q = SavedTensor(in.q, kOp), kr = SavedTensor(in.k_rot, kOp), k = SavedTensor(in.k, kOp),
         v = SavedTensor(in.v, kOp), z = SavedTensor(in.z, kOp), e = SavedTensor(in.e, kOp),
         sc = SavedTensor(in.scalars, kOp), keep = in.keep, bias = in.bias, state,
         cfg](const TensorList& g) -> TensorList {
          const AscenderKernelInputs saved{q.get(), kr.get(), k.get(), v.get(), z.get(), e.get(), sc.get(), keep, bias};
          // the gradients of q, k_rot, k, v, z, e and the (9, H) scalars, in their shapes and q's dtype
          TensorList grads;
          for (const Tensor* t : {&saved.q, &saved.k_rot, &saved.k, &saved.v, &saved.z, &saved.e, &saved.scalars})
            grads.push_back(Tensor::empty(t->shape(), saved.q.options()));
          ASC_KERNEL_COUNTED(g[0].device(), kOp, 2 * forward_flops(saved, cfg), ascender_backward, saved, cfg, state,
                             g[0], grads);
          return grads;
        });
  }
  return y;
}

}  // namespace

Tensor ascender_window_mask(int64_t T, int64_t window, int64_t global_tokens, Device device) {
  ASC_CHECK(T >= 0 && window >= 1 && global_tokens >= 0,
            "ascender_window_mask: T {} and global_tokens {} must be >= 0 and window {} >= 1", T, global_tokens,
            window);
  Tensor i = arange(0, static_cast<double>(T), 1.0, {.dtype = kFloat64, .device = device}).view({T, 1});
  Tensor j = i.view({1, T});
  Tensor near = lt(abs(i - j), static_cast<double>(window));
  Tensor global = logical_or(lt(i, static_cast<double>(global_tokens)), lt(j, static_cast<double>(global_tokens)));
  return logical_or(near, global);  // (T, T)
}

Tensor ascender_normalize(const Tensor& x, const Tensor& keep, double eps) {
  ASC_CHECK(x.defined() && is_floating(x.dtype()), "ascender_normalize: x must be a defined floating tensor");
  ASC_CHECK(!keep.defined() || keep.dtype() == kBool, "ascender_normalize: keep must be bool, got {}",
            keep.defined() ? keep.dtype() : kBool);
  ASC_CHECK(eps > 0 && std::isfinite(eps), "ascender_normalize: eps must be finite and > 0, got {}", eps);
  Tensor y = row_standardize(x, keep, eps);
  Tensor constant;
  {
    NoGradGuard ng;  // the rule picks rows; it is not differentiated
    Tensor w = keep.defined() ? keep.expand(x.shape()).to(x.dtype()) : ones_like(x);
    Tensor cnt = clamp(sum(w, {-1}, true), 1.0, std::nullopt);
    Tensor mu = sum(x * w, {-1}, true) / cnt;
    Tensor dev = x - mu;
    Tensor sd = sqrt(sum(dev * dev * w, {-1}, true) / cnt);
    Tensor big = amax(abs(x) * w, {-1}, true);
    constant = le(sd, big * ascender::kConstantRow);  // (.., 1); all-equal and empty rows too (0 <= 0)
  }
  return where(constant, zeros_like(y), y);  // no gradient reaches y (and so σ) on constant rows
}

Tensor ascender_attention_reference(const Tensor& q, const Tensor& k_rot, const Tensor& k, const Tensor& v,
                                    const Tensor& z, const Tensor& e, const AscenderCoreArgs& p,
                                    AscenderDecomposition* out, AscenderAux* aux) {
  check_core_inputs(q, k_rot, k, v, z, e, p);  // the same checks as the op
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), d = q.size(3);
  const Shape scores{B, H, T, T};
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  Tensor keep = p.keep_mask;  // (B|1, H|1, T|1, T) or undefined
  if (p.window > 0) {
    const int64_t t1 = std::max<int64_t>(T, 1);  // beyond T they mean the same (kernel_config)
    Tensor win =
        ascender_window_mask(T, std::min(p.window, t1), std::min(p.global_tokens, t1), q.device()).view({1, 1, T, T});
    keep = keep.defined() ? logical_and(keep, win) : win;
  }
  const Tensor keep_b = keep.defined() ? keep.expand(scores) : Tensor();             // bool (B, H, T, T)
  Tensor valid = keep.defined() ? keep_b.to(q.dtype()) : ones(scores, q.options());  // (B, H, T, T)
  Tensor eye_t = eye(T, {.dtype = q.dtype(), .device = q.device()}).view({1, 1, T, T});
  // Masked entries are replaced by 0, not multiplied by it: NaN · 0 is NaN, and a NaN of a key that row i does not
  // attend to must not reach row i (docs §13).
  auto kept_only = [&](const Tensor& x) { return keep_b.defined() ? where(keep_b, x, 0.0) : x; };

  // ---- base scores, affinity, neighbourhoods (§1-2) --------------------------------------------------------------
  Tensor S_base = matmul(q, k_rot.transpose(-2, -1)) / std::sqrt(static_cast<double>(d));  // (B, H, T, T)
  Tensor a = cosine_similarity_matrix(e, e);                                               // (B, H, T, T)
  Tensor d2 = pairwise_sqdist(z, z);                                                       // |z_i - z_j|²
  Tensor M;        // (B, H, T, T): 1 where j ∈ N(i); not differentiable (a selection)
  Tensor nan_sel;  // (B, H, T, 1) bool: a NaN among row i's candidates, so N(i) is undefined (u_i is NaN)
  int64_t kmax = 0;
  for (int64_t kh : p.k) kmax = std::max(kmax, kh);
  {
    NoGradGuard ng;
    Tensor selectable = gt(valid, 0.0);
    if (!p.include_self) selectable = logical_and(selectable, eq(eye_t, 0.0));
    // Unselectable entries become -inf and stay out of N(i): a row with fewer than k_h selectable keys keeps all.
    Tensor by = p.select_by_scores ? S_base.detach() : a.detach();
    Tensor a_sel = where(selectable, by, -inf);
    Tensor is_nan = isnan(a_sel);
    nan_sel = gt(sum(is_nan.to(q.dtype()), {-1}, true), 0.0);
    a_sel = where(is_nan, -inf, a_sel);  // those rows' selection is replaced by NaN below
    const int64_t kcap = std::min(kmax, T);
    ValuesIndices top = topk(a_sel, kcap);  // (B, H, T, kcap), ties to the lower index
    Tensor slot = arange(kcap, {.dtype = kInt64, .device = q.device()}).view({1, 1, 1, kcap});
    std::vector<double> kh(p.k.begin(), p.k.end());
    Tensor slot_ok = logical_and(gt(top.values, -inf), lt(slot.to(q.dtype()), head_scalar(kh, q)));  // (B, H, T, kcap)
    M = scatter_add(zeros(scores, q.options()), 3, top.indices, slot_ok.to(q.dtype()));              // (B, H, T, T)
  }
  Tensor lam_a = head_scalar(p.lambda_align), lam_s = head_scalar(p.lambda_sep), lam_c = head_scalar(p.lambda_coh);
  const bool after = p.gate_position == GatePosition::AfterNorm;
  Tensor S = S_base;
  AscenderDecomposition dec;
  Tensor u, phi, dc;  // kept for the auxiliary losses
  auto omega = [&](const Tensor& w) { return p.omega_scale == 1.0 ? head_scalar(w) : head_scalar(w) * p.omega_scale; };

  // ---- alignment (§3): keys before RoPE ---------------------------------------------------------------------------
  if (p.use_align) {
    Tensor k_hat = normalize_rows(k);  // (B, H, T, d) unit keys
    // Σ_{l∈N(i)} k̂_l over the neighbours only (matmul(M, k̂) would multiply a non-neighbour's NaN by 0): NaN keys
    // enter as 0, and the rows with a NaN neighbour (or a NaN candidate) become NaN.
    Tensor nan_row;
    {
      NoGradGuard ng;
      Tensor nan_key = gt(sum(isnan(k_hat).to(q.dtype()), {-1}, true), 0.0).to(q.dtype());  // (B, H, T, 1)
      nan_row = logical_or(nan_sel, gt(matmul(M, nan_key), 0.0));
    }
    Tensor k_sum = where(nan_row, nan, matmul(M, where(isnan(k_hat), 0.0, k_hat)));  // Σ_{l∈N(i)} k̂_l
    Tensor n_nbr = sum(M, {-1}, true);                                               // |N(i)|
    Tensor k_bar = k_sum / clamp(n_nbr, 1.0, std::nullopt);
    // u_i = s_i / |s_i|, and 0 where the headings cancel, |s_i| <= kConstantRow |N(i)| (docs §3): |s_i| is then the
    // rounding of the sum, and its direction noise. An empty neighbourhood (s_i = 0) is such a row; a NaN is not.
    Tensor cancelled;
    {
      NoGradGuard ng;
      cancelled = le(sqrt(sum(k_sum.detach() * k_sum.detach(), {-1}, true)), n_nbr * ascender::kConstantRow);
    }
    u = where(cancelled, 0.0, normalize_rows(k_sum));
    Tensor r = matmul(u, k_hat.transpose(-2, -1));  // r_ij = k̂_j · u_i
    // 1 - |k̄_i|²; 0 over an empty neighbourhood (SPEC §1.16: the variance of no vectors), so γ = σ(0) = 1/2 there
    Tensor var = where(logical_or(gt(n_nbr, 0.0), nan_row), 1.0 - sum(k_bar * k_bar, {-1}, true), 0.0);
    Tensor gamma = sigmoid(-var * head_scalar(p.alpha_align, q));  // (B, H, T, 1)
    Tensor raw = after ? r : lam_a * gamma * r;
    Tensor b = ascender_normalize(kept_only(raw), keep, p.norm_eps);
    if (after) b = lam_a * gamma * b;
    S = S + omega(p.omega_align) * b;
    dec.raw_align = raw, dec.align = b, dec.gamma_align = gamma;
  }
  // ---- separation (§4) ----------------------------------------------------------------------------------------
  if (p.use_sep) {
    Tensor w = exp(-d2 / head_scalar(p.tau_sep, q));  // w^{τs}_ij
    Tensor others = eq(eye_t, 0.0);                   // l ≠ i
    if (keep_b.defined()) others = logical_and(keep_b, others);
    Tensor rho = sum(where(others, w, 0.0), {-1}, true);  // Σ_{l≠i, kept} w_il
    Tensor ratio = rho / head_scalar(p.kappa);
    Tensor eta = where(ge(ratio, 1.0), 1.0, ratio);  // min(1, ρ/κ), NaN stays NaN
    Tensor hinge = a - head_scalar(p.delta);
    phi = w * where(le(hinge, 0.0), 0.0, hinge);  // w_ij [a_ij - δ]_+, NaN stays NaN
    Tensor raw = after ? -phi : -(lam_s * eta * phi);
    Tensor b = ascender_normalize(kept_only(raw), keep, p.norm_eps);
    if (after) b = lam_s * eta * b;
    S = S + omega(p.omega_sep) * b;
    dec.raw_sep = raw, dec.sep = b, dec.eta = eta;
  }
  // ---- cohesion (§5) ------------------------------------------------------------------------------------------
  if (p.use_coh) {
    const Tensor tau = head_scalar(p.tau_coh, q);
    Tensor w = kept_only(exp(-d2 / tau));                          // kept keys only, i included
    Tensor wsum = clamp(sum(w, {-1}, true), 1e-30, std::nullopt);  // >= w_ii = 1 unless i is masked
    Tensor c = matmul(w, z) / wsum;                                // (B, H, T, d_z) local centroids
    dc = pairwise_sqdist(c, z);                                    // |z_j - c_i|²
    Tensor var = sum(w * kept_only(dc), {-1}, true) / wsum;
    Tensor gamma = sigmoid(-var * head_scalar(p.alpha_coh, q));
    Tensor raw = after ? -dc : -(lam_c * gamma * dc) / tau;
    Tensor b = ascender_normalize(kept_only(raw), keep, p.norm_eps);
    if (after) b = lam_c * gamma * b;
    S = S + omega(p.omega_coh) * b;
    dec.raw_coh = raw, dec.coh = b, dec.gamma_coh = gamma;
  }
  if (p.bias.defined()) S = S + p.bias;

  // ---- attention (§6) -----------------------------------------------------------------------------------------
  Tensor A = softmax(kept_only(S) / head_scalar(p.tau_score), -1, keep_b);  // a masked NaN stays out (kept_only)
  if (out) {
    auto keep_or_zero = [&](const Tensor& t) { return t.defined() ? t.detach() : zeros(scores, q.options()); };
    // S is -inf outside the attended set (docs §6), as the softmax reads it.
    Tensor S_out = keep_b.defined() ? where(keep_b, S.detach(), -inf) : S.detach();
    *out = AscenderDecomposition{S_base.detach(),
                                 keep_or_zero(dec.align),
                                 keep_or_zero(dec.sep),
                                 keep_or_zero(dec.coh),
                                 S_out,
                                 A.detach(),
                                 keep_or_zero(dec.raw_align),
                                 keep_or_zero(dec.raw_sep),
                                 keep_or_zero(dec.raw_coh),
                                 dec.gamma_align.defined() ? dec.gamma_align.detach() : Tensor(),
                                 dec.eta.defined() ? dec.eta.detach() : Tensor(),
                                 dec.gamma_coh.defined() ? dec.gamma_coh.detach() : Tensor()};
  }
  if (aux && p.want_aux) {
    // Means over the query rows that attend to something (and, for alignment, that have a neighbourhood).
    Tensor live = gt(sum(valid, {-1}, true), 0.0).to(q.dtype());  // (B, H, T, 1)
    auto row_mean = [](const Tensor& per_row, const Tensor& rows) {
      return sum(per_row * rows) / clamp(sum(rows), 1.0, std::nullopt);
    };
    *aux = {};
    if (dc.defined()) aux->coh = row_mean(sum(A * dc, {-1}, true), live);
    if (phi.defined()) aux->sep = row_mean(sum(A * phi, {-1}, true), live);
    if (u.defined()) {
      Tensor count = sum(M, {-1}, true);
      Tensor u_bar = matmul(M, u) / clamp(count, 1.0, std::nullopt);  // mean of the neighbours' u (not renormalised)
      aux->align = row_mean(1.0 - sum(u * u_bar, {-1}, true), gt(count, 0.0).to(q.dtype()));
    }
  }
  if (p.training && p.dropout > 0) A = asc::dropout(A, p.dropout, true);
  return matmul(A, v);  // (B, H, T, d)
}

void set_ascender_backend(AscenderBackend backend) { g_backend = backend; }
AscenderBackend ascender_backend() { return g_backend; }

std::string ascender_choice(const Tensor& q, const Tensor& k_rot, const Tensor& k, const Tensor& v, const Tensor& z,
                            const Tensor& e, const AscenderCoreArgs& args, bool want_decomposition) {
  check_core_inputs(q, k_rot, k, v, z, e, args);
  if (ascender_backend() == AscenderBackend::Reference) return "reference: the Reference backend is selected";
  std::string why = op_unsupported(args, want_decomposition, args.want_aux);
  if (why.empty()) why = kernel_unsupported(kernel_inputs(q, k_rot, k, v, z, e, args), kernel_config(args, q.size(2)));
  return why.empty() ? (q.device().is_cuda() ? "fused (CUDA)" : "fused (CPU)") : "reference: " + why;
}

Tensor ascender_attention(const Tensor& q, const Tensor& k_rot, const Tensor& k, const Tensor& v, const Tensor& z,
                          const Tensor& e, const AscenderCoreArgs& args, AscenderDecomposition* out, AscenderAux* aux) {
  check_core_inputs(q, k_rot, k, v, z, e, args);
  const AscenderBackend backend = ascender_backend();
  if (backend != AscenderBackend::Reference) {
    std::string why = op_unsupported(args, out != nullptr, aux != nullptr && args.want_aux);
    if (why.empty()) {
      const AscenderKernelInputs in = kernel_inputs(q, k_rot, k, v, z, e, args);
      const AscenderConfig cfg = kernel_config(args, q.size(2));
      why = kernel_unsupported(in, cfg);
      if (why.empty()) return ascender_fused(in, cfg);
    }
    ASC_CHECK(backend == AscenderBackend::Auto, "{}: the Fused backend cannot run q {} {}: {}", kOp, q.shape(),
              q.dtype(), why);
  }
  return ascender_attention_reference(q, k_rot, k, v, z, e, args, out, aux);
}

}  // namespace asc
