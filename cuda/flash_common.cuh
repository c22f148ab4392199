#pragma once
// What the flash-attention kernels on CUDA cores (cuda/flash_attention.cu) and on tensor cores (cuda/flash_mma.cu)
// share: the problem with typed pointers, the scaled / biased / masked score of a (query, key) pair, the keys a block
// of query rows may see, and a probability from its row's log-sum-exp — one definition of the semantics for both.
// C++17 and CUDA headers only (included from .cu files, which the CUDA emulator also compiles as C++).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention_tiles.cuh"
#include "cuda/flash_attention_launch.h"
#include "cuda/row_kernels.cuh"

namespace asc::cuda::flash_common {

using namespace flash_launch;
using rows::acc_t;
using rows::dexp;
using rows::to_acc;
using tiles::neg_inf;

__device__ __forceinline__ int64_t at(const View4& s, int64_t b, int64_t h, int64_t t, int64_t c) {
  return b * s.b + h * s.h + t * s.t + c * s.c;
}

// The problem with typed pointers.
template <class T>
struct Args {
  int64_t B, H, Tq, S, D;  // Tq: the template parameter is T
  const T *q, *k, *v;
  View4 sq, sk, sv;
  const bool* keep;
  View4 sm;
  const T* bias;
  View4 sb;
  bool causal;
  acc_t<T> scale;
};
template <class T>
Args<T> args_of(const Problem& p) {
  return {p.B,
          p.H,
          p.T,
          p.S,
          p.D,
          static_cast<const T*>(p.q),
          static_cast<const T*>(p.k),
          static_cast<const T*>(p.v),
          p.sq,
          p.sk,
          p.sv,
          p.keep,
          p.sm,
          static_cast<const T*>(p.bias),
          p.sb,
          p.causal,
          static_cast<acc_t<T>>(p.scale)};
}

// The scaled, biased, masked score of query t and key s from their dot product; -inf for a key t does not see.
template <class T>
__device__ __forceinline__ acc_t<T> score(const Args<T>& p, int64_t b, int64_t h, int64_t t, int64_t s, acc_t<T> dot) {
  using A = acc_t<T>;
  if (t >= p.Tq || s >= p.S || (p.causal && s > t + (p.S - p.Tq))) return neg_inf<A>();
  if (p.keep && !p.keep[at(p.sm, b, h, t, s)]) return neg_inf<A>();
  A x = dot * p.scale;
  if (p.bias) x += to_acc(p.bias[at(p.sb, b, h, t, s)]);
  return x;
}

// Keys [0, n) that query rows [t0, t0 + rows) may see: with causal, none past the last row's limit.
template <class T>
__device__ __forceinline__ int64_t keys_for(const Args<T>& p, int64_t t0, int64_t rows) {
  if (!p.causal) return p.S;
  const int64_t n = t0 + rows + (p.S - p.Tq);
  return n < 0 ? 0 : n > p.S ? p.S : n;
}

// P of a kept score from the row's log-sum-exp (0 for a masked key or a row without kept keys).
template <class A>
__device__ __forceinline__ A prob(A x, A lse) {
  if (x == neg_inf<A>() || lse == neg_inf<A>()) return A(0);
  const A z = x - lse;  // <= 0 up to rounding; NaN (a NaN row's lse) stays NaN
  return dexp(z > A(0) ? A(0) : z);
}

}  // namespace asc::cuda::flash_common
