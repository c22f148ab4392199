#pragma once
// A decoder-only (GPT-style) language model: token embedding, causal Transformer blocks with rotary positions,
// a final norm and an output head tied to the embedding. Tokens (B, T) -> next-token logits (B, T, vocab).
//
//   auto lm = std::make_shared<asc::models::DecoderLM>(asc::models::DecoderLMOptions(/*vocab=*/64).d_model(64));
//   asc::Tensor loss = lm->loss(tokens);                      // mean next-token cross-entropy
//   asc::Tensor more = lm->generate(prompt, /*steps=*/16);    // greedy continuation (B, T + 16)
//   asc::Tensor text = lm->generate(prompt, {.max_new_tokens = 200, .temperature = 0.8, .top_k = 40});  // sampled
//
// Accepted options (anything else is an asc::Error naming the value, at construction): vocab, d_model, heads,
// layers, ffn >= 1 (the attention adds its own conditions: the default dense one needs d_model divisible by heads
// and an even head dim for RoPE); dropout, attention_dropout in [0, 1) (NaN refused); the parameters must fit in this
// machine's memory. The attention factory gets the blocks' options; nn::ascender_attention_factory /
// nn::asam_attention_factory refuse options whose d_model or heads differ from the model's (0 takes the model's).
#include <functional>
#include <vector>

#include "core/generator.h"
#include "nn/nn.h"

namespace asc::models {

// How DecoderLM::generate picks each next token: greedy (temperature 0), or sampled from softmax(logits /
// temperature) restricted to the top_k most likely tokens and to the smallest set whose probability reaches top_p.
struct GenerateOptions {
  int64_t max_new_tokens = 16;
  double temperature = 1.0;  // 0: greedy (argmax); > 0: sampling
  int64_t top_k = 0;         // 0: every token
  double top_p = 1.0;        // in (0, 1]: nucleus sampling; 1: every token
  // A row that produces one of these stops: its later positions repeat that token; generation ends when every row
  // has stopped (or after max_new_tokens).
  std::vector<int64_t> stop_tokens;
  bool use_cache = true;           // keys and values cached per layer where every attention supports it
  Generator* generator = nullptr;  // the sampling's random numbers (default_generator() when null)
  // Called after every step with the new tokens (B) on the CPU, for streaming.
  std::function<void(const Tensor& next)> on_token;
  // Called after every step with the sequences so far (B, T + s); true ends the generation (a stop string found).
  std::function<bool(const Tensor& seq)> stop_when;
};

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
  // Greedy decoding of `steps` more tokens. (B, T) -> (B, T + steps).
  Tensor generate(const Tensor& prompt, int64_t steps);
  // Decoding as `o` says, in evaluation mode (the module's mode is restored). (B, T) -> (B, T + n), n <=
  // max_new_tokens. With the cache the prompt is run once and each step runs one position; without it (or when an
  // attention cannot cache: ASCender, ASAM) each step recomputes the whole sequence. The logits are the same either
  // way, up to float rounding.
  Tensor generate(const Tensor& prompt, const GenerateOptions& o);
  // Whether every block's attention can decode incrementally.
  bool supports_kv_cache() const;
  // The next-token logits (B, V) of tokens x_new (B, t) following the positions `caches` hold (one per block,
  // empty at first), which it extends: the last position's row of forward(all tokens).
  Tensor forward_incremental(const Tensor& x_new, std::vector<nn::KVCache>& caches);

  DecoderLMOptions options;
  std::shared_ptr<nn::Embedding> tok_emb;
  std::shared_ptr<nn::ModuleList> blocks;
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> head;  // only when embeddings are not tied
};

}  // namespace asc::models
