#pragma once
// Transformer blocks with a pluggable attention. The block owns an nn::Attention built by a factory, so the same
// block runs dense multi-head attention, ASCender swarm attention or ASAM sparse attention.
//
//   auto opts = asc::nn::TransformerBlockOptions(128, 4).ffn(512).dropout(0.1).norm_first(true);
//   auto enc = std::make_shared<asc::nn::TransformerEncoderBlock>(opts);             // dense MHA
//   asc::Tensor y = enc->forward(x, {.key_padding_mask = valid});                     // (B, T, 128)
//   auto dec = std::make_shared<asc::nn::TransformerDecoderBlock>(opts);              // causal self-attention
//   auto custom = std::make_shared<asc::nn::TransformerEncoderBlock>(opts, [](const auto& o) {
//     return std::make_shared<MyAttention>(o.d_model(), o.heads());                    // any nn::Attention
//   });
//
// Pre-norm:  x = x + drop(attn(norm1(x)));  x = x + drop(ffn(norm2(x)))
// Post-norm: x = norm1(x + drop(attn(x)));  x = norm2(x + drop(ffn(x)))
// ffn(x) = linear2(drop(act(linear1(x)))).
#include <functional>
#include <utility>

#include "nn/attention.h"
#include "nn/layers.h"

namespace asc::nn {

struct TransformerBlockOptions {
  TransformerBlockOptions(int64_t d_model, int64_t heads) : d_model_(d_model), heads_(heads), ffn_(4 * d_model) {}
  ASC_ARG(int64_t, d_model);
  ASC_ARG(int64_t, heads);
  ASC_ARG(int64_t, ffn);           // hidden width of the feed-forward net (default 4 d_model)
  ASC_ARG(double, dropout) = 0.0;  // residual and FFN dropout
  // Dropout on the attention probabilities: the default dense attention's, and nn::ascender_attention_factory's when
  // its own options leave dropout at 0. Apart from `dropout` because not every attention has it (ASAM has none) and
  // because ASCender's fused kernels do not implement it (with it, ASCender runs its composed reference: several times
  // slower).
  ASC_ARG(double, attention_dropout) = 0.0;
  ASC_ARG(std::string, activation) = "gelu";  // "gelu", "relu" or "silu"
  ASC_ARG(bool, norm_first) = true;           // pre-norm (true) or post-norm (false)
  ASC_ARG(double, layer_norm_eps) = 1e-5;
  ASC_ARG(bool, rope) = false;  // RoPE in the default multi-head attention
};

// Accepted (checked when a block is built; anything else is an asc::Error naming the value): d_model >= 1,
// heads >= 1, ffn >= 1, dropout and attention_dropout in [0, 1) (NaN refused), activation "gelu" / "relu" / "silu",
// layer_norm_eps finite and >= 0. The attention layer adds its own conditions (dense: d_model divisible by heads; RoPE:
// an even head dim).
using AttentionFactory = std::function<std::shared_ptr<Attention>(const TransformerBlockOptions&)>;
// The default factory: dense MultiHeadAttention with the block's d_model, heads, attention_dropout and rope.
std::shared_ptr<Attention> dense_attention(const TransformerBlockOptions& o);

// For factories built from an attention layer's own options (nn::ascender_attention_factory(opts),
// nn::asam_attention_factory(opts)): the options' (d_model, heads) to build for `block`. Each is either 0, meaning "the
// block's", or must equal the block's: a different value is an asc::Error naming both (`who` and the option), never
// silently replaced.
std::pair<int64_t, int64_t> attention_shape_for_block(const char* who, int64_t d_model, int64_t heads,
                                                      const TransformerBlockOptions& block);

class TransformerEncoderBlock : public Module {
 public:
  explicit TransformerEncoderBlock(const TransformerBlockOptions& options,
                                   const AttentionFactory& attention = dense_attention);
  // x (B, T, D) -> (B, T, D).
  Tensor forward(const Tensor& x, const AttentionArgs& args);
  Tensor forward(const Tensor& x) override { return forward(x, AttentionArgs{}); }
  // The block on the next positions of a causal sequence, its attention incremental (Attention::attend_incremental):
  // x_new (B, t, D) -> (B, t, D), the last t rows of forward(x_all, {.causal = true}).
  Tensor forward_incremental(const Tensor& x_new, KVCache& cache);
  std::string extra_repr() const override;

  TransformerBlockOptions options;
  std::shared_ptr<Attention> attn;
  std::shared_ptr<LayerNorm> norm1, norm2;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<Dropout> dropout;

 protected:
  TransformerEncoderBlock(const TransformerBlockOptions& options, const AttentionFactory& attention,
                          const char* type_name);
  Tensor ffn(const Tensor& x);
};

// Decoder-only block (GPT style): the encoder block with causal self-attention always on.
class TransformerDecoderBlock : public TransformerEncoderBlock {
 public:
  explicit TransformerDecoderBlock(const TransformerBlockOptions& options,
                                   const AttentionFactory& attention = dense_attention)
      : TransformerEncoderBlock(options, attention, "TransformerDecoderBlock") {}
  Tensor forward(const Tensor& x, AttentionArgs args) {
    args.causal = true;
    return TransformerEncoderBlock::forward(x, args);
  }
  Tensor forward(const Tensor& x) override { return forward(x, AttentionArgs{}); }
};

}  // namespace asc::nn
