#pragma once
// ASCender swarm attention (docs/ascender.md): dense attention scores plus three biases computed from learned
// latent geometry — alignment (attend to keys that point like your neighbours' keys), separation (attend less to
// near-duplicates in a crowded region), cohesion (attend to tokens near your local centroid) — each normalised per
// row and weighted by a learnable ω. An nn::Attention, so any Transformer block can hold it:
//
//   auto opts = asc::nn::AscenderAttentionOptions(128, 2).k({16}).gate_position(asc::nn::GatePosition::AfterNorm);
//   auto attn = std::make_shared<asc::nn::AscenderAttention>(opts);
//   asc::Tensor y = attn->attend(x, {.key_padding_mask = valid, .causal = true});      // (B, T, 128)
//   auto block = std::make_shared<asc::nn::TransformerEncoderBlock>(block_opts,
//   asc::nn::ascender_attention_factory(opts));
//
// Per head h, on x (B, T, d_model): q, k, v = x W_Q, x W_K, x W_V (d_head each), z = x U_h (d_z, latent
// coordinates), e = x P_h (d_a, semantic projection; written h in the docs). With w^τ_ij = exp(-|z_i - z_j|² / τ),
// a_ij = cos(e_i, e_j) and N(i) = the top-k_h keys j != i by a_ij among the kept keys:
//   align: β_ij = λ_a γ_a(i) k̂_j·u_i,          u_i = normalize(Σ_{l∈N(i)} k̂_l), γ_a = σ(-α_a (1 - |mean_N k̂|²))
//   sep:   β_ij = -λ_s η_i w^{τs}_ij [a_ij - δ]_+,   η_i = min(1, Σ_{l≠i} w^{τs}_il / κ)
//   coh:   β_ij = -λ_c γ_c(i) |z_j - c_i|² / τ_c,   c_i = Σ_l w^{τc}_il z_l / Σ_l w^{τc}_il, γ_c = σ(-α_c Var_i)
//   S = q kᵀ/√d_head + Σ ω_⋆ β̃_⋆ + bias;   A = softmax(S / τ_score, masked);   y = concat_h(A v) W_O
// β̃ is β standardised over row i's kept keys (population std, ε = 1e-6); a row whose β is constant (σ_i <= 1e-5
// max|β_ij|) gets β̃ = 0 and passes no gradient through σ_i. With GatePosition::BeforeNorm (the original order)
// that normalisation cancels λ, γ, η and 1/τ_c — they are inert; AfterNorm multiplies them after it, so they act.
// A row with fewer than k_h selectable keys (early causal rows, padding) uses all of them.
#include <string>
#include <vector>

#include "nn/attention.h"
#include "nn/transformer.h"  // AttentionFactory
#include "ops/ascender.h"

namespace asc::nn {

// Which keys each row's geometry and attention range over (docs/ascender.md §8).
enum class AscenderMode {
  Full,      // every kept key
  Windowed,  // keys within `window` of the query plus the first `global_tokens` tokens (whose own rows are full):
             // neighbourhoods, kernels, centroids, variances and row statistics all restricted to that set
  Reuse,     // full, but N(i) = the top-k of the base scores q·k instead of the affinities (one selection pass)
};

struct AscenderAttentionOptions {
  AscenderAttentionOptions(int64_t d_model, int64_t heads) : d_model_(d_model), heads_(heads) {}
  ASC_ARG(int64_t, d_model);
  ASC_ARG(int64_t, heads);
  ASC_ARG(int64_t, d_z) = 0;  // latent coordinates per head; 0: d_head / 2
  ASC_ARG(int64_t, d_a) = 0;  // semantic projection per head; 0: d_head / 2
  // Per-head configuration: one value (every head) or one per head.
  ASC_ARG(std::vector<int64_t>, k) = {16};            // neighbourhood size k_h (>= 1)
  ASC_ARG(std::vector<double>, tau_sep) = {1.0};      // separation kernel temperature (> 0)
  ASC_ARG(std::vector<double>, tau_coh) = {1.0};      // cohesion kernel temperature (> 0)
  ASC_ARG(std::vector<double>, alpha_align) = {1.0};  // alignment gate sharpness (>= 0)
  ASC_ARG(std::vector<double>, alpha_coh) = {1.0};    // cohesion gate sharpness (>= 0)
  ASC_ARG(bool, neighbors_include_self) = false;      // j = i may be its own neighbour (the reference code's choice)
  ASC_ARG(GatePosition, gate_position) = GatePosition::BeforeNorm;
  ASC_ARG(AscenderMode, mode) = AscenderMode::Full;
  ASC_ARG(int64_t, window) = 128;       // Windowed: a query sees keys j with |i - j| < window (>= 1)
  ASC_ARG(int64_t, global_tokens) = 4;  // Windowed: tokens 0 .. g-1 see and are seen by every token
  ASC_ARG(bool, use_align) = true;      // switch a bias off for ablations
  ASC_ARG(bool, use_sep) = true;
  ASC_ARG(bool, use_coh) = true;
  // Initial values of the learnable per-head scalars; λ, κ and τ_score stay positive (stored through softplus).
  ASC_ARG(double, omega_init) = 0.1;   // ω_align, ω_sep, ω_coh
  ASC_ARG(double, lambda_init) = 1.0;  // λ_align, λ_sep, λ_coh
  ASC_ARG(double, delta_init) = 0.2;
  ASC_ARG(double, kappa_init) = 32.0;
  ASC_ARG(double, tau_score_init) = 1.0;
  ASC_ARG(double, norm_eps) = 1e-6;  // ε of the row normalisation
  ASC_ARG(double, dropout) = 0.0;    // on the attention probabilities, in training mode
  ASC_ARG(bool, bias) = true;        // biases of the q, k, v and output projections
  ASC_ARG(bool, rope) = false;       // rotary embedding on q and k of the base scores (alignment uses k before it)
  ASC_ARG(int64_t, rope_max_len) = 4096;
  // Auxiliary losses (docs §11), each weight ν >= 0 (0: off): aux_loss() = Σ ν L after aux_start_step.
  ASC_ARG(double, aux_coh) = 0.0;
  ASC_ARG(double, aux_sep) = 0.0;
  ASC_ARG(double, aux_align) = 0.0;
  // Schedule (docs §11), on the layer's step counter (a buffer, so it checkpoints with the model; one step per
  // training-mode forward): ω ramps as min(1, step / warmup_steps); separation joins at sep_start_step; the
  // auxiliary losses count from aux_start_step (-1: warmup_steps).
  ASC_ARG(int64_t, warmup_steps) = 0;
  ASC_ARG(int64_t, sep_start_step) = 0;
  ASC_ARG(int64_t, aux_start_step) = -1;
};

// The core and its types live with the op (ops/ascender.h); nn names them too.
using asc::ascender_attention_reference;
using asc::ascender_normalize;
using asc::ascender_window_mask;
using asc::AscenderAux;
using asc::AscenderCoreArgs;
using asc::AscenderDecomposition;
using asc::GatePosition;

class RotaryEmbedding;

class AscenderAttention : public Attention {
 public:
  explicit AscenderAttention(const AscenderAttentionOptions& options);
  // x (B, T, D) -> (B, T, D). Self-attention only (args.context must be undefined).
  Tensor attend(const Tensor& x, const AttentionArgs& args) override;
  std::string extra_repr() const override;

  // The learnable scalars in their domain, (H) each.
  Tensor lambda_align() const;
  Tensor lambda_sep() const;
  Tensor lambda_coh() const;
  Tensor kappa() const;
  Tensor tau_score() const;

  // Keep the decomposition of the next calls (costs the (B, H, T, T) copies).
  bool need_decomposition = false;
  AscenderDecomposition decomposition() const { return decomposition_.get(); }
  // Σ ν L of the last call, differentiable (add it to the task loss); a zero scalar when no auxiliary loss is on
  // or before aux_start_step. aux() has the separate terms.
  Tensor aux_loss() const;
  AscenderAux aux() const { return aux_.get(); }

  // The schedule's step counter (the `step` buffer) and the factors it gives now.
  int64_t step() const;
  void set_step(int64_t step);
  double omega_scale() const;  // min(1, step / warmup_steps)
  bool separation_active() const { return step() >= options.sep_start_step(); }
  bool aux_active() const;

  AscenderAttentionOptions options;
  int64_t d_head, d_z, d_a;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, out_proj;
  std::shared_ptr<Linear> z_proj, e_proj;  // U_h and P_h of every head, (d_model -> H d_z), (d_model -> H d_a)
  std::shared_ptr<RotaryEmbedding> rope;
  // Per-head learnable scalars (H); the *_raw ones pass through softplus.
  Tensor omega_align, omega_sep, omega_coh, delta;
  Tensor lambda_align_raw, lambda_sep_raw, lambda_coh_raw, kappa_raw, tau_score_raw;
  Tensor step_buffer;  // int64 scalar, persistent

 private:
  // The per-head configuration, expanded from the options once (one value per head).
  std::vector<int64_t> k_h_;
  std::vector<double> tau_sep_h_, tau_coh_h_, alpha_align_h_, alpha_coh_h_;
  LastForward<AscenderDecomposition> decomposition_;
  void check_state(const StateDict& incoming) const override;
  LastForward<AscenderAux> aux_;
  LastForward<Tensor> aux_loss_;
};

// A factory for the Transformer blocks: every block gets its own AscenderAttention with these options. Their d_model
// and heads must be the block's, or 0 to take the block's; another value is an error (attention_shape_for_block). Its
// dropout, when 0, is the block's attention_dropout.
AttentionFactory ascender_attention_factory(const AscenderAttentionOptions& options);
// The factory's name until 0.2: it shared the name of the op asc::ascender_attention. Removed in 0.3.
[[deprecated(
    "renamed asc::nn::ascender_attention_factory (the op asc::ascender_attention keeps its "
    "name)")]] inline AttentionFactory
ascender_attention(const AscenderAttentionOptions& options) {
  return ascender_attention_factory(options);
}

}  // namespace asc::nn
