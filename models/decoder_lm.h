#pragma once
// A decoder-only (GPT-style) language model: token embedding, causal Transformer blocks with rotary positions,
// a final norm and an output head tied to the embedding. Tokens (B, T) -> next-token logits (B, T, vocab).
//
//   auto lm = std::make_shared<asc::models::DecoderLM>(asc::models::DecoderLMOptions(/*vocab=*/64).d_model(64));
//   asc::Tensor loss = lm->loss(tokens);                      // mean next-token cross-entropy
//   asc::Tensor more = lm->generate(prompt, /*steps=*/16);    // greedy continuation (B, T + 16)
//
// Accepted options (anything else is an asc::Error naming the value, at construction): vocab, d_model, heads,
// layers, ffn >= 1 (the attention adds its own conditions: the default dense one needs d_model divisible by heads
// and an even head dim for RoPE); dropout, attention_dropout in [0, 1) (NaN refused); the parameters must fit in this
// machine's memory. The attention factory gets the blocks' options; nn::ascender_attention_factory /
// nn::asam_attention_factory refuse options whose d_model or heads differ from the model's (0 takes the model's).
#include "nn/nn.h"

namespace asc::models {

struct DecoderLMOptions {
  explicit DecoderLMOptions(int64_t vocab) : vocab_(vocab) {}
  ASC_ARG(int64_t, vocab);
  ASC_ARG(int64_t, d_model) = 128;
  ASC_ARG(int64_t, heads) = 4;
  ASC_ARG(int64_t, layers) = 2;
  ASC_ARG(int64_t, ffn) = 512;
  ASC_ARG(double, dropout) = 0.0;            // residual and FFN dropout
  ASC_ARG(double, attention_dropout) = 0.0;  // on the attention probabilities (nn::TransformerBlockOptions)
  ASC_ARG(bool, tie_embeddings) = true;      // the output head reuses the token embedding matrix
};

class DecoderLM : public nn::Module {
 public:
  explicit DecoderLM(const DecoderLMOptions& options, const nn::AttentionFactory& attention = nn::dense_attention);
  Tensor forward(const Tensor& tokens) override;  // (B, T) int64 -> (B, T, vocab)
  // Mean cross-entropy of predicting tokens[:, 1:] from tokens[:, :-1].
  Tensor loss(const Tensor& tokens);
  // Greedy decoding of `steps` more tokens (no KV cache: re-runs the prefix each step). (B, T) -> (B, T + steps).
  Tensor generate(const Tensor& prompt, int64_t steps);

  DecoderLMOptions options;
  std::shared_ptr<nn::Embedding> tok_emb;
  std::shared_ptr<nn::ModuleList> blocks;
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> head;  // only when embeddings are not tied
};

}  // namespace asc::models
