#pragma once
// A small Transformer sequence classifier: the reference for how models are written with the nn API. Tokens
// (B, T) int64 -> logits (B, classes). Its attention is chosen by name — "dense" (MultiHeadAttention), "ascender"
// (AscenderAttention, configured by .ascender(...)) or "asam" (AsamAttention, configured by .asam(...); the original
// uses post-norm blocks, .norm_first(false)) — or given as any factory.
//
//   auto model = std::make_shared<asc::models::TransformerClassifier>(
//       asc::models::TransformerClassifierOptions(/*vocab=*/16, /*max_len=*/32, /*classes=*/2).d_model(64).layers(2)
//           .attention("ascender"));
//   asc::Tensor logits = model->forward(tokens);              // (B, 2)
//   asc::Tensor loss = asc::cross_entropy(logits, labels);
//
// Accepted options (anything else is an asc::Error naming the value, at construction):
//   vocab, max_len, classes, d_model, heads, ffn   >= 1 (d_model divisible by heads for "dense");
//   layers >= 1; dropout, attention_dropout in [0, 1) (NaN refused; attention_dropout 0 with asam); attention "dense",
//   "ascender" or "asam"; positional "learned", "sinusoidal", "none", "rope" or "alibi" (rope / alibi with dense or
//   ascender attention only); ascender / asam: their d_model and heads are the model's. Left at 0 (the default here)
//   they take the model's; set,
//     they must equal the model's d_model and heads (a mismatch is refused, naming both, never silently replaced).
//   The parameters must fit in this machine's memory (layers = INT64_MAX is refused, not allocated until killed).
#include "nn/nn.h"

namespace asc::models {

struct TransformerClassifierOptions {
  TransformerClassifierOptions(int64_t vocab, int64_t max_len, int64_t classes)
      : vocab_(vocab), max_len_(max_len), classes_(classes) {}
  ASC_ARG(int64_t, vocab);
  ASC_ARG(int64_t, max_len);
  ASC_ARG(int64_t, classes);
  ASC_ARG(int64_t, d_model) = 128;
  ASC_ARG(int64_t, heads) = 4;
  ASC_ARG(int64_t, layers) = 2;
  ASC_ARG(int64_t, ffn) = 512;
  ASC_ARG(double, dropout) = 0.1;  // residual and FFN dropout
  // On the attention probabilities (dense and ASCender; ASAM has none, so a value > 0 with it is refused). 0 by
  // default: ASCender's fused kernels do not implement it, and a comparison of attentions should regularise them alike.
  ASC_ARG(double, attention_dropout) = 0.0;
  ASC_ARG(bool, norm_first) = true;
  ASC_ARG(std::string, attention) = "dense";  // "dense", "ascender" or "asam"
  // Where positions enter: "learned" (an embedding added to the tokens'), "sinusoidal" (the fixed table added),
  // "none", "rope" (rotary on q and k: dense and ascender) or "alibi" (a per-head linear distance bias on the
  // scores: dense and ascender). ASAM's sparse kernels take neither RoPE nor a score bias.
  ASC_ARG(std::string, positional) = "learned";
  // AscenderAttention's options when attention == "ascender": d_model and heads 0 (take the model's) or equal to the
  // model's; a dropout of 0 takes the model's.
  ASC_ARG(nn::AscenderAttentionOptions, ascender) = nn::AscenderAttentionOptions(0, 0);
  // AsamAttention's options when attention == "asam": d_model and heads 0 (take the model's) or equal to the model's.
  ASC_ARG(nn::AsamAttentionOptions, asam) = nn::AsamAttentionOptions(0, 0);
};

class TransformerClassifier : public nn::Module {
 public:
  // `attention`: a factory that overrides options.attention() (empty: by name).
  explicit TransformerClassifier(const TransformerClassifierOptions& options,
                                 const nn::AttentionFactory& attention = {});
  // tokens (B, T) int64 in [0, vocab); valid (B, T) bool (false = padding) or undefined. Returns (B, classes).
  // Mask polarity: `valid` is true at real tokens — the opposite of PyTorch's src_key_padding_mask (true = padding).
  // The logits read the final-norm outputs mean-pooled over the real tokens only (over all T without a mask).
  Tensor forward(const Tensor& tokens, const Tensor& valid);
  Tensor forward(const Tensor& tokens) override { return forward(tokens, Tensor()); }
  // When true, every forward asks each attention layer to keep its probabilities (B, H, T, T), read afterwards with
  // blocks[i]->attn->attention_weights() — for analysis: ASCender then runs its composed reference path (slower).
  bool need_weights = false;
  // The auxiliary losses of its attention layers from the last forward (ASCender's ν-weighted terms,
  // docs/ascender.md §11; ASAM's centroid loss), to add to the task loss; 0 with dense attention. Call it after
  // forward() in a statement of its own: in `ce(model->forward(x), y) + model->aux_loss()` C++ may evaluate aux_loss()
  // first.
  Tensor aux_loss() const;

  TransformerClassifierOptions options;
  std::shared_ptr<nn::Embedding> tok_emb, pos_emb;            // pos_emb: positional "learned" only
  std::shared_ptr<nn::SinusoidalPositionalEncoding> pos_enc;  // positional "sinusoidal" only
  std::shared_ptr<nn::ALiBi> alibi;                           // positional "alibi" only
  std::shared_ptr<nn::ModuleList> blocks;
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> head;

 private:
  Tensor alibi_bias_;  // the last (H, T, T) ALiBi bias, reused while T, dtype and device stay the same
};

}  // namespace asc::models
