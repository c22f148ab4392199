#pragma once
// The ASCender attention core (docs/ascender.md) on projected heads, as ops: the readable reference composed from
// framework ops, with its masks, window and normalisation helpers. The layer around it (projections, learnable
// scalars, schedule) is nn::AscenderAttention (nn/ascender_attention.h).
//
//   asc::AscenderCoreArgs a;  // k, τ, α per head; ω, λ, δ, κ, τ_score as (H) tensors; masks; switches
//   asc::Tensor y = asc::ascender_attention_reference(q_rot, k_rot, k, v, z, e, a);   // (B, H, T, d)
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/kernel_types.h"  // GatePosition, AscenderConfig, AscenderKernelInputs, AscenderKernelState

namespace asc {

// What the attention computed, per head, detached, on request (AscenderAttention::need_decomposition). Scores are
// (B, H, T, T); gates (B, H, T, 1). S = S_base + ω_a align + ω_s sep + ω_c coh + bias, A = softmax(S / τ_score).
struct AscenderDecomposition {
  Tensor S_base, align, sep, coh, S, A;  // align/sep/coh: the normalised terms β̃ (0 where a term is off)
  Tensor raw_align, raw_sep, raw_coh;    // β before normalisation (before_norm) or r (after_norm), 0 off
  Tensor gamma_align, eta, gamma_coh;    // the gates
};

// ---- the attention core on projected heads ---------------------------------------------------------------------
// Everything the core reads besides the heads: the configuration (ops/kernel_types.h: AscenderConfig — k, τ, α per
// head, switches, window) and, as tensors of shape (H) already mapped to their domain (λ, κ, τ_score positive), the
// learnable scalars; masks; the training switches.
struct AscenderCoreArgs : AscenderConfig {
  Tensor omega_align, omega_sep, omega_coh, lambda_align, lambda_sep, lambda_coh, delta, kappa, tau_score;  // (H)
  Tensor keep_mask = {};  // bool broadcastable to (B, H, T, T); true = attend; undefined = every key
  Tensor bias = {};       // additive β^other broadcastable to (B, H, T, T) (ALiBi, relative positions)
  double dropout = 0.0;
  bool training = false;
  bool want_aux = false;  // compute the auxiliary losses (AscenderAux)
};

// The auxiliary losses of one call (docs §11), differentiable scalars averaged over batch, heads and the query
// rows that attend to something (L_align: rows with a neighbourhood); undefined for a term that is off.
//   L_coh = Σ_j A_ij |z_j - c_i|²,   L_sep = Σ_j A_ij φ_ij,   L_align = 1 - u_i · mean_{l∈N(i)} u_l
struct AscenderAux {
  Tensor coh, sep, align;
};

// The readable reference: the core composed from framework ops (every intermediate (B, H, T, T) tensor is built).
// q, k_rot (B, H, T, d) — k_rot after RoPE, used by the base scores —, k (B, H, T, d) before RoPE, used by
// alignment, v (B, H, T, d), z (B, H, T, d_z), e (B, H, T, d_a). Returns A v (B, H, T, d); fills *out if given.
Tensor ascender_attention_reference(const Tensor& q, const Tensor& k_rot, const Tensor& k, const Tensor& v,
                                    const Tensor& z, const Tensor& e, const AscenderCoreArgs& args,
                                    AscenderDecomposition* out = nullptr, AscenderAux* aux = nullptr);

// The keep-mask (T, T) bool of AscenderMode::Windowed: |i - j| < window, or i < g, or j < g.
Tensor ascender_window_mask(int64_t T, int64_t window, int64_t global_tokens, Device device);

// Row standardisation of docs/ascender.md §6 with the constant-row rule of §12.3: over the kept entries of each
// row (keep undefined: all), (x - μ) / (σ + eps); 0 on rows with σ <= 1e-5 max|x| (and on masked entries).
Tensor ascender_normalize(const Tensor& x, const Tensor& keep, double eps);

// ---- the fused op ---------------------------------------------------------------------------------------------
// The same computation as ascender_attention_reference, through the device's fused kernel when it takes the
// inputs (ops/kernel_list.inc: ascender_*; the CPU kernel keeps every (rows, T) quantity in per-thread tiles and
// never allocates (B, H, T, T)), else through the reference. The reference also runs what the kernels do not
// produce: the decomposition, the auxiliary losses, attention dropout, a bias that needs a gradient.
Tensor ascender_attention(const Tensor& q, const Tensor& k_rot, const Tensor& k, const Tensor& v, const Tensor& z,
                          const Tensor& e, const AscenderCoreArgs& args, AscenderDecomposition* out = nullptr,
                          AscenderAux* aux = nullptr);

// Which implementation ascender_attention uses: Auto (fused when the inputs qualify), Reference, or Fused (an
// error when they do not). Process-wide.
enum class AscenderBackend { Auto, Reference, Fused };
void set_ascender_backend(AscenderBackend backend);
AscenderBackend ascender_backend();
// "fused (CPU)" / "fused (CUDA)", or "reference: " and why the device's fused kernel does not run these inputs.
std::string ascender_choice(const Tensor& q, const Tensor& k_rot, const Tensor& k, const Tensor& v, const Tensor& z,
                            const Tensor& e, const AscenderCoreArgs& args, bool want_decomposition = false);

}  // namespace asc
