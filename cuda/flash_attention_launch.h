#pragma once
// Launchers of the tiled flash-attention kernels (cuda/flash_attention.cu), the CUDA fused path of
// scaled_dot_product_attention (ops/attention.h) for whatever cuDNN's does not take: float32 / float64, a keep-mask,
// an additive bias, causal with T != S, any head dim up to max_head_dim. Called by cuda/attention.cpp with plain
// data. C++17-clean; each launcher returns the launch's cudaError_t.
//
// q (B, H, T, D), k and v (B, H, S, D), o and dout (B, H, T, D) are strided views (element strides per axis, so a
// heads-last projection costs no copy); keep / bias are (B, H, T, S) views with stride 0 on broadcast axes, either
// may be null. bias, q, k, v, o, dout share the element type `elem` (bfloat16 / float16 compute in float32). lse and
// delta are (B, H, T) contiguous in the compute type; dq, dk, dv contiguous (B, H, T|S, D).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/float_elem.h"

namespace asc::cuda::flash_launch {

// Element strides of a 4-D view: [b, h, t, c] sits at b·b_ + h·h_ + t·t_ + c·c_.
struct View4 {
  int64_t b, h, t, c;
};

struct Problem {
  int64_t B, H, T, S, D;
  const void *q, *k, *v;
  View4 sq, sk, sv;
  const bool* keep;  // or nullptr
  View4 sm;
  const void* bias;  // or nullptr
  View4 sb;
  bool causal;  // query t sees keys s <= t + (S - T)
  double scale;
  bool allow_tf32 = false;  // float32 products may run on TF32 tensor cores (asc::cuda::set_allow_tf32)
};

// The largest head dim: the tiles of a block (its query rows, a tile of 32 keys and values) stay under the 48 KiB of
// static shared memory, so 128 when computing in float32, 64 in float64.
constexpr int64_t max_head_dim(FloatElem e) { return e == FloatElem::F64 ? 64 : 128; }

// o = softmax(q kᵀ · scale + bias, masked) v and the rows' log-sum-exp (-inf, and o = 0, for a row with no kept key).
cudaError_t forward(const Problem& p, void* o, View4 so, void* lse, FloatElem elem, cudaStream_t stream);
// dq, dk, dv from the forward's o and lse; delta: workspace for the rows' dO · o.
cudaError_t backward(const Problem& p, const void* o, View4 so, const void* dout, View4 sg, const void* lse,
                     void* delta, void* dq, void* dk, void* dv, FloatElem elem, cudaStream_t stream);

// The tensor-core kernels (cuda/flash_mma.cu), which forward / backward choose when mma_takes: bfloat16 / float16,
// or float32 with p.allow_tf32, and head dims up to 64. Same arguments and results.
bool mma_takes(const Problem& p, FloatElem elem);
cudaError_t mma_forward(const Problem& p, void* o, View4 so, void* lse, FloatElem elem, cudaStream_t stream);
cudaError_t mma_backward(const Problem& p, const void* o, View4 so, const void* dout, View4 sg, const void* lse,
                         void* delta, void* dq, void* dk, void* dv, FloatElem elem, cudaStream_t stream);

}  // namespace asc::cuda::flash_launch
