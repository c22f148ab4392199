#pragma once
// The output of a layer of firing-threshold neurons (docs/firing.md §1-2) as one fused op with a hand-written
// backward: each neuron p fires when its pre-activation reaches its threshold, and only then passes a weighted
// copy of the pre-activation to each of its α outputs.
//
//   asc::FiringOutput o = asc::firing_output(Z, SP, f);               // exact gate: SP gets no gradient
//   asc::FiringOutput s = asc::firing_output(Z, SP, f, {.mode = asc::GateBackward::Surrogate, .surrogate = "atan"});
//   o.Y;  // (N, P, α): F f Z        o.F;  // (N, P): the gate, detached (what the local rules read)
#include <memory>

#include "core/tensor.h"
#include "ops/geometry.h"  // GateOptions, GateBackward, the surrogate registry

namespace asc {

struct FiringOutput {
  Tensor Y;  // (N, P, α) = F[b, p] f[p, g] Z[b, p]; exactly 0 where the neuron is silent, NaN where undefined
  Tensor F;  // (N, P) in {0, 1} (NaN where undefined), Z's dtype, detached
};

// Z (N, P) pre-activations, SP (P) thresholds, f (P, α) output weights, one float dtype and device.
//   F = 1[Z >= SP] (equality fires),  Y[b, p, g] = F[b, p] f[p, g] Z[b, p]
// Backward, with S[b, p] = Σ_g dY[b, p, g] f[p, g] and s' the gate's surrogate derivative at Z - SP (0 for the
// exact gate, GateBackward::None; 1 for StraightThrough; the named surrogate of width `width` for Surrogate):
//   dZ = S (F + Z s'),   dSP = -Σ_b S Z s',   df[p, g] = Σ_b dY[b, p, g] F Z
// NaN stays visible: where Z[b, p] or SP[p] is NaN the gate is undefined — F = NaN, Y[b, p, :] = NaN, and dZ, dSP[p]
// and df[p, :] are NaN (with the exact gate too), as F f Z gives in IEEE arithmetic with F = NaN. A silent neuron
// with a finite Z outputs exactly 0 and ignores its upstream gradient (dZ = 0 with the exact gate, no df term), even
// where f or dY is not finite. gate.width must be finite and > 0. The sums over b follow a fixed plan: the same
// inputs give the same bits for any thread count. On the CPU, with the exact gate, silent neurons are skipped in the
// backward of rows where fewer than a quarter fire. Errors name the op and the shapes.
FiringOutput firing_output(const Tensor& Z, const Tensor& SP, const Tensor& f, const GateOptions& gate = {});

// Rule B's update of a dense firing layer's weights (docs/firing.md §4), in place and in one op:
//   W[p, :] <- keep[p] W[p, :] + Σ_b coef[b, p] X[b, :]
// W (P, d) contiguous, keep (P), coef (N, P), X (N, d); one float dtype (float32/float64) and device. Not
// differentiable: an optimizer-side update, called under NoGradGuard. keep, coef or X may share memory with W (be W,
// a view of it, or overlap it partly): they are then read from a copy, so the result is that of the unaliased call.
// NaN in any input propagates to the rows it touches, except through a zero coefficient: coef[b, p] == 0 meeting a
// non-finite X[b, :] adds nothing on the sparse path and NaN on the dense one (0 · NaN in the GEMM); rule B never forms
// that pair (a NaN input makes Z, hence the coefficient, NaN). On the CPU the result does not depend on the thread
// count with use_deterministic_algorithms(true); by default the dense path's BLAS products follow the thread count.
// Zero entries of coef cost nothing on the CPU when they are most of it — with the exact gate coef is zero wherever the
// neuron was silent, so at firing rates below about 1/3 each neuron adds only its firing rows' inputs instead of
// running a dense GEMM.
//
//   asc::firing_weight_update_(W, keep, coef, X);   // Oja decay keep, Oja + SGD coefficients coef
void firing_weight_update_(Tensor& W, const Tensor& keep, const Tensor& coef, const Tensor& X);

// Rule B's per-neuron sums over a batch (optim/firing_rules.h), in one pass over Z, F (N, P) with SP (P):
//   fz2[p] = Σ_b F Z²,   fired[p] = Σ_b F,   margin[p] = Σ_b F max(0, Z − SP)
// (F = 0 adds exactly nothing whatever Z is; F NaN, an undefined gate, and max(0, NaN) give NaN)
// Z, F, SP float32 or float64, one dtype and device; the sums (P) in that dtype (accumulated in float64 on the CPU,
// in the dtype on CUDA), column by column in a fixed order: the same inputs give the same bits. Not differentiable.
//
//   asc::FiringBatchSums s = asc::firing_batch_sums(Z, F, SP);   // s.fz2, s.fired, s.margin: (P)
struct FiringBatchSums {
  Tensor fz2, fired, margin;  // (P) each
};
FiringBatchSums firing_batch_sums(const Tensor& Z, const Tensor& F, const Tensor& SP);

// Rule B's coefficients for firing_weight_update_ in one pass: coef[b, p] = a F Z − c[p] dZ[b, p] with Z, F, dZ (N,
// P), c (P); dZ and c both given (fuse_sgd: the SGD step's share) or both undefined (coef = a F Z). float32 or
// float64, one dtype and device; a finite. F Z is exactly 0 where F = 0, NaN where F is NaN. Not differentiable.
Tensor firing_rule_b_coef(const Tensor& Z, const Tensor& F, double a, const Tensor& dZ = {}, const Tensor& c = {});

// The state recurrence of the low-rank cross-path SSM (docs/firing.md §6), over the time axis of a, u (B, T, R):
//   h_t = a_t ⊙ s_{t-1} + u_t,    s_t = h_t / RMS(h_t) with RMS(h) = sqrt(mean_c h_c² + eps) if rms_norm, else h_t
// from s_0 = s0, (R) shared by the batch or (B, R); eps finite and > 0; on CUDA R <= kSsmScanMaxCudaChannels.
// Returns s (B, T, R). Differentiable in a, u and s0
// (backpropagation through time, a hand-written reverse scan). CPU: a thread per batch row, sequential in time. CUDA:
// with the RMS a block per row, sequential in time; without it (a linear recurrence) a chunked parallel scan over
// (row, chunk of 64 steps, channel) for T >= 128 (cuda/firing_launch.h).
//
//   Tensor s = asc::ssm_scan(a, u, zeros({R}), /*rms_norm=*/true);
Tensor ssm_scan(const Tensor& a, const Tensor& u, const Tensor& s0, bool rms_norm = false, double eps = 1e-6);
// kSsmScanMaxCudaChannels (ops/kernel_types.h, included through ops/geometry.h): the most channels R on CUDA.

// Z = X Wᵀ (N, P) as linear(X, W), X (N, d), W (P, d), with W's gradient deferred: the backward gives X its gradient
// dZ W and W none, and adds dL/dZ (N, P) into *deferred_dZ (set to it when undefined) instead. Rule B with fuse_sgd
// (optim/firing_rules.h) holds deferred_dZ and folds W's product dZᵀ X into its own update at step(); until then the
// deferred gradient is W's .grad in all but storage: Optimizer::zero_grad() drops it, and gradient clipping and DDP's
// all-reduce never see it (the rule refuses the configurations where they would have to: nn/firing.cpp).
//
//   auto dZ = std::make_shared<Tensor>();
//   Tensor Z = asc::linear_deferred_weight_grad(X, W, dZ);   // after backward(): *dZ = dL/dZ, W.grad() undefined
Tensor linear_deferred_weight_grad(const Tensor& X, const Tensor& W, const std::shared_ptr<Tensor>& deferred_dZ);

}  // namespace asc
