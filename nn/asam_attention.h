#pragma once
// ASAM adaptive sparse attention (docs/asam.md): per head, a sparse attention over a pattern of allowed keys and a
// dense attention over all keys, mixed by a learned gate per (sample, head):
//
//   out = g · sparse + (1 − g) · dense,   g = clamp(σ((t − f_c(x)) / τ · f_p(x)), 0.01, 0.99)   g (B, H)
//
// An nn::Attention, so any Transformer block can hold it (the original uses post-norm blocks: norm_first(false)):
//
//   auto opts = asc::nn::AsamAttentionOptions(128, 4).patterns({"window", "global", "random"}).window(64);
//   auto attn = std::make_shared<asc::nn::AsamAttention>(opts);
//   asc::Tensor y = attn->attend(x, {.key_padding_mask = valid, .causal = true});   // (B, T, 128)
//   asc::Tensor g = attn->last_gate();                                               // (B, H), for logging
//   auto block = std::make_shared<asc::nn::TransformerEncoderBlock>(block_opts.norm_first(false),
//                                                                    asc::nn::asam_attention_factory(opts));
//
// Patterns by name (ops/sparse_attention.h says exactly which pairs each allows), united when several are named:
//   "window" (w keys around the query), "strided" (every s-th key), "global" (the first g tokens see and are seen by
//   all), "random" (r keys per query, fixed per sequence length by `seed`), "clustered" (a_i · a_j > θ with
//   a = softmax(q Cᵀ / τ_c) over learnable centroids C (H, c, d_head)), "hierarchical" (own block of b ≈ √T tokens,
//   plus the mean-pooled key and value of every other block as extra columns).
// The gate: x is mean-pooled over 1, 2, 4, … equal segments (pool_scales), the pooled vectors concatenated into
// features φ(x); f_c = φ W_c + b_c (complexity) and f_p = softplus(φ W_p + b_p) (confidence, kept >= 0 so that it
// sharpens the decision and never inverts it); t (H) is learnable, τ = gate_tau. Where the clamp is active g passes
// no gradient. The dense branch is the framework's fused attention (ops/attention.h): no (T, T) scores on the CPU
// kernel's row blocks or cuDNN.
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "nn/attention.h"
#include "nn/transformer.h"  // AttentionFactory
#include "ops/sparse_attention.h"

namespace asc::nn {

// Every option's accepted range, and what 0, negative, NaN / ±inf and INT64_MAX get: docs/asam.md, "Accepted
// options". Integers past what a sequence can use are clamped by the pattern builders (never overflowed); floats
// must be finite; each refusal is an asc::Error at construction.
// The sparse patterns' names (above), in that order.
const std::vector<std::string>& asam_pattern_names();

struct AsamAttentionOptions {
  AsamAttentionOptions(int64_t d_model, int64_t heads) : d_model_(d_model), heads_(heads) {}
  ASC_ARG(int64_t, d_model);
  ASC_ARG(int64_t, heads);
  // The sparse branch: the union of these patterns (names above).
  ASC_ARG(std::vector<std::string>, patterns) = std::vector<std::string>{"window", "global", "random"};
  ASC_ARG(int64_t, window) = 64;         // w >= 1 (w > T: every key within reach)
  ASC_ARG(int64_t, stride) = 16;         // s >= 1 (s >= T: each query its own key)
  ASC_ARG(int64_t, global_tokens) = 2;   // g >= 0 (g > T: every token global, as g = T)
  ASC_ARG(int64_t, random_keys) = 4;     // r >= 1 (a row takes min(r, its candidates): T, causal i + 1)
  ASC_ARG(uint64_t, seed) = 0;           // of the random pattern
  ASC_ARG(int64_t, clusters) = 4;        // c >= 1 centroids per head
  ASC_ARG(double, cluster_tau) = 1.0;    // τ_c > 0
  ASC_ARG(double, cluster_theta) = 0.5;  // θ in [0, 1)
  // Weight of the soft k-means loss that trains the centroids (the 0/1 pattern gives them no task gradient):
  // aux_loss() = ν · mean over (b, h) and the real (unpadded) tokens i of Σ_m a_im |q_i − C_m|², q detached.
  ASC_ARG(double, cluster_loss_weight) = 1.0;
  ASC_ARG(int64_t, block) = 0;  // hierarchical block size; 0: round(√T); > T: one block
  // The gate.
  ASC_ARG(std::vector<int64_t>, pool_scales) = std::vector<int64_t>{1, 2, 4};  // segments per scale, each >= 1
  ASC_ARG(double, gate_tau) = 1.0;                                             // τ > 0
  ASC_ARG(double, threshold_init) = 0.0;                                       // t, finite
  // >= 0: use this constant g instead of the learned gate (1: sparse only, 0: dense only; an ablation); -1: learned.
  ASC_ARG(double, fixed_gate) = -1.0;
  // Inference only (eval mode): a (sample, head) whose g >= this skips the dense branch and outputs the sparse branch
  // alone — an approximation, off by 1 − g ≤ 1 % of (dense − sparse). 0: never skip. At most 0.99 (the clamp).
  ASC_ARG(double, skip_dense_above) = 0.0;
  ASC_ARG(bool, bias) = true;  // of the q, k, v and output projections
};

class AsamAttention : public Attention {
 public:
  explicit AsamAttention(const AsamAttentionOptions& options);
  // x (B, T, D) -> (B, T, D). Self-attention only (args.context must be undefined); args.bias is not supported by
  // the sparse kernel and is refused.
  Tensor attend(const Tensor& x, const AttentionArgs& args) override;
  std::string extra_repr() const override;
  // load_state_dict's check: a loaded threshold t must be finite, as threshold_init must, and so must the centroids
  // (a NaN there would turn every gate, or every clustered pattern, into NaN); refused before anything is copied.
  void check_state(const StateDict& incoming) const override;

  // The sparse pattern attend() uses for this length and causality (the data-independent patterns, cached; with
  // "clustered" the per-head part of the last call is not included).
  SparsePattern pattern(int64_t T, bool causal);
  // The gate g (B, H) of the last call, detached; the gate of an input, differentiable.
  Tensor last_gate() const { return last_gate_.get(); }
  Tensor gate(const Tensor& x, const Tensor& key_padding_mask = {}) const;
  // The centroids' soft k-means loss of the last call (ν-weighted; 0 without "clustered"), to add to the task loss.
  Tensor aux_loss() const;
  // Skip-dense bookkeeping since construction (or reset_skip_counts): (sample, head) pairs that skipped the dense
  // branch, and all pairs seen in eval mode with skip_dense_above set.
  int64_t dense_skipped() const { return skipped_.load(); }
  int64_t dense_considered() const { return considered_.load(); }
  void reset_skip_counts() { skipped_ = 0, considered_ = 0; }

  AsamAttentionOptions options;
  int64_t d_head;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, out_proj;
  std::shared_ptr<Linear> complexity, confidence;  // φ (B, D · Σ scales) -> (B, H)
  Tensor threshold;                                // t (H)
  Tensor centroids;                                // C (H, c, d_head), with "clustered"

 private:
  bool has(const std::string& name) const;
  // The pattern cache, shared by threads running attend() at once (inference); guarded by pattern_mu_.
  std::mutex pattern_mu_;
  SparsePattern cached_pattern_;  // on the CPU
  SparsePattern device_pattern_;  // its copy on the device of the last call, when that is not the CPU
  int64_t cached_T_ = -1;
  bool cached_causal_ = false;
  LastForward<Tensor> last_gate_, aux_loss_;
  std::atomic<int64_t> skipped_{0}, considered_{0};
};

// A factory for the Transformer blocks: every block gets its own AsamAttention with these options. Their d_model and
// heads must be the block's, or 0 to take the block's; another value is an error (attention_shape_for_block).
AttentionFactory asam_attention_factory(const AsamAttentionOptions& options);
// The factory's name until 0.2, renamed with nn::ascender_attention_factory (whose old name was the op's). Removed
// in 0.3.
[[deprecated("renamed asc::nn::asam_attention_factory")]] inline AttentionFactory asam_attention(
    const AsamAttentionOptions& options) {
  return asam_attention_factory(options);
}

}  // namespace asc::nn
