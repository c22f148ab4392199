#pragma once
// Launcher of the fused ASCender forward CUDA kernel (cuda/ascender.cu), called by cuda/ascender.cpp after it has
// validated the tensors. C++17-clean and plain data only (this header is included by a .cu file). Semantics are the
// CPU kernel's (ops/cpu/ascender.cpp, docs/ascender.md): one query row per thread block, every (row, key) quantity
// in shared memory, so a row holds at most kAscenderMaxKeys<T> keys.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/float_elem.h"

namespace asc::cuda::ascender_launch {

constexpr int kMaxHeads = 16;   // per-head configuration travels in the kernel's parameters
constexpr int kMaxK = 64;       // neighbourhood size
constexpr int kMaxDim = 256;    // d, d_z, d_a
// Keys per row: seven (row, key) arrays of the element type in 48 KiB of static shared memory.
constexpr int64_t max_keys(FloatElem t) { return t == FloatElem::F64 ? 640 : 1280; }

struct Params {
  // q, k_rot, k, v (B, H, T, d), z (B, H, T, d_z), e (B, H, T, d_a) contiguous; scalars (9, H): ω_a, ω_s, ω_c, λ_a,
  // λ_s, λ_c, δ, κ, τ_score; all of one element type. y (B, H, T, d).
  const void *q, *k_rot, *k, *v, *z, *e, *scalars;
  void* y;
  // keep (bool) and bias (element type): element (b, h, i, j) at b*s[0] + h*s[1] + i*s[2] + j*s[3]; nullptr: none.
  const bool* keep;
  int64_t keep_stride[4];
  const void* bias;
  int64_t bias_stride[4];
  int64_t B, H, T, d, dz, da;
  int64_t window, global_tokens;  // window 0: every key
  int include_self, select_by_scores, after_norm, use_align, use_sep, use_coh;
  double norm_eps, omega_scale;
  int64_t k_nbr[kMaxHeads];  // neighbourhood size per head
  double tau_sep[kMaxHeads], tau_coh[kMaxHeads], alpha_align[kMaxHeads], alpha_coh[kMaxHeads];
};

// float32 or float64 only.
cudaError_t forward(FloatElem t, const Params& p, cudaStream_t stream);

}  // namespace asc::cuda::ascender_launch
