#include "nn/attention.h"

#include <cmath>

#include "core/error.h"
#include "core/format.h"
#include "nn/positional.h"
#include "ops/ops.h"

namespace asc::nn {

Tensor attention_keep_mask(const AttentionArgs& args, int64_t batch, int64_t t_q, int64_t s_k, Device device,
                           const char* who) {
  Tensor keep;
  if (args.key_padding_mask.defined()) {
    const Tensor& m = args.key_padding_mask;
    ASC_CHECK(m.dtype() == kBool && m.dim() == 2 && m.size(0) == batch && m.size(1) == s_k,
              "{}: key_padding_mask must be bool (B, S) = ({}, {}), got {} {}", who, batch, s_k, m.dtype(), m.shape());
    ASC_CHECK(m.device() == device, "{}: key_padding_mask is on {}, the input on {}", who, m.device(), device);
    keep = m.view({batch, 1, 1, s_k});
  }
  if (args.causal) {
    Tensor causal = causal_keep_mask(t_q, s_k, device).view({1, 1, t_q, s_k});
    keep = keep.defined() ? logical_and(keep, causal) : causal;
  }
  return keep;
}

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionOptions& o)
    : Attention("MultiHeadAttention"), options(o) {
  ASC_CHECK(o.d_model() > 0 && o.heads() > 0 && o.d_model() % o.heads() == 0,
            "MultiHeadAttention: d_model {} must be a positive multiple of heads {}", o.d_model(), o.heads());
  ASC_CHECK(o.dropout() >= 0 && o.dropout() < 1, "MultiHeadAttention: dropout {} not in [0, 1)", o.dropout());
  ASC_CHECK(!o.rope() || (o.d_model() / o.heads()) % 2 == 0, "MultiHeadAttention: RoPE needs an even head dim, got {}",
            o.d_model() / o.heads());
  auto proj = [&] { return std::make_shared<Linear>(LinearOptions(o.d_model(), o.d_model()).bias(o.bias())); };
  q_proj = register_module("q_proj", proj());
  k_proj = register_module("k_proj", proj());
  v_proj = register_module("v_proj", proj());
  out_proj = register_module("out_proj", proj());
  if (o.rope())
    rope = register_module("rope", std::make_shared<RotaryEmbedding>(o.d_model() / o.heads(), o.rope_max_len()));
}

Tensor MultiHeadAttention::attend(const Tensor& x, const AttentionArgs& args) {
  const int64_t D = options.d_model(), H = options.heads(), Dh = D / H;
  ASC_CHECK(x.defined() && x.dim() == 3 && x.size(2) == D, "MultiHeadAttention: expected x (B, T, {}), got {}", D,
            x.defined() ? x.shape() : Shape{});
  const Tensor& ctx = args.context.defined() ? args.context : x;
  ASC_CHECK(ctx.dim() == 3 && ctx.size(0) == x.size(0) && ctx.size(2) == D,
            "MultiHeadAttention: context must be (B={}, S, {}), got {}", x.size(0), D, ctx.shape());
  const int64_t B = x.size(0), T = x.size(1), S = ctx.size(1);
  // Padding only: causality goes to the attention core as a flag, which the fused kernels take without a mask.
  AttentionArgs padding = args;
  padding.causal = false;
  Tensor keep = attention_keep_mask(padding, B, T, S, x.device(), "MultiHeadAttention");

  // (B, T, D) -> (B, H, T, Dh)
  auto heads = [&](const Tensor& t, int64_t len) { return t.view({B, len, H, Dh}).permute({0, 2, 1, 3}); };
  Tensor q, k, v;
  if (args.context.defined()) {  // cross-attention: keys and values from the context, in one product
    q = heads((*q_proj)(x), T);
    TensorList kv = linear_group({k_proj.get(), v_proj.get()}, ctx);
    k = heads(kv[0], S), v = heads(kv[1], S);
  } else {  // self-attention: the three projections in one product
    TensorList qkv = linear_group({q_proj.get(), k_proj.get(), v_proj.get()}, x);
    q = heads(qkv[0], T), k = heads(qkv[1], S), v = heads(qkv[2], S);
  }
  if (rope) {
    q = rope->forward(q, S - T);  // queries sit at the end of the key sequence
    k = rope->forward(k, 0);
  }
  Tensor w;
  Tensor y = scaled_dot_product_attention(q, k, v,
                                          {.keep_mask = keep,
                                           .bias = args.bias,
                                           .causal = args.causal,
                                           .dropout = options.dropout(),
                                           .training = is_training(),
                                           .weights = args.need_weights ? &w : nullptr});
  weights_.set(w);
  return (*out_proj)(y.permute({0, 2, 1, 3}).reshape({B, T, D}));  // (B, T, D)
}

Tensor Attention::attend_incremental(const Tensor&, KVCache&) {
  ASC_THROW("{}: no incremental (KV-cached) attention: it attends over the whole sequence each time", type_name());
}

Tensor MultiHeadAttention::attend_incremental(const Tensor& x, KVCache& cache) {
  const int64_t D = options.d_model(), H = options.heads(), Dh = D / H;
  ASC_CHECK(x.defined() && x.dim() == 3 && x.size(2) == D && x.size(1) >= 1,
            "MultiHeadAttention.attend_incremental: expected x (B, t >= 1, {}), got {}", D,
            x.defined() ? x.shape() : Shape{});
  const int64_t B = x.size(0), t = x.size(1), past = cache.length();
  ASC_CHECK(past == 0 || (cache.k.dim() == 4 && cache.k.size(0) == B && cache.k.size(1) == H && cache.k.size(3) == Dh &&
                          cache.v.defined() && cache.v.shape() == cache.k.shape()),
            "MultiHeadAttention.attend_incremental: a cache of keys {} for x {} (expected (B={}, H={}, S, {}))",
            cache.k.shape(), x.shape(), B, H, Dh);
  auto heads = [&](const Tensor& u) { return u.view({B, t, H, Dh}).permute({0, 2, 1, 3}); };  // (B, H, t, Dh)
  TensorList qkv = linear_group({q_proj.get(), k_proj.get(), v_proj.get()}, x);
  Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  if (rope) q = rope->forward(q, past), k = rope->forward(k, past);  // positions past .. past + t - 1
  cache.k = past == 0 ? k.contiguous() : cat({cache.k, k}, 2);       // (B, H, past + t, Dh)
  cache.v = past == 0 ? v.contiguous() : cat({cache.v, v}, 2);
  // causal with the offset S - t: new query i sees keys 0 .. past + i
  Tensor y = scaled_dot_product_attention(q, cache.k, cache.v,
                                          {.causal = true, .dropout = options.dropout(), .training = is_training()});
  return (*out_proj)(y.permute({0, 2, 1, 3}).reshape({B, t, D}));  // (B, t, D)
}

std::string MultiHeadAttention::extra_repr() const {
  return fmt::format("d_model={}, heads={}, dropout={}, rope={}", options.d_model(), options.heads(), options.dropout(),
                     options.rope());
}

}  // namespace asc::nn
