#include "nn/attention.h"

#include <atomic>
#include <cmath>

#include "autograd/node.h"
#include "core/error.h"
#include "core/format.h"
#include "cuda/cudnn_sdpa.h"
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
    // Query t sits at absolute position t + (S - T), so with S == T this is the usual lower triangle.
    Tensor qpos = arange(0, static_cast<double>(t_q), 1.0, {.dtype = kInt64, .device = device}).view({t_q, 1});
    Tensor kpos = arange(0, static_cast<double>(s_k), 1.0, {.dtype = kInt64, .device = device}).view({1, s_k});
    Tensor causal = le(kpos, qpos + static_cast<double>(s_k - t_q)).view({1, 1, t_q, s_k});
    keep = keep.defined() ? logical_and(keep, causal) : causal;
  }
  return keep;
}

namespace {

std::atomic<SdpaBackend> g_sdpa_backend{SdpaBackend::Auto};

void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  ASC_CHECK(q.defined() && k.defined() && v.defined(), "scaled_dot_product_attention: undefined q, k or v");
  ASC_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
            "scaled_dot_product_attention: expected q, k, v of rank 4 (B, H, T, Dh), got {}, {}, {}", q.shape(),
            k.shape(), v.shape());
  ASC_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3) && k.shape() == v.shape(),
            "scaled_dot_product_attention: incompatible q {}, k {}, v {}", q.shape(), k.shape(), v.shape());
}

// Empty when the fused kernels take these inputs, else why not.
std::string fused_unsupported(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& o) {
  if (!q.device().is_cuda()) return "inputs are not on a CUDA device";
  if (o.keep_mask.defined()) return "a keep_mask";
  if (o.bias.defined()) return "an additive bias";
  if (o.training && o.dropout > 0) return "dropout";
  if (o.weights) return "the probabilities were requested";
  return cuda::cudnn_sdpa_unsupported(q, k, v, o.causal, autograd::needs_grad({&q, &k, &v}));
}

// The composed path: explicit scores, masked softmax, and the product with v.
Tensor sdpa_math(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& o) {
  const int64_t T = q.size(2), S = k.size(2);
  Tensor keep = o.keep_mask;
  if (o.causal) {
    // Query t sits at absolute position t + (S - T), so with S == T this is the usual lower triangle.
    Tensor qpos = arange(0, static_cast<double>(T), 1.0, {.dtype = kInt64, .device = q.device()}).view({T, 1});
    Tensor kpos = arange(0, static_cast<double>(S), 1.0, {.dtype = kInt64, .device = q.device()}).view({1, S});
    Tensor causal = le(kpos, qpos + static_cast<double>(S - T)).view({1, 1, T, S});
    keep = keep.defined() ? logical_and(keep, causal) : causal;
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  Tensor scores = matmul(q, k.transpose(-2, -1)) * scale;  // (B, H, T, S)
  if (o.bias.defined()) scores = scores + o.bias;
  Tensor probs = softmax(scores, -1, keep);  // masked entries 0; fully masked rows all 0
  if (o.weights) *o.weights = probs.detach();
  if (o.training && o.dropout > 0) probs = asc::dropout(probs, o.dropout, true);
  return matmul(probs, v);  // (B, H, T, Dh)
}

// The fused path: cuDNN forward; its backward (recorded when q, k or v needs a gradient) is cuDNN's too.
Tensor sdpa_fused(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  Tensor o, stats;  // (B, H, T, Dh), (B, H, T, 1) float32 log-sum-exp
  cuda::cudnn_sdpa_forward(q.detach(), k.detach(), v.detach(), causal, scale, o, stats);
  if (autograd::needs_grad({&q, &k, &v})) {
    autograd::record("scaled_dot_product_attention(cudnn)", {q, k, v}, {o},
                     [qs = autograd::SavedTensor(q), ks = autograd::SavedTensor(k), vs = autograd::SavedTensor(v),
                      os = autograd::SavedTensor(o), stats, causal, scale](const TensorList& g) -> TensorList {
                       Tensor dq, dk, dv;
                       cuda::cudnn_sdpa_backward(qs.get(), ks.get(), vs.get(), os.get(), g[0], stats, causal, scale,
                                                 dq, dk, dv);
                       return {dq, dk, dv};
                     });
  }
  return o;
}

}  // namespace

void set_sdpa_backend(SdpaBackend backend) { g_sdpa_backend = backend; }
SdpaBackend sdpa_backend() { return g_sdpa_backend; }

std::string sdpa_choice(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& options) {
  check_qkv(q, k, v);
  if (sdpa_backend() == SdpaBackend::Math) return "math: the Math backend is selected";
  const std::string why = fused_unsupported(q, k, v, options);
  return why.empty() ? "fused (cuDNN)" : "math: " + why;
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& o) {
  check_qkv(q, k, v);
  const SdpaBackend backend = sdpa_backend();
  if (backend != SdpaBackend::Math) {
    const std::string why = fused_unsupported(q, k, v, o);
    if (why.empty()) return sdpa_fused(q, k, v, o.causal);
    ASC_CHECK(backend == SdpaBackend::Auto,
              "scaled_dot_product_attention: the Fused backend cannot run q {} {} k {} v {}: {}", q.shape(),
              q.dtype(), k.shape(), v.shape(), why);
  }
  return sdpa_math(q, k, v, o);
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep_mask,
                                    const Tensor& bias, double dropout_p, bool training, Tensor* weights) {
  return scaled_dot_product_attention(
      q, k, v, SdpaOptions{.keep_mask = keep_mask, .bias = bias, .dropout = dropout_p, .training = training,
                           .weights = weights});
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
  if (o.rope()) rope = register_module("rope", std::make_shared<RotaryEmbedding>(o.d_model() / o.heads(), o.rope_max_len()));
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
  Tensor q = heads((*q_proj)(x), T);
  Tensor k = heads((*k_proj)(ctx), S);
  Tensor v = heads((*v_proj)(ctx), S);
  if (rope) {
    q = rope->forward(q, S - T);  // queries sit at the end of the key sequence
    k = rope->forward(k, 0);
  }
  Tensor w;
  Tensor y = scaled_dot_product_attention(
      q, k, v, {.keep_mask = keep, .bias = args.bias, .causal = args.causal, .dropout = options.dropout(),
                .training = is_training(), .weights = args.need_weights ? &w : nullptr});
  weights_ = w;
  return (*out_proj)(y.permute({0, 2, 1, 3}).reshape({B, T, D}));  // (B, T, D)
}

std::string MultiHeadAttention::extra_repr() const {
  return fmt::format("d_model={}, heads={}, dropout={}, rope={}", options.d_model(), options.heads(),
                     options.dropout(), options.rope());
}

}  // namespace asc::nn
