#include "nn/transformer.h"

#include <cmath>
#include <typeinfo>

#include "core/error.h"
#include "core/format.h"
#include "ops/ops.h"

namespace asc::nn {

std::shared_ptr<Attention> dense_attention(const TransformerBlockOptions& o) {
  return std::make_shared<MultiHeadAttention>(
      MultiHeadAttentionOptions(o.d_model(), o.heads()).dropout(o.attention_dropout()).rope(o.rope()));
}

std::pair<int64_t, int64_t> attention_shape_for_block(const char* who, int64_t d_model, int64_t heads,
                                                      const TransformerBlockOptions& block) {
  ASC_CHECK(d_model == 0 || d_model == block.d_model(),
            "{}: the attention options have d_model {} but the block (model) has d_model {}; make them equal, or "
            "leave the attention's d_model 0 to take the block's",
            who, d_model, block.d_model());
  ASC_CHECK(heads == 0 || heads == block.heads(),
            "{}: the attention options have heads {} but the block (model) has heads {}; make them equal, or leave "
            "the attention's heads 0 to take the block's",
            who, heads, block.heads());
  return {block.d_model(), block.heads()};
}

TransformerEncoderBlock::TransformerEncoderBlock(const TransformerBlockOptions& o, const AttentionFactory& attention)
    : TransformerEncoderBlock(o, attention, "TransformerEncoderBlock") {}

TransformerEncoderBlock::TransformerEncoderBlock(const TransformerBlockOptions& o, const AttentionFactory& attention,
                                                 const char* type_name)
    : Module(type_name), options(o) {
  ASC_CHECK(o.d_model() > 0 && o.heads() > 0 && o.ffn() > 0, "{}: d_model {}, heads {} and ffn {} must be positive",
            type_name, o.d_model(), o.heads(), o.ffn());
  ASC_CHECK(o.dropout() >= 0 && o.dropout() < 1, "{}: dropout {} not in [0, 1)", type_name, o.dropout());
  ASC_CHECK(o.attention_dropout() >= 0 && o.attention_dropout() < 1, "{}: attention_dropout {} not in [0, 1)",
            type_name, o.attention_dropout());
  ASC_CHECK(std::isfinite(o.layer_norm_eps()) && o.layer_norm_eps() >= 0,
            "{}: layer_norm_eps must be finite and >= 0, got {}", type_name, o.layer_norm_eps());
  ASC_CHECK(o.activation() == "gelu" || o.activation() == "relu" || o.activation() == "silu",
            "{}: unknown activation '{}' (gelu, relu, silu)", type_name, o.activation());
  ASC_CHECK(attention != nullptr, "{}: empty attention factory", type_name);
  std::shared_ptr<Attention> a = attention(o);
  ASC_CHECK(a != nullptr, "{}: the attention factory returned null", type_name);
  attn = register_module("attn", a);
  norm1 =
      register_module("norm1", std::make_shared<LayerNorm>(LayerNormOptions({o.d_model()}).eps(o.layer_norm_eps())));
  norm2 =
      register_module("norm2", std::make_shared<LayerNorm>(LayerNormOptions({o.d_model()}).eps(o.layer_norm_eps())));
  linear1 = register_module("linear1", std::make_shared<Linear>(o.d_model(), o.ffn()));
  linear2 = register_module("linear2", std::make_shared<Linear>(o.ffn(), o.d_model()));
  dropout = register_module("dropout", std::make_shared<Dropout>(o.dropout()));
}

Tensor TransformerEncoderBlock::ffn(const Tensor& x) {
  const std::string& act = options.activation();
  // linear1's bias, the activation and the dropout in one pass (bias_activation_dropout: the same values and mask),
  // unless a hook or a subclass of Linear / Dropout has to see those steps one by one.
  const bool plain = typeid(*linear1) == typeid(Linear) && typeid(*dropout) == typeid(Dropout) &&
                     !linear1->has_forward_hooks() && !dropout->has_forward_hooks();
  if (plain) {
    const Activation a = act == "gelu" ? Activation::Gelu : act == "relu" ? Activation::Relu : Activation::Silu;
    Tensor h =
        bias_activation_dropout(linear(x, linear1->weight), linear1->bias, a, dropout->p, dropout->is_training());
    return (*linear2)(h);
  }
  Tensor h = (*linear1)(x);
  h = act == "gelu" ? gelu(h) : act == "relu" ? relu(h) : silu(h);
  return (*linear2)((*dropout)(h));
}

Tensor TransformerEncoderBlock::forward(const Tensor& x, const AttentionArgs& args) {
  ASC_CHECK(x.defined() && x.dim() == 3 && x.size(2) == options.d_model(), "{}: expected x (B, T, {}), got {}",
            type_name(), options.d_model(), x.defined() ? x.shape() : Shape{});
  if (options.norm_first()) {
    Tensor h = x + (*dropout)((*attn)((*norm1)(x), args));
    return h + (*dropout)(ffn((*norm2)(h)));
  }
  Tensor h = (*norm1)(x + (*dropout)((*attn)(x, args)));
  return (*norm2)(h + (*dropout)(ffn(h)));
}

Tensor TransformerEncoderBlock::forward_incremental(const Tensor& x, KVCache& cache) {
  ASC_CHECK(x.defined() && x.dim() == 3 && x.size(2) == options.d_model(), "{}: expected x (B, t, {}), got {}",
            type_name(), options.d_model(), x.defined() ? x.shape() : Shape{});
  if (options.norm_first()) {
    Tensor h = x + (*dropout)(attn->attend_incremental((*norm1)(x), cache));
    return h + (*dropout)(ffn((*norm2)(h)));
  }
  Tensor h = (*norm1)(x + (*dropout)(attn->attend_incremental(x, cache)));
  return (*norm2)(h + (*dropout)(ffn(h)));
}

std::string TransformerEncoderBlock::extra_repr() const {
  return fmt::format("d_model={}, heads={}, ffn={}, dropout={}, attention_dropout={}, activation={}, norm_first={}",
                     options.d_model(), options.heads(), options.ffn(), options.dropout(), options.attention_dropout(),
                     options.activation(), options.norm_first());
}

}  // namespace asc::nn
