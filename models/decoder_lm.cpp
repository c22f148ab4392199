#include "models/decoder_lm.h"
#include "core/format.h"
#include "models/checks.h"
#include "ops/ops.h"

#include <limits>

#include "autograd/grad_mode.h"

namespace asc::models {

DecoderLM::DecoderLM(const DecoderLMOptions& o, const nn::AttentionFactory& attention)
    : Module("DecoderLM"), options(o) {
  detail::check_model_options(
      "DecoderLM",
      {{"vocab", o.vocab()}, {"d_model", o.d_model()}, {"heads", o.heads()}, {"layers", o.layers()}, {"ffn", o.ffn()}},
      o.dropout());
  ASC_CHECK(attention != nullptr, "DecoderLM: empty attention factory");
  detail::check_parameter_memory("DecoderLM", static_cast<double>(o.vocab()) * (o.tie_embeddings() ? 1 : 2),
                                 o.d_model(), o.ffn(), o.layers());
  tok_emb = register_module("tok_emb", std::make_shared<nn::Embedding>(o.vocab(), o.d_model()));
  auto block = nn::TransformerBlockOptions(o.d_model(), o.heads())
                   .ffn(o.ffn())
                   .dropout(o.dropout())
                   .attention_dropout(o.attention_dropout())
                   .rope(true);
  blocks = register_module("blocks", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < o.layers(); ++i)
    blocks->push_back(std::make_shared<nn::TransformerDecoderBlock>(block, attention));
  norm = register_module("norm", std::make_shared<nn::LayerNorm>(nn::LayerNormOptions({o.d_model()})));
  // Small embedding init (as GPT-2): tied to the output head, N(0, 1) rows would give logits of size sqrt(D).
  nn::init::normal_(tok_emb->weight, 0.0, 0.02);
  if (!o.tie_embeddings()) head = register_module("head", std::make_shared<nn::Linear>(o.d_model(), o.vocab(), false));
}

Tensor DecoderLM::forward(const Tensor& tokens) {
  ASC_CHECK(tokens.defined() && tokens.dim() == 2 && tokens.size(1) >= 1,
            "DecoderLM: expected tokens (B, T >= 1), got {}", tokens.defined() ? tokens.shape() : Shape{});
  Tensor x = (*tok_emb)(tokens);        // (B, T, D); positions enter through RoPE inside attention
  for (auto& b : *blocks) x = (*b)(x);  // each block: causal self-attention + FFN
  x = (*norm)(x);
  return head ? (*head)(x) : linear(x, tok_emb->weight);  // (B, T, vocab)
}

Tensor DecoderLM::loss(const Tensor& tokens) {
  ASC_CHECK(tokens.defined() && tokens.dim() == 2 && tokens.size(1) >= 2,
            "DecoderLM.loss: expected tokens (B, T >= 2), got {}", tokens.defined() ? tokens.shape() : Shape{});
  const int64_t T = tokens.size(1);
  Tensor logits = forward(tokens.narrow(1, 0, T - 1));      // (B, T-1, V)
  Tensor target = tokens.narrow(1, 1, T - 1).contiguous();  // (B, T-1)
  return cross_entropy(logits.reshape({-1, options.vocab()}), target.reshape({-1}));
}

Tensor DecoderLM::generate(const Tensor& prompt, int64_t steps) {
  ASC_CHECK(prompt.defined() && prompt.dim() == 2 && prompt.size(1) >= 1 && steps >= 0,
            "DecoderLM.generate: expected a prompt (B, T >= 1) and steps >= 0, got {} and {}",
            prompt.defined() ? prompt.shape() : Shape{}, steps);
  // The sequence grows to T + steps tokens: that length must fit in int64.
  ASC_CHECK(steps <= std::numeric_limits<int64_t>::max() - prompt.size(1),
            "DecoderLM.generate: a prompt of {} tokens plus {} steps overflows int64", prompt.size(1), steps);
  NoGradGuard g;
  Tensor seq = prompt;
  for (int64_t s = 0; s < steps; ++s) {
    Tensor last = forward(seq).select(1, seq.size(1) - 1);  // (B, V)
    seq = cat({seq, argmax(last, -1, /*keepdim=*/true)}, 1);
  }
  return seq;
}

}  // namespace asc::models
