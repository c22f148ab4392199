#pragma once
// Attention as a pluggable component. Every attention mechanism (dense multi-head attention here; ASCender
// swarm attention and ASAM sparse attention later) derives from nn::Attention and maps (B, T, D) -> (B, T, D)
// given the same AttentionArgs, so a Transformer block can hold any of them.
//
//   auto mha = std::make_shared<asc::nn::MultiHeadAttention>(asc::nn::MultiHeadAttentionOptions(128, 4));
//   asc::Tensor y = mha->attend(x, {.key_padding_mask = valid, .causal = true, .need_weights = true});
//   asc::Tensor A = mha->attention_weights();                    // (B, H, T, T), rows sum to 1 over kept keys
#include "nn/linear.h"
#include "nn/module.h"
#include "ops/attention.h"

namespace asc::nn {

// What a block hands to its attention besides the input x (B, T, D).
struct AttentionArgs {
  Tensor key_padding_mask = {};  // (B, S) bool, true = real token (attend to it), false = padding; undefined = none
  bool causal = false;           // query t attends to keys s <= t (+ the offset S - T when S > T)
  Tensor bias = {};              // additive score bias broadcastable to (B, H, T, S): ALiBi, relative positions
  Tensor context = {};           // (B, S, D) source of keys/values for cross-attention; undefined = self-attention
  bool need_weights = false;     // keep the attention probabilities for attention_weights()
};

// One attention layer's memory of the keys and values it has seen, for incremental decoding (models::DecoderLM's
// generate): k, v (B, H, S, Dh) each, after RoPE; undefined before the first call.
struct KVCache {
  Tensor k, v;
  int64_t length() const { return k.defined() ? k.size(2) : 0; }
};

class Attention : public Module {
 public:
  using Module::Module;
  // x (B, T, D) -> (B, T, D).
  virtual Tensor attend(const Tensor& x, const AttentionArgs& args) = 0;
  // Incremental causal self-attention: x_new (B, t, D) are the t positions after the cache's S; they attend to the
  // cached keys and values and, causally, to their own, whose keys and values are appended to `cache`. The result
  // equals the last t rows of attend(x_all, {.causal = true}). Only where supports_kv_cache(): ASCender's
  // neighbourhoods and row normalisation and ASAM's clusters and gate are computed over the whole sequence, so a
  // decoder recomputes it for them (DecoderLM::generate does).
  virtual bool supports_kv_cache() const { return false; }
  virtual Tensor attend_incremental(const Tensor& x_new, KVCache& cache);
  // Self-attention with no mask, through the forward hooks.
  Tensor forward(const Tensor& x) override { return attend(x, {}); }
  // attend() through the forward hooks (hooks see x as the input).
  Tensor operator()(const Tensor& x, const AttentionArgs& args) {
    return call_with_hooks(x, [&](const Tensor& in) { return attend(in, args); });
  }
  using Module::operator();
  // The probabilities (B, H, T, S) of the last call, detached, if it set need_weights; undefined otherwise.
  Tensor attention_weights() const { return weights_.get(); }

 protected:
  LastForward<Tensor> weights_;
};

// The boolean keep-mask (B|1, 1, T|1, S) combining a key padding mask and causality; undefined when neither is
// set. Shared by every attention implementation so masks mean the same thing everywhere.
Tensor attention_keep_mask(const AttentionArgs& args, int64_t batch, int64_t t_q, int64_t s_k, Device device,
                           const char* who);

struct MultiHeadAttentionOptions {
  MultiHeadAttentionOptions(int64_t d_model, int64_t heads) : d_model_(d_model), heads_(heads) {}
  ASC_ARG(int64_t, d_model);
  ASC_ARG(int64_t, heads);
  ASC_ARG(double, dropout) = 0.0;         // on the attention probabilities, in training mode
  ASC_ARG(bool, bias) = true;             // biases of the input and output projections
  ASC_ARG(bool, rope) = false;            // rotary position embedding on q and k (positions 0..T-1)
  ASC_ARG(int64_t, rope_max_len) = 4096;  // positions the cached RoPE tables cover
};

class RotaryEmbedding;

// Dense scaled-dot-product multi-head attention:
//   q, k, v = x Wq, ctx Wk, ctx Wv split into H heads of Dh = D / H;
//   A = softmax(q kᵀ / sqrt(Dh) + bias, masked);  y = concat_h(A v) Wo.
class MultiHeadAttention : public Attention {
 public:
  explicit MultiHeadAttention(const MultiHeadAttentionOptions& options);
  Tensor attend(const Tensor& x, const AttentionArgs& args) override;
  bool supports_kv_cache() const override { return true; }
  Tensor attend_incremental(const Tensor& x_new, KVCache& cache) override;
  std::string extra_repr() const override;

  MultiHeadAttentionOptions options;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, out_proj;
  std::shared_ptr<RotaryEmbedding> rope;  // with options.rope(): cos/sin tables cached as (non-persistent) buffers
};

// The scaled-dot-product core (ops/attention.h) under nn's name, as in torch.nn.functional:
//   asc::Tensor y = asc::nn::scaled_dot_product_attention(q, k, v, {.causal = true});
using asc::scaled_dot_product_attention;
using asc::sdpa_backend;
using asc::sdpa_choice;
using asc::SdpaBackend;
using asc::SdpaOptions;
using asc::set_sdpa_backend;

}  // namespace asc::nn
