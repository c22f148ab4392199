#pragma once
// What sparse attention's kernels on CUDA cores (cuda/sparse_attention.cu) and on tensor cores (cuda/sparse_mma.cu)
// share: the problem with typed pointers, a block's span of the pattern's block view, the warp votes over the view's
// bit masks, and a probability from its row's log-sum-exp — one definition of the semantics for both.
// C++17 and CUDA headers only (included from .cu files, which the CUDA emulator also compiles as C++).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention_tiles.cuh"
#include "cuda/row_kernels.cuh"
#include "cuda/sparse_attention_launch.h"

namespace asc::cuda::sparse_common {

using namespace sparse_launch;
using rows::acc_t;
using rows::dexp;
using tiles::neg_inf;

// The problem with typed pointers; q, k, v (and keep) at (b, h) are computed per block.
template <class T>
struct Args {
  int64_t B, H, Tq, S, D;  // Tq: the template parameter is T
  const T *q, *k, *v;
  const bool* keep;  // (B, S) or nullptr
  Pattern p;
  acc_t<T> scale;
};
template <class T>
Args<T> args_of(const void* q, const void* k, const void* v, const bool* keep, Pattern p, Dims d, double scale) {
  return {d.B,
          d.H,
          d.T,
          d.S,
          d.D,
          static_cast<const T*>(q),
          static_cast<const T*>(k),
          static_cast<const T*>(v),
          keep,
          p,
          static_cast<acc_t<T>>(scale)};
}

// A group's block `m` of the view (blocks_per_group per group): its union is entries [first, last).
struct Span {
  int64_t first, last;
};
__device__ __forceinline__ Span span_of(const int64_t* ptr, int64_t groups, int64_t bh, int64_t blocks_per_group,
                                        int64_t m) {
  const int64_t x = (groups == 1 ? 0 : bh) * blocks_per_group + m;
  return {ptr[x], ptr[x + 1]};
}

// The OR of the warp's values (every lane gets it).
__device__ __forceinline__ unsigned warp_or(unsigned v) {
  for (int o = 16; o > 0; o >>= 1) v |= __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// The lanes whose `bits` have bit b: which entries of a tile a row (or key) attends. The sums over a tile skip the
// other entries instead of adding 0 times them, so that a NaN in a key, value or query that the row does not attend
// (another row's, or padding) never reaches it (0 · NaN is NaN).
__device__ __forceinline__ unsigned lanes_with(unsigned bits, int b) {
  return warp_or(((bits >> b) & 1u) << threadIdx.x);
}

// P of an attended score from its row's log-sum-exp (0 for a row without kept keys).
template <class A>
__device__ __forceinline__ A prob(A x, A lse) {
  if (lse == neg_inf<A>()) return A(0);
  const A z = x - lse;  // <= 0 up to rounding; NaN (a NaN row) stays NaN, so its gradients are NaN too
  return dexp(z > A(0) ? A(0) : z);
}

}  // namespace asc::cuda::sparse_common
