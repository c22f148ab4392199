#include <algorithm>

#include "core/format.h"
#include "models/checks.h"
#include "models/transformer_classifier.h"
#include "ops/ops.h"

namespace asc::models {

TransformerClassifier::TransformerClassifier(const TransformerClassifierOptions& o,
                                             const nn::AttentionFactory& attention)
    : Module("TransformerClassifier"), options(o) {
  using namespace detail;
  check_model_options("TransformerClassifier",
                      {{"vocab", o.vocab()},
                       {"max_len", o.max_len()},
                       {"classes", o.classes()},
                       {"d_model", o.d_model()},
                       {"heads", o.heads()},
                       {"layers", o.layers()},
                       {"ffn", o.ffn()}},
                      o.dropout());
  // The attention's own options must not disagree with the model's width and head count (0 takes the model's).
  if (!attention && o.attention() == "ascender")
    check_attention_shape("TransformerClassifier", "ascender", o.ascender().d_model(), o.ascender().heads(),
                          o.d_model(), o.heads());
  if (!attention && o.attention() == "asam")
    check_attention_shape("TransformerClassifier", "asam", o.asam().d_model(), o.asam().heads(), o.d_model(),
                          o.heads());
  check_parameter_memory("TransformerClassifier", static_cast<double>(o.vocab()) + static_cast<double>(o.max_len()),
                         o.d_model(), o.ffn(), o.layers());
  const std::string& pos = o.positional();
  ASC_CHECK(pos == "learned" || pos == "sinusoidal" || pos == "none" || pos == "rope" || pos == "alibi",
            "TransformerClassifier: unknown positional '{}' (known: learned, sinusoidal, none, rope, alibi)", pos);
  ASC_CHECK(!((pos == "rope" || pos == "alibi") && (attention || o.attention() == "asam")),
            "TransformerClassifier: positional '{}' needs dense or ascender attention chosen by name (ASAM's sparse "
            "kernels take neither RoPE nor a score bias); use learned, sinusoidal or none",
            pos);
  tok_emb = register_module("tok_emb", std::make_shared<nn::Embedding>(o.vocab(), o.d_model()));
  if (pos == "learned") pos_emb = register_module("pos_emb", std::make_shared<nn::Embedding>(o.max_len(), o.d_model()));
  if (pos == "sinusoidal")
    pos_enc = register_module("pos_enc", std::make_shared<nn::SinusoidalPositionalEncoding>(o.d_model(), o.max_len()));
  if (pos == "alibi") alibi = register_module("alibi", std::make_shared<nn::ALiBi>(nn::ALiBiOptions(o.heads())));
  ASC_CHECK(o.attention_dropout() >= 0 && o.attention_dropout() < 1,
            "TransformerClassifier: attention_dropout {} not in [0, 1)", o.attention_dropout());
  ASC_CHECK(o.attention_dropout() == 0 || attention || o.attention() != "asam",
            "TransformerClassifier: ASAM attention has no attention dropout; attention_dropout must be 0, got {}",
            o.attention_dropout());
  auto block = nn::TransformerBlockOptions(o.d_model(), o.heads())
                   .ffn(o.ffn())
                   .dropout(o.dropout())
                   .norm_first(o.norm_first())
                   .attention_dropout(o.attention_dropout())
                   .rope(pos == "rope");
  blocks = register_module("blocks", std::make_shared<nn::ModuleList>());
  nn::AttentionFactory factory = attention;
  if (!factory) {
    ASC_CHECK(o.attention() == "dense" || o.attention() == "ascender" || o.attention() == "asam",
              "TransformerClassifier: unknown attention '{}' (known: dense, ascender, asam)", o.attention());
    // RoPE tables cover the model's max_len (the layers' default, 4096, would refuse a longer sequence mid-run).
    const int64_t rope_len = std::max<int64_t>(o.max_len(), 1);
    auto dense = [rope_len](const nn::TransformerBlockOptions& b) -> std::shared_ptr<nn::Attention> {
      return std::make_shared<nn::MultiHeadAttention>(nn::MultiHeadAttentionOptions(b.d_model(), b.heads())
                                                          .dropout(b.attention_dropout())
                                                          .rope(b.rope())
                                                          .rope_max_len(rope_len));
    };
    factory = o.attention() == "dense" ? nn::AttentionFactory(dense)
              : o.attention() == "ascender"
                  ? nn::ascender_attention_factory(
                        nn::AscenderAttentionOptions(o.ascender()).rope(pos == "rope").rope_max_len(rope_len))
                  : nn::asam_attention_factory(o.asam());
  }
  for (int64_t i = 0; i < o.layers(); ++i)
    blocks->push_back(std::make_shared<nn::TransformerEncoderBlock>(block, factory));
  norm = register_module("norm", std::make_shared<nn::LayerNorm>(nn::LayerNormOptions({o.d_model()})));
  head = register_module("head", std::make_shared<nn::Linear>(o.d_model(), o.classes()));
}

Tensor TransformerClassifier::forward(const Tensor& tokens, const Tensor& valid) {
  ASC_CHECK(tokens.defined() && tokens.dim() == 2 && tokens.size(1) >= 1 && tokens.size(1) <= options.max_len(),
            "TransformerClassifier: expected tokens (B, 1 <= T <= {}), got {}", options.max_len(),
            tokens.defined() ? tokens.shape() : Shape{});
  const int64_t T = tokens.size(1);
  Tensor x = (*tok_emb)(tokens);  // (B, T, D)
  if (pos_emb) x = x + (*pos_emb)(arange(T, {.dtype = kInt64, .device = tokens.device()}));
  if (pos_enc) x = (*pos_enc)(x);
  nn::AttentionArgs args{.key_padding_mask = valid, .need_weights = need_weights};
  if (alibi) {  // (H, T, T), built once per length, dtype and device
    if (!alibi_bias_.defined() || alibi_bias_.size(1) != T || alibi_bias_.dtype() != x.dtype() ||
        alibi_bias_.device() != x.device())
      alibi_bias_ = alibi->bias(T).to(x.dtype()).to(x.device());
    args.bias = alibi_bias_;
  }
  for (auto& b : *blocks) x = std::static_pointer_cast<nn::TransformerEncoderBlock>(b)->forward(x, args);
  x = (*norm)(x);
  if (!valid.defined()) return (*head)(mean(x, {1}));  // (B, D) mean over tokens
  Tensor w = valid.to(x.dtype()).unsqueeze(-1);        // (B, T, 1) masked mean over real tokens
  Tensor pooled = sum(x * w, {1}) / clamp(sum(w, {1}), 1.0, std::nullopt);
  return (*head)(pooled);
}

Tensor TransformerClassifier::aux_loss() const {
  Tensor total = zeros({}, {.dtype = head->weight.dtype(), .device = head->weight.device()});
  for (const auto& b : *blocks) {
    auto block = std::static_pointer_cast<nn::TransformerEncoderBlock>(b);
    if (auto asc = std::dynamic_pointer_cast<nn::AscenderAttention>(block->attn)) total = total + asc->aux_loss();
    if (auto asam = std::dynamic_pointer_cast<nn::AsamAttention>(block->attn)) total = total + asam->aux_loss();
  }
  return total;
}

}  // namespace asc::models
