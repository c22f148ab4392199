// CUDA kernels of sparse attention over a pattern's block view (cuda/sparse_attention_launch.h; the formulas are
// those of ops/sparse_attention.h and ops/cpu/sparse_attention.cpp).
//
// The tiling is that of cuda/flash_attention.cu with the key range replaced by a list: a block of 16 query rows walks
// the sorted union of its rows' keys in tiles of 32, each tile of K and V gathered into shared memory once and read
// by all 16 rows; the union entry's row bits say which rows attend the key (the within-block rule). Scores never
// leave a tile, so memory is O(T · D), and a query block's work is its union's length, not S. Blocks have 4 warps.
//   forward        a block per query block (4 rows per warp). Lane j scores key j of the tile for one row at a time;
//                  each row keeps an online softmax (running max, running sum, a register accumulator rescaled by
//                  exp(m_old - m_new)). A tile none of a warp's rows attends is skipped by that warp.
//   backward dq    a block per half query block (8 rows, 2 per warp), the same walk: P = exp(s - lse) recomputed,
//                  dS = scale · P (dO · v - delta), dq = Σ_j dS_j k_j by warp shuffles; it stores delta = dO · o.
//   backward dk dv a block per half key block (8 keys, 2 per warp) walks the union of the queries that see its keys in
//                  tiles of 32, q and dO gathered into shared memory: lane i recomputes P and dS of query i, then
//                  dv_j = Σ_i P_ij dO_i and dk_j = Σ_i dS_ij q_i.
// Every sum has one owner: no atomics, and the result does not depend on scheduling. Shared rows that lanes read
// down a column are padded by one element, so the 32 lanes hit 32 different banks.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention_tiles.cuh"
#include "cuda/launch_kernel.cuh"
#include "cuda/row_kernels.cuh"
#include "cuda/sparse_attention_launch.h"
#include "cuda/sparse_common.cuh"

namespace asc::cuda {
namespace {

using namespace sparse_launch;
using namespace sparse_common;  // Args, args_of, Span, span_of, warp_or, lanes_with, prob
using rows::acc_t;
using rows::dexp;
using rows::dlog;
using rows::from_acc;
using rows::to_acc;

using tiles::kMaxD;
using tiles::kPer;
using tiles::kTile;  // union entries per tile: one per lane
using tiles::kWarps;
using tiles::nan_max;
using tiles::neg_inf;
using tiles::warp_max;
using tiles::warp_sum;
constexpr int kFwdRows = kRowBlock / kWarps;  // forward: 4 query rows per warp
constexpr int kDqBlock = kRowBlock / 2;       // backward dq: half a query block per thread block
constexpr int kDqRows = kDqBlock / kWarps;    // 2 rows per warp
constexpr int kDkBlock = kKeyBlock / 2;       // backward dk dv: half a key block per thread block
constexpr int kDkKeys = kDkBlock / kWarps;    // 2 keys per warp
static_assert(kMaxD<double> == max_head_dim(FloatElem::F64) && kMaxD<float> == max_head_dim(FloatElem::F32),
              "the tiles' head-dimension bound is the launcher's");

// Rows [r0, r0 + rows) of a contiguous (·, D) matrix into dst (stride ld), 0 past `limit`.
template <class T, class A>
__device__ __forceinline__ void stage(A* dst, int ld, const T* __restrict__ x, int64_t r0, int rows, int64_t limit,
                                      int64_t D) {
  tiles::stage_rows(dst, ld, r0, rows, limit, D, [&](int64_t r, int64_t c) { return x[r * D + c]; });
}
// Rows idx[0 .. n) of a contiguous (·, D) matrix into dst (stride ld), 0 for the slots n .. kTile.
template <class T, class A>
__device__ __forceinline__ void gather(A* dst, int ld, const T* __restrict__ x, const int64_t* __restrict__ idx, int n,
                                       int64_t D) {
  const int tid = threadIdx.y * 32 + threadIdx.x;
  for (int64_t e = tid; e < kTile * D; e += 32 * kWarps) {
    const int r = static_cast<int>(e / D);
    const int64_t c = e % D;
    dst[r * ld + c] = r < n ? to_acc(x[idx[r] * D + c]) : A(0);
  }
}

template <class T>
__global__ void sparse_forward_kernel(Args<T> a, T* __restrict__ o, acc_t<T>* __restrict__ lse) {
  using A = acc_t<T>;
  constexpr int DM = kMaxD<A>, PER = kPer<A>, R = kFwdRows;
  __shared__ A Qs[kRowBlock][DM];  // the block's query rows (read broadcast)
  __shared__ A Ks[kTile][DM + 1];  // a key tile (lane j reads row j: padded)
  __shared__ A Vs[kTile][DM];      // a value tile (lane c reads column c)
  const int lane = threadIdx.x, warp = threadIdx.y;
  const int64_t bh = blockIdx.y, m = blockIdx.x, t0 = m * kRowBlock, D = a.D;
  const T* kb = a.k + bh * a.S * D;
  const T* vb = a.v + bh * a.S * D;
  const bool* keep = a.keep ? a.keep + (bh / a.H) * a.S : nullptr;
  const Span sp = span_of(a.p.rblk_ptr, a.p.groups, bh, (a.Tq + kRowBlock - 1) / kRowBlock, m);
  stage(&Qs[0][0], DM, a.q + bh * a.Tq * D, t0, kRowBlock, a.Tq, D);
  A mx[R], l[R], acc[R][PER];
  bool seen[R];  // whether the row has a kept key at all (else it outputs 0)
#pragma unroll
  for (int r = 0; r < R; ++r) {
    mx[r] = neg_inf<A>(), l[r] = 0, seen[r] = false;
#pragma unroll
    for (int u = 0; u < PER; ++u) acc[r][u] = 0;
  }
  for (int64_t s0 = sp.first; s0 < sp.last; s0 += kTile) {
    const int n = sp.last - s0 < kTile ? static_cast<int>(sp.last - s0) : kTile;
    const int64_t* keys = a.p.rblk_keys + s0;
    __syncthreads();  // Qs is staged; the previous tile's readers are done
    gather(&Ks[0][0], DM + 1, kb, keys, n, D);
    gather(&Vs[0][0], DM, vb, keys, n, D);
    __syncthreads();
    // The rows of the block that attend lane j's key (none past the union, none for a padding key).
    const unsigned bits = lane < n && !(keep && !keep[keys[lane]]) ? unsigned(a.p.rblk_bits[s0 + lane]) : 0u;
    const unsigned any = warp_or(bits);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int rr = warp * R + r;
      if (!((any >> rr) & 1u)) continue;  // no key of this tile for the row (the same for the whole warp)
      seen[r] = true;
      const unsigned att = lanes_with(bits, rr);
      A dot = 0;
      for (int64_t c = 0; c < D; ++c) dot += Qs[rr][c] * Ks[lane][c];
      const A x = (bits >> rr) & 1u ? dot * a.scale : neg_inf<A>();
      const A m_new = nan_max(mx[r], warp_max(x));  // NaN when a score is: the row becomes NaN
      // exp(-inf) = 0 for the unattended keys; a -inf max so far (only for infinite inputs) rescales nothing.
      const A corr = mx[r] == m_new ? A(1) : dexp(mx[r] - m_new);
      const A pj = x == neg_inf<A>() ? A(0) : dexp(x - m_new);
      l[r] = l[r] * corr + warp_sum(pj);
      mx[r] = m_new;
#pragma unroll
      for (int u = 0; u < PER; ++u) acc[r][u] *= corr;
      for (int j = 0; j < n; ++j) {
        if (!((att >> j) & 1u)) continue;  // warp-uniform
        const A pk = __shfl_sync(0xffffffffu, pj, j);
        tiles::axpy_row(acc[r], pk, Vs[j], D);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t t = t0 + warp * R + r;
    if (t >= a.Tq) break;
    // No kept key: a zero row. Otherwise 1 / l, NaN propagating: l is NaN for a NaN score, and 0 (so o = 0 · inf,
    // NaN) only when every kept score is -inf — the composed softmax of such a row is NaN too.
    const A inv = seen[r] ? A(1) / l[r] : A(0);
    tiles::store_row(o + (bh * a.Tq + t) * D, 1, acc[r], inv, D);
    if (lane == 0)
      lse[bh * a.Tq + t] = !seen[r] ? neg_inf<A>() : l[r] > A(0) ? mx[r] + dlog(l[r]) : static_cast<A>(NAN);
  }
}

template <class T>
__global__ void sparse_backward_dq_kernel(Args<T> a, const T* __restrict__ o, const T* __restrict__ dout,
                                          const acc_t<T>* __restrict__ lse, acc_t<T>* __restrict__ delta,
                                          T* __restrict__ dq) {
  using A = acc_t<T>;
  constexpr int DM = kMaxD<A>, PER = kPer<A>, R = kDqRows;
  __shared__ A Qs[kDqBlock][DM], Gs[kDqBlock][DM];    // the half block's q and dO rows (read broadcast)
  __shared__ A Ks[kTile][DM + 1], Vs[kTile][DM + 1];  // lane j reads row j of both for its dot products
  const int lane = threadIdx.x, warp = threadIdx.y;
  const int64_t bh = blockIdx.y, m = blockIdx.x / 2, D = a.D;
  const int half = blockIdx.x % 2, shift = half * kDqBlock;  // the half's rows are bits shift .. shift + 8
  const int64_t t0 = m * kRowBlock + shift;
  if (t0 >= a.Tq) return;  // the empty second half of the last block (the whole block returns)
  const T* kb = a.k + bh * a.S * D;
  const T* vb = a.v + bh * a.S * D;
  const bool* keep = a.keep ? a.keep + (bh / a.H) * a.S : nullptr;
  const Span sp = span_of(a.p.rblk_ptr, a.p.groups, bh, (a.Tq + kRowBlock - 1) / kRowBlock, m);
  stage(&Qs[0][0], DM, a.q + bh * a.Tq * D, t0, kDqBlock, a.Tq, D);
  stage(&Gs[0][0], DM, dout + bh * a.Tq * D, t0, kDqBlock, a.Tq, D);
  A L[R], dl[R], acc[R][PER];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t t = t0 + warp * R + r;
    A part = 0;  // delta = dO · o: lane c's columns, then the warp's sum
    const int64_t x = (bh * a.Tq + t) * D;
    if (t < a.Tq)
      for (int64_t c = lane; c < D; c += 32) part += to_acc(dout[x + c]) * to_acc(o[x + c]);
    dl[r] = warp_sum(part);
    L[r] = t < a.Tq ? lse[bh * a.Tq + t] : neg_inf<A>();
    if (t < a.Tq && lane == 0) delta[bh * a.Tq + t] = dl[r];
#pragma unroll
    for (int u = 0; u < PER; ++u) acc[r][u] = 0;
  }
  for (int64_t s0 = sp.first; s0 < sp.last; s0 += kTile) {
    const int n = sp.last - s0 < kTile ? static_cast<int>(sp.last - s0) : kTile;
    const int64_t* keys = a.p.rblk_keys + s0;
    __syncthreads();
    gather(&Ks[0][0], DM + 1, kb, keys, n, D);
    gather(&Vs[0][0], DM + 1, vb, keys, n, D);
    __syncthreads();
    const unsigned bits = lane < n && !(keep && !keep[keys[lane]]) ? unsigned(a.p.rblk_bits[s0 + lane]) >> shift : 0u;
    const unsigned any = warp_or(bits);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int rr = warp * R + r;
      if (L[r] == neg_inf<A>() || !((any >> rr) & 1u)) continue;  // warp-uniform: nothing to add to dq
      const unsigned att = lanes_with(bits, rr);
      A qk = 0, gv = 0;
      for (int64_t c = 0; c < D; ++c) qk += Qs[rr][c] * Ks[lane][c], gv += Gs[rr][c] * Vs[lane][c];
      const A ds = (bits >> rr) & 1u ? a.scale * prob(qk * a.scale, L[r]) * (gv - dl[r]) : A(0);
      for (int j = 0; j < n; ++j) {
        if (!((att >> j) & 1u)) continue;  // warp-uniform
        const A dk = __shfl_sync(0xffffffffu, ds, j);
        tiles::axpy_row(acc[r], dk, Ks[j], D);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t t = t0 + warp * R + r;
    if (t >= a.Tq) break;
    tiles::store_row(dq + (bh * a.Tq + t) * D, 1, acc[r], A(1), D);
  }
}

template <class T>
__global__ void sparse_backward_dkv_kernel(Args<T> a, const T* __restrict__ dout, const acc_t<T>* __restrict__ lse,
                                           const acc_t<T>* __restrict__ delta, T* __restrict__ dk, T* __restrict__ dv) {
  using A = acc_t<T>;
  constexpr int DM = kMaxD<A>, PER = kPer<A>, KK = kDkKeys;
  __shared__ A Ks[kDkBlock][DM], Vs[kDkBlock][DM];    // the half block's keys and values (read broadcast)
  __shared__ A Qs[kTile][DM + 1], Gs[kTile][DM + 1];  // a tile of the union's queries: lane i reads row i
  const int lane = threadIdx.x, warp = threadIdx.y;
  const int64_t bh = blockIdx.y, m = blockIdx.x / 2, D = a.D;
  const int half = blockIdx.x % 2, shift = half * kDkBlock;  // the half's keys are bits shift .. shift + 8
  const int64_t j0 = m * kKeyBlock + shift;
  if (j0 >= a.S) return;  // the empty second half of the last block (the whole block returns)
  const T* qb = a.q + bh * a.Tq * D;
  const T* gb = dout + bh * a.Tq * D;
  const bool* keep = a.keep ? a.keep + (bh / a.H) * a.S : nullptr;
  const Span sp = span_of(a.p.kblk_ptr, a.p.groups, bh, (a.S + kKeyBlock - 1) / kKeyBlock, m);
  stage(&Ks[0][0], DM, a.k + bh * a.S * D, j0, kDkBlock, a.S, D);
  stage(&Vs[0][0], DM, a.v + bh * a.S * D, j0, kDkBlock, a.S, D);
  // The warp's keys that exist and are not padding (a padding key's dk and dv are 0).
  unsigned live = 0;
#pragma unroll
  for (int kk = 0; kk < KK; ++kk) {
    const int64_t j = j0 + warp * KK + kk;
    if (j < a.S && !(keep && !keep[j])) live |= 1u << (warp * KK + kk);
  }
  A dka[KK][PER], dva[KK][PER];
#pragma unroll
  for (int kk = 0; kk < KK; ++kk)
#pragma unroll
    for (int u = 0; u < PER; ++u) dka[kk][u] = 0, dva[kk][u] = 0;
  for (int64_t s0 = sp.first; s0 < sp.last; s0 += kTile) {
    const int n = sp.last - s0 < kTile ? static_cast<int>(sp.last - s0) : kTile;
    const int64_t* rows_ = a.p.kblk_rows + s0;
    __syncthreads();  // Ks, Vs staged; the previous tile's readers are done
    gather(&Qs[0][0], DM + 1, qb, rows_, n, D);
    gather(&Gs[0][0], DM + 1, gb, rows_, n, D);
    __syncthreads();
    // Lane i's query: which of the block's keys it attends, its lse and delta.
    const unsigned bits = lane < n ? unsigned(a.p.kblk_bits[s0 + lane]) >> shift & live : 0u;
    const unsigned any = warp_or(bits);
    const A Li = lane < n ? lse[bh * a.Tq + rows_[lane]] : neg_inf<A>();
    const A Di = lane < n ? delta[bh * a.Tq + rows_[lane]] : A(0);
#pragma unroll
    for (int kk = 0; kk < KK; ++kk) {
      const int jj = warp * KK + kk;
      if (!((any >> jj) & 1u)) continue;  // no query of this tile sees the key (the same for the whole warp)
      const unsigned att = lanes_with(bits, jj);
      A qk = 0, gv = 0;
      for (int64_t c = 0; c < D; ++c) qk += Qs[lane][c] * Ks[jj][c], gv += Gs[lane][c] * Vs[jj][c];
      const bool on = (bits >> jj) & 1u;
      const A pi = on ? prob(qk * a.scale, Li) : A(0);
      const A ds = on && Li != neg_inf<A>() ? a.scale * pi * (gv - Di) : A(0);
      for (int i = 0; i < n; ++i) {
        if (!((att >> i) & 1u)) continue;  // warp-uniform
        const A pk = __shfl_sync(0xffffffffu, pi, i), dk_i = __shfl_sync(0xffffffffu, ds, i);
        tiles::axpy_row(dva[kk], pk, Gs[i], D);
        tiles::axpy_row(dka[kk], dk_i, Qs[i], D);
      }
    }
  }
#pragma unroll
  for (int kk = 0; kk < KK; ++kk) {
    const int64_t j = j0 + warp * KK + kk;
    if (j >= a.S) break;
    tiles::store_row(dk + (bh * a.S + j) * D, 1, dka[kk], A(1), D);
    tiles::store_row(dv + (bh * a.S + j) * D, 1, dva[kk], A(1), D);
  }
}

const dim3 kBlock(32, kWarps);

// `blocks` blocks on x, and the B·H heads on the grid's y axis (0, a failing launch, past 65535).
dim3 grid_of(int64_t blocks, int64_t heads) { return dim3(grid_dim(blocks), grid_dim(heads, kMaxGridYZ)); }

}  // namespace

namespace sparse_launch {

cudaError_t forward(const void* q, const void* k, const void* v, Pattern p, const bool* keep, Dims d, double scale,
                    void* o, void* lse, FloatElem elem, cudaStream_t stream) {
  return visit_float_elem(elem, [&](auto tag) {
    using T = decltype(tag);
    if (d.T == 0 || d.B * d.H == 0) return cudaSuccess;
    return launch_kernel(sparse_forward_kernel<T>, grid_of((d.T + kRowBlock - 1) / kRowBlock, d.B * d.H), kBlock,
                         stream, args_of<T>(q, k, v, keep, p, d, scale), static_cast<T*>(o),
                         static_cast<acc_t<T>*>(lse));
  });
}

cudaError_t backward(const void* q, const void* k, const void* v, Pattern p, const bool* keep, Dims d, double scale,
                     const void* o, const void* dout, const void* lse, void* delta, void* dq, void* dk, void* dv,
                     FloatElem elem, cudaStream_t stream) {
  return visit_float_elem(elem, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    if (d.T == 0 || d.S == 0 || d.B * d.H == 0) return cudaSuccess;
    const Args<T> a = args_of<T>(q, k, v, keep, p, d, scale);
    const cudaError_t err =
        launch_kernel(sparse_backward_dq_kernel<T>, grid_of(2 * ((d.T + kRowBlock - 1) / kRowBlock), d.B * d.H), kBlock,
                      stream, a, static_cast<const T*>(o), static_cast<const T*>(dout), static_cast<const A*>(lse),
                      static_cast<A*>(delta), static_cast<T*>(dq));
    if (err != cudaSuccess) return err;
    return launch_kernel(sparse_backward_dkv_kernel<T>, grid_of(2 * ((d.S + kKeyBlock - 1) / kKeyBlock), d.B * d.H),
                         kBlock, stream, a, static_cast<const T*>(dout), static_cast<const A*>(lse),
                         static_cast<const A*>(delta), static_cast<T*>(dk), static_cast<T*>(dv));
  });
}

}  // namespace sparse_launch
}  // namespace asc::cuda
