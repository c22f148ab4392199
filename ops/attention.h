#pragma once
// Scaled-dot-product attention, the core every attention layer (nn/attention.h) runs on already projected heads:
//
//   O = softmax(Q Kᵀ · scale + bias, masked) V        Q (B, H, T, D), K and V (B, H, S, D), O (B, H, T, D)
//
// scale = 1/√D. A key is attended when keep_mask is true there and, with `causal`, when s <= t + (S - T) (query t
// sits at the end of the key sequence, so T == S gives the usual lower triangle). A row with no attended key gives
// a zero output. One op with a fused kernel per backend behind the one dispatch (ops/kernel_list.inc: sdpa_*):
//   CPU  ops/cpu/attention.cpp   float32/float64, masks and a constant bias: per block of query rows, the scores
//                                live in a (rows, S) tile, never as (T, S); the backward recomputes them from the
//                                saved log-sum-exp (flash-attention style). Under CpuAutocast (core/autocast.h)
//                                float32 runs ops/cpu/attention_bf16.cpp: the same tiles, products in bfloat16.
//   CUDA cuda/attention.cpp      cuDNN flash attention for bfloat16/float16 (no mask or bias; causal with T == S);
//                                everything else (float32/float64, masks, a constant bias) up to a head dim of 128
//                                (64 in float64) by our tiled flash kernels (cuda/flash_attention.cu).
// Anything a fused kernel does not take (dropout, the probabilities requested, a bias that needs a gradient, other
// dtypes) runs the composed ops (matmul, masked softmax, matmul), which are the reference the kernels are tested
// against.
//
//   asc::Tensor o = asc::scaled_dot_product_attention(q, k, v, {.causal = true});
#include <string>

#include "core/tensor.h"

namespace asc {

struct SdpaOptions {
  Tensor keep_mask = {};  // bool, broadcastable to (B, H, T, S); true = attend; undefined = none
  Tensor bias = {};       // additive, broadcastable to (B, H, T, S)
  bool causal = false;    // query t sees keys s <= t + (S - T)
  double dropout = 0.0;   // on the probabilities, when training
  bool training = false;
  Tensor* weights = nullptr;  // if set, receives the probabilities (B, H, T, S), detached
};
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& options);
// The same with the mask and bias as positional arguments (causality, if any, folded into keep_mask).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep_mask = {},
                                    const Tensor& bias = {}, double dropout = 0.0, bool training = false,
                                    Tensor* weights = nullptr);

// Which implementation scaled_dot_product_attention uses:
//   Math  - the composed ops on any device and dtype;
//   Fused - the device's fused kernel; an error when the inputs do not qualify;
//   Auto  - Fused when the inputs qualify, else Math (the default).
enum class SdpaBackend { Auto, Math, Fused };
void set_sdpa_backend(SdpaBackend backend);  // process-wide
SdpaBackend sdpa_backend();
// What scaled_dot_product_attention would run for these inputs under the current backend: "fused (CPU)",
// "fused (CPU, bfloat16 products)" (float32 under CpuAutocast), "fused (cuDNN)", "fused (CUDA flash kernel)",
// "fused (CUDA flash kernel on tensor cores)", or "math: " and the reason the fused kernel was not used.
std::string sdpa_choice(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& options = {});

// The causal keep-mask (T, S) bool on `device`: true where key s <= t + (S - T). The one definition of causality
// that the composed path, the layers' masks and the kernels' on-the-fly test share.
Tensor causal_keep_mask(int64_t t_q, int64_t s_k, Device device);

}  // namespace asc
