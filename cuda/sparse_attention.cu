// CUDA kernels of sparse attention over a CSR pattern (cuda/sparse_attention_launch.h; formulas in
// ops/sparse_attention.h and ops/cpu/sparse_attention.cpp).
//
// A warp per query row (blockDim (32, 8): eight rows per block, rows grid-strided). Lane c holds elements c, c + 32,
// ... of the row's D-vectors in registers (D <= 256). The forward walks the row's key list once with an online
// softmax — running max m, running sum l, the output accumulator rescaled by exp(m_old - m_new) — so a score lives
// for one key only and memory is O(T · D). The backward recomputes P from the saved log-sum-exp: a warp per query row
// writes dq and keeps P and dS per pair (O(attended pairs)), then a warp per key sums dk and dv over the pattern's
// transpose. Every sum has one owner: no atomics, and the result does not depend on scheduling.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/launch_kernel.cuh"
#include "cuda/row_kernels.cuh"
#include "cuda/sparse_attention_launch.h"

namespace asc::cuda {
namespace {

using namespace sparse_launch;
using rows::acc_t;
using rows::dexp;
using rows::dlog;
using rows::from_acc;
using rows::to_acc;

constexpr int kPer = kMaxHeadDim / 32;  // D-elements per lane
constexpr int kRowsPerBlock = 8;        // warps per block

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class A>
__device__ __forceinline__ A neg_inf() {
  return -static_cast<A>(INFINITY);
}

// Loads this lane's elements of a D-vector into registers (0 past D).
template <class T, class A>
__device__ __forceinline__ void load(const T* __restrict__ x, int64_t D, A (&r)[kPer]) {
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int64_t c = threadIdx.x + 32 * u;
    r[u] = c < D ? to_acc(x[c]) : A(0);
  }
}

// This lane's part of a · x (a in registers), summed over the warp.
template <class T, class A>
__device__ __forceinline__ A warp_dot(const A (&a)[kPer], const T* __restrict__ x, int64_t D) {
  A s = 0;
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int64_t c = threadIdx.x + 32 * u;
    if (c < D) s += a[u] * to_acc(x[c]);
  }
  return warp_sum(s);
}

template <class T, class A>
__device__ __forceinline__ void store(T* __restrict__ x, int64_t D, const A (&r)[kPer], A mul) {
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int64_t c = threadIdx.x + 32 * u;
    if (c < D) x[c] = from_acc<T>(r[u] * mul);
  }
}

__device__ __forceinline__ int64_t first_row() { return int64_t(blockIdx.x) * blockDim.y + threadIdx.y; }
__device__ __forceinline__ int64_t row_step() { return int64_t(gridDim.x) * blockDim.y; }
// Where the pair (b·H + h, entry e of the pattern) keeps its P and dS.
__device__ __forceinline__ int64_t pair_index(const Pattern& p, int64_t bh, int64_t e) {
  return p.groups == 1 ? bh * p.nnz + e : e;
}

// What a query row `row` = (b·H + h)·T + i reads: its key list cols[e0 .. e1), its head's keys and values, its
// sample's padding mask (or nullptr).
template <class T>
struct RowOf {
  int64_t bh, e0, e1;
  const T *kb, *vb;
  const bool* kp;
};
template <class T>
__device__ __forceinline__ RowOf<T> row_of(int64_t row, const Pattern& p, const Dims& d, const T* k, const T* v,
                                           const bool* keep) {
  const int64_t bh = row / d.T, r = (p.groups == 1 ? 0 : bh) * d.T + row % d.T;
  return {bh, p.row_ptr[r], p.row_ptr[r + 1], k + bh * d.S * d.D, v + bh * d.S * d.D,
          keep ? keep + (bh / d.H) * d.S : nullptr};
}

template <class T>
__global__ void sparse_forward_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                      Pattern p, const bool* __restrict__ keep, Dims d, acc_t<T> scale,
                                      T* __restrict__ o, acc_t<T>* __restrict__ lse) {
  using A = acc_t<T>;
  for (int64_t row = first_row(); row < d.B * d.H * d.T; row += row_step()) {
    const auto [bh, e0, e1, kb, vb, kp] = row_of(row, p, d, k, v, keep);
    A qr[kPer], acc[kPer];
    load(q + row * d.D, d.D, qr);
#pragma unroll
    for (int u = 0; u < kPer; ++u) acc[u] = 0;
    A m = neg_inf<A>(), l = 0;
    for (int64_t e = e0; e < e1; ++e) {
      const int64_t j = p.cols[e];
      if (kp && !kp[j]) continue;  // the same j for the whole warp
      const A s = warp_dot(qr, kb + j * d.D, d.D) * scale;
      const A m_new = s > m ? s : m;
      const A corr = dexp(m - m_new), pj = dexp(s - m_new);
      l = l * corr + pj;
#pragma unroll
      for (int u = 0; u < kPer; ++u) {
        const int64_t c = threadIdx.x + 32 * u;
        acc[u] = acc[u] * corr + (c < d.D ? pj * to_acc(vb[j * d.D + c]) : A(0));
      }
      m = m_new;
    }
    store(o + row * d.D, d.D, acc, l > 0 ? A(1) / l : A(0));  // no kept key: a zero row
    if (threadIdx.x == 0) lse[row] = l > 0 ? m + dlog(l) : neg_inf<A>();
  }
}

// Backward, pass 1 (a warp per query row): P_ij = exp(s_ij - lse_i), dS_ij = scale P_ij (dO_i · v_j - dO_i · o_i),
// dq_i = Σ_j dS_ij k_j.
template <class T>
__global__ void sparse_backward_rows(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                     Pattern p, const bool* __restrict__ keep, Dims d, acc_t<T> scale,
                                     const T* __restrict__ o, const T* __restrict__ dout, const acc_t<T>* __restrict__ lse,
                                     T* __restrict__ dq, acc_t<T>* __restrict__ P, acc_t<T>* __restrict__ dS) {
  using A = acc_t<T>;
  for (int64_t row = first_row(); row < d.B * d.H * d.T; row += row_step()) {
    const auto [bh, e0, e1, kb, vb, kp] = row_of(row, p, d, k, v, keep);
    const A l = lse[row];
    const bool empty = !(l > neg_inf<A>());
    A qr[kPer], gr[kPer], dqr[kPer];
    load(q + row * d.D, d.D, qr);
    load(dout + row * d.D, d.D, gr);
#pragma unroll
    for (int u = 0; u < kPer; ++u) dqr[u] = 0;
    const A delta = warp_dot(gr, o + row * d.D, d.D);
    for (int64_t e = e0; e < e1; ++e) {
      const int64_t j = p.cols[e], x = pair_index(p, bh, e);
      A pij = 0, ds = 0;
      if (!empty && !(kp && !kp[j])) {
        const A z = warp_dot(qr, kb + j * d.D, d.D) * scale - l;
        pij = dexp(z < A(0) ? z : A(0));
        ds = scale * pij * (warp_dot(gr, vb + j * d.D, d.D) - delta);
#pragma unroll
        for (int u = 0; u < kPer; ++u) {
          const int64_t c = threadIdx.x + 32 * u;
          if (c < d.D) dqr[u] += ds * to_acc(kb[j * d.D + c]);
        }
      }
      if (threadIdx.x == 0) P[x] = pij, dS[x] = ds;
    }
    store(dq + row * d.D, d.D, dqr, A(1));
  }
}

// Backward, pass 2 (a warp per key): dv_j = Σ_i P_ij dO_i, dk_j = Σ_i dS_ij q_i over the queries that see key j.
template <class T>
__global__ void sparse_backward_keys(const T* __restrict__ q, const T* __restrict__ dout, Pattern p, Dims d,
                                     const acc_t<T>* __restrict__ P, const acc_t<T>* __restrict__ dS,
                                     T* __restrict__ dk, T* __restrict__ dv) {
  using A = acc_t<T>;
  for (int64_t col = first_row(); col < d.B * d.H * d.S; col += row_step()) {
    const int64_t bh = col / d.S, j = col % d.S, c0 = (p.groups == 1 ? 0 : bh) * d.S + j;
    A dkr[kPer], dvr[kPer];
#pragma unroll
    for (int u = 0; u < kPer; ++u) dkr[u] = 0, dvr[u] = 0;
    for (int64_t y = p.col_ptr[c0]; y < p.col_ptr[c0 + 1]; ++y) {
      const int64_t i = p.col_rows[y], x = pair_index(p, bh, p.col_pos[y]);
      const A pij = P[x], ds = dS[x];
      if (pij == A(0)) continue;
      const T* qi = q + (bh * d.T + i) * d.D;
      const T* gi = dout + (bh * d.T + i) * d.D;
#pragma unroll
      for (int u = 0; u < kPer; ++u) {
        const int64_t c = threadIdx.x + 32 * u;
        if (c < d.D) dvr[u] += pij * to_acc(gi[c]), dkr[u] += ds * to_acc(qi[c]);
      }
    }
    store(dk + col * d.D, d.D, dkr, A(1));
    store(dv + col * d.D, d.D, dvr, A(1));
  }
}

const dim3 kBlock(32, kRowsPerBlock);

}  // namespace

namespace sparse_launch {

cudaError_t forward(const void* q, const void* k, const void* v, Pattern p, const bool* keep, Dims d, double scale,
                    void* o, void* lse, FloatElem elem, cudaStream_t stream) {
  return visit_float_elem(elem, [&](auto tag) {
    using T = decltype(tag);
    return launch_kernel(sparse_forward_kernel<T>, grid_for(d.B * d.H * d.T, kRowsPerBlock), kBlock, stream,
                         static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), p, keep, d,
                         static_cast<acc_t<T>>(scale), static_cast<T*>(o), static_cast<acc_t<T>*>(lse));
  });
}

cudaError_t backward(const void* q, const void* k, const void* v, Pattern p, const bool* keep, Dims d, double scale,
                     const void* o, const void* dout, const void* lse, void* dq, void* dk, void* dv, void* work,
                     FloatElem elem, cudaStream_t stream) {
  return visit_float_elem(elem, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    A* P = static_cast<A*>(work);
    A* dS = P + pair_workspace(p, d) / 2;
    cudaError_t err = launch_kernel(sparse_backward_rows<T>, grid_for(d.B * d.H * d.T, kRowsPerBlock), kBlock, stream,
                                    static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), p,
                                    keep, d, static_cast<A>(scale), static_cast<const T*>(o),
                                    static_cast<const T*>(dout), static_cast<const A*>(lse), static_cast<T*>(dq), P, dS);
    if (err != cudaSuccess) return err;
    return launch_kernel(sparse_backward_keys<T>, grid_for(d.B * d.H * d.S, kRowsPerBlock), kBlock, stream,
                         static_cast<const T*>(q), static_cast<const T*>(dout), p, d, static_cast<const A*>(P),
                         static_cast<const A*>(dS), static_cast<T*>(dk), static_cast<T*>(dv));
  });
}

}  // namespace sparse_launch
}  // namespace asc::cuda
