// Tiled flash-attention kernels (cuda/flash_attention_launch.h; the formulas are those of ops/cpu/attention.cpp).
//
// Scores never leave a tile: memory is O(T · D), never O(T · S). A block has 4 warps (blockDim (32, 4)).
//   forward       a block owns 16 query rows (4 per warp), staged in shared memory. It walks the keys in tiles of 32,
//                 each tile of K and V loaded once into shared memory and read by all 16 rows. Lane j scores key j of
//                 the tile for one row at a time, so a row's 32 scores need one warp max and one warp sum. Each row
//                 keeps an online softmax: running max m, running sum l, and the output accumulator, rescaled by
//                 exp(m_old - m_new). The accumulator is in registers, lane c holding columns c, c + 32, ...
//   backward dq   a block owns 8 query rows and walks the key tiles like the forward. P = exp(x - lse) is recomputed,
//                 then dS = scale · P (dO · v - delta) and dq = Σ_j dS_j k_j. Lane j computes P and dS for key j;
//                 dq gathers them by warp shuffles. It also stores delta = dO · o per row for the next kernel.
//   backward dk dv a block owns 8 keys (2 per warp) and walks the query tiles of 32. Lane i recomputes P and dS for
//                 query i, then dv_j = Σ_i P_ij dO_i and dk_j = Σ_i dS_ij q_i.
// Every sum has one owner: no atomics, and the result does not depend on scheduling. Shared rows that lanes read
// down a column are padded by one element, so the 32 lanes hit 32 different banks.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention_tiles.cuh"
#include "cuda/flash_attention_launch.h"
#include "cuda/flash_common.cuh"
#include "cuda/launch_kernel.cuh"
#include "cuda/row_kernels.cuh"

namespace asc::cuda {
namespace {

using namespace flash_launch;
using namespace flash_common;  // Args, args_of, at, score, keys_for, prob
using rows::acc_t;
using rows::dexp;
using rows::dlog;
using rows::from_acc;
using rows::to_acc;

using tiles::kMaxD;
using tiles::kPer;
using tiles::kTile;  // keys per tile (forward, dq) or queries per tile (dk, dv): one per lane
using tiles::kWarps;
using tiles::neg_inf;
using tiles::warp_max;
using tiles::warp_sum;
constexpr int kFwdRows = 4;  // forward: query rows per warp (16 per block)
constexpr int kDqRows = 2;   // backward dq: query rows per warp (8 per block)
constexpr int kDkKeys = 2;   // backward dk dv: keys per warp (8 per block)
static_assert(kMaxD<double> == max_head_dim(FloatElem::F64) && kMaxD<float> == max_head_dim(FloatElem::F32),
              "the tiles' head-dimension bound is the launcher's");

// Loads rows [r0, r0 + rows) of a (·, D) operand of head (b, h) into dst (stride ld), 0 past `limit`.
template <class T, class A>
__device__ __forceinline__ void stage(A* dst, int ld, const T* __restrict__ x, const View4& s, int64_t b, int64_t h,
                                      int64_t r0, int rows, int64_t limit, int64_t D) {
  tiles::stage_rows(dst, ld, r0, rows, limit, D, [&](int64_t r, int64_t c) { return x[at(s, b, h, r, c)]; });
}

template <class T>
__global__ void flash_forward_kernel(Args<T> p, T* __restrict__ o, View4 so, acc_t<T>* __restrict__ lse) {
  using A = acc_t<T>;
  constexpr int DM = kMaxD<A>, PER = kPer<A>, R = kFwdRows, BQ = kWarps * kFwdRows;
  __shared__ A Qs[BQ][DM];         // the block's query rows (read broadcast)
  __shared__ A Ks[kTile][DM + 1];  // a key tile (lane j reads row j: padded)
  __shared__ A Vs[kTile][DM];      // a value tile (lane c reads column c)
  const int lane = threadIdx.x, warp = threadIdx.y;
  const int64_t bh = blockIdx.y, b = bh / p.H, h = bh % p.H, t0 = int64_t(blockIdx.x) * BQ, D = p.D;
  stage(&Qs[0][0], DM, p.q, p.sq, b, h, t0, BQ, p.Tq, D);
  A m[R], l[R], acc[R][PER];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    m[r] = neg_inf<A>(), l[r] = 0;
#pragma unroll
    for (int u = 0; u < PER; ++u) acc[r][u] = 0;
  }
  const int64_t n = keys_for(p, t0, BQ);
  for (int64_t s0 = 0; s0 < n; s0 += kTile) {
    __syncthreads();  // Qs is staged; the previous tile's readers are done
    stage(&Ks[0][0], DM + 1, p.k, p.sk, b, h, s0, kTile, p.S, D);
    stage(&Vs[0][0], DM, p.v, p.sv, b, h, s0, kTile, p.S, D);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int rr = warp * R + r;
      A dot = 0;
      for (int64_t c = 0; c < D; ++c) dot += Qs[rr][c] * Ks[lane][c];
      const A x = score(p, b, h, t0 + rr, s0 + lane, dot);
      const A mx = warp_max(x);
      // A NaN score poisons the row: m, l and the accumulator become NaN and stay NaN (fmax would drop it).
      const A m_new = mx != mx ? mx : fmax(m[r], mx);
      if (m_new == neg_inf<A>()) continue;  // nothing kept in the row yet (the same for the whole warp)
      const A corr = dexp(m[r] - m_new), pj = dexp(x - m_new);  // exp(-inf) = 0 for the first tile, masked keys
      l[r] = l[r] * corr + warp_sum(pj);
      m[r] = m_new;
#pragma unroll
      for (int u = 0; u < PER; ++u) acc[r][u] *= corr;
      for (int j = 0; j < kTile; ++j) {
        const A pk = __shfl_sync(0xffffffffu, pj, j);
        tiles::axpy_row(acc[r], pk, Vs[j], D);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t t = t0 + warp * R + r;
    if (t >= p.Tq) break;
    const bool live = l[r] > A(0) || l[r] != l[r];  // no kept key: a zero row; a NaN row stays NaN
    const A inv = live ? A(1) / l[r] : A(0);
    tiles::store_row(o + at(so, b, h, t, 0), so.c, acc[r], inv, D);
    if (lane == 0) lse[bh * p.Tq + t] = live ? m[r] + dlog(l[r]) : neg_inf<A>();
  }
}
template <class T>
__global__ void flash_backward_dq_kernel(Args<T> p, const T* __restrict__ o, View4 so, const T* __restrict__ dout,
                                         View4 sg, const acc_t<T>* __restrict__ lse, acc_t<T>* __restrict__ delta,
                                         T* __restrict__ dq) {
  using A = acc_t<T>;
  constexpr int DM = kMaxD<A>, PER = kPer<A>, R = kDqRows, BQ = kWarps * kDqRows;
  __shared__ A Qs[BQ][DM], Gs[BQ][DM];                // the block's q and dO rows (read broadcast)
  __shared__ A Ks[kTile][DM + 1], Vs[kTile][DM + 1];  // lane j reads row j of both for its dot products
  const int lane = threadIdx.x, warp = threadIdx.y;
  const int64_t bh = blockIdx.y, b = bh / p.H, h = bh % p.H, t0 = int64_t(blockIdx.x) * BQ, D = p.D;
  stage(&Qs[0][0], DM, p.q, p.sq, b, h, t0, BQ, p.Tq, D);
  stage(&Gs[0][0], DM, dout, sg, b, h, t0, BQ, p.Tq, D);
  A L[R], dl[R], acc[R][PER];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t t = t0 + warp * R + r;
    // delta = dO · o (lane c's columns, then the warp's sum)
    A part = 0;
    if (t < p.Tq)
      for (int64_t c = lane; c < D; c += 32) part += to_acc(dout[at(sg, b, h, t, c)]) * to_acc(o[at(so, b, h, t, c)]);
    dl[r] = warp_sum(part);
    L[r] = t < p.Tq ? lse[bh * p.Tq + t] : neg_inf<A>();
    if (t < p.Tq && lane == 0) delta[bh * p.Tq + t] = dl[r];
#pragma unroll
    for (int u = 0; u < PER; ++u) acc[r][u] = 0;
  }
  const int64_t n = keys_for(p, t0, BQ);
  for (int64_t s0 = 0; s0 < n; s0 += kTile) {
    __syncthreads();
    stage(&Ks[0][0], DM + 1, p.k, p.sk, b, h, s0, kTile, p.S, D);
    stage(&Vs[0][0], DM + 1, p.v, p.sv, b, h, s0, kTile, p.S, D);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int rr = warp * R + r;
      if (L[r] == neg_inf<A>()) continue;  // a row without kept keys (or past T): dq = 0
      A qk = 0, gv = 0;
      for (int64_t c = 0; c < D; ++c) qk += Qs[rr][c] * Ks[lane][c], gv += Gs[rr][c] * Vs[lane][c];
      const A pj = prob(score(p, b, h, t0 + rr, s0 + lane, qk), L[r]);
      const A ds = p.scale * pj * (gv - dl[r]);
      for (int j = 0; j < kTile; ++j) {
        const A dk = __shfl_sync(0xffffffffu, ds, j);
        tiles::axpy_row(acc[r], dk, Ks[j], D);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t t = t0 + warp * R + r;
    if (t >= p.Tq) break;
    tiles::store_row(dq + (bh * p.Tq + t) * D, 1, acc[r], A(1), D);
  }
}

template <class T>
__global__ void flash_backward_dkv_kernel(Args<T> p, const T* __restrict__ dout, View4 sg,
                                          const acc_t<T>* __restrict__ lse, const acc_t<T>* __restrict__ delta,
                                          T* __restrict__ dk, T* __restrict__ dv) {
  using A = acc_t<T>;
  constexpr int DM = kMaxD<A>, PER = kPer<A>, KK = kDkKeys, BK = kWarps * kDkKeys;
  __shared__ A Ks[BK][DM], Vs[BK][DM];                // the block's keys and values (read broadcast)
  __shared__ A Qs[kTile][DM + 1], Gs[kTile][DM + 1];  // a query tile: lane i reads row i
  __shared__ A Ls[kTile], Ds[kTile];                  // its rows' lse and delta
  const int lane = threadIdx.x, warp = threadIdx.y, tid = warp * 32 + lane;
  const int64_t bh = blockIdx.y, b = bh / p.H, h = bh % p.H, j0 = int64_t(blockIdx.x) * BK, D = p.D;
  stage(&Ks[0][0], DM, p.k, p.sk, b, h, j0, BK, p.S, D);
  stage(&Vs[0][0], DM, p.v, p.sv, b, h, j0, BK, p.S, D);
  A dka[KK][PER], dva[KK][PER];
#pragma unroll
  for (int kk = 0; kk < KK; ++kk)
#pragma unroll
    for (int u = 0; u < PER; ++u) dka[kk][u] = 0, dva[kk][u] = 0;
  // With causal, query t sees key j when t >= j - (S - T): the block's first key bounds the first query tile.
  int64_t first = p.causal ? j0 - (p.S - p.Tq) : 0;
  first = first < 0 ? 0 : first - first % kTile;
  for (int64_t i0 = first; i0 < p.Tq; i0 += kTile) {
    __syncthreads();  // Ks, Vs staged; the previous tile's readers are done
    stage(&Qs[0][0], DM + 1, p.q, p.sq, b, h, i0, kTile, p.Tq, D);
    stage(&Gs[0][0], DM + 1, dout, sg, b, h, i0, kTile, p.Tq, D);
    if (tid < kTile) {
      const bool in = i0 + tid < p.Tq;
      Ls[tid] = in ? lse[bh * p.Tq + i0 + tid] : neg_inf<A>();
      Ds[tid] = in ? delta[bh * p.Tq + i0 + tid] : A(0);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < KK; ++kk) {
      const int jj = warp * KK + kk;
      if (j0 + jj >= p.S) break;  // the same for the whole warp
      A qk = 0, gv = 0;
      for (int64_t c = 0; c < D; ++c) qk += Qs[lane][c] * Ks[jj][c], gv += Gs[lane][c] * Vs[jj][c];
      const A pi = prob(score(p, b, h, i0 + lane, j0 + jj, qk), Ls[lane]);
      const A ds = p.scale * pi * (gv - Ds[lane]);
      for (int i = 0; i < kTile; ++i) {
        const A pk = __shfl_sync(0xffffffffu, pi, i), dk_i = __shfl_sync(0xffffffffu, ds, i);
        tiles::axpy_row(dva[kk], pk, Gs[i], D);
        tiles::axpy_row(dka[kk], dk_i, Qs[i], D);
      }
    }
  }
#pragma unroll
  for (int kk = 0; kk < KK; ++kk) {
    const int64_t j = j0 + warp * KK + kk;
    if (j >= p.S) break;
    tiles::store_row(dk + (bh * p.S + j) * D, 1, dka[kk], A(1), D);
    tiles::store_row(dv + (bh * p.S + j) * D, 1, dva[kk], A(1), D);
  }
}

const dim3 kBlock(32, kWarps);

// Blocks of `per` items over n, and the B·H heads on the grid's y axis (0, a failing launch, past 65535).
dim3 grid_of(int64_t n, int per, int64_t heads) {
  return dim3(grid_dim((n + per - 1) / per), grid_dim(heads, kMaxGridYZ));
}

}  // namespace

namespace flash_launch {

cudaError_t forward(const Problem& p, void* o, View4 so, void* lse, FloatElem elem, cudaStream_t stream) {
  if (mma_takes(p, elem)) return mma_forward(p, o, so, lse, elem, stream);
  return visit_float_elem(elem, [&](auto tag) {
    using T = decltype(tag);
    if (p.T == 0 || p.B * p.H == 0) return cudaSuccess;
    return launch_kernel(flash_forward_kernel<T>, grid_of(p.T, kWarps * kFwdRows, p.B * p.H), kBlock, stream,
                         args_of<T>(p), static_cast<T*>(o), so, static_cast<acc_t<T>*>(lse));
  });
}

cudaError_t backward(const Problem& p, const void* o, View4 so, const void* dout, View4 sg, const void* lse,
                     void* delta, void* dq, void* dk, void* dv, FloatElem elem, cudaStream_t stream) {
  if (mma_takes(p, elem)) return mma_backward(p, o, so, dout, sg, lse, delta, dq, dk, dv, elem, stream);
  return visit_float_elem(elem, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    if (p.B * p.H == 0) return cudaSuccess;
    if (p.T > 0) {
      const cudaError_t err =
          launch_kernel(flash_backward_dq_kernel<T>, grid_of(p.T, kWarps * kDqRows, p.B * p.H), kBlock, stream,
                        args_of<T>(p), static_cast<const T*>(o), so, static_cast<const T*>(dout), sg,
                        static_cast<const A*>(lse), static_cast<A*>(delta), static_cast<T*>(dq));
      if (err != cudaSuccess) return err;
    }
    if (p.S == 0) return cudaSuccess;
    return launch_kernel(flash_backward_dkv_kernel<T>, grid_of(p.S, kWarps * kDkKeys, p.B * p.H), kBlock, stream,
                         args_of<T>(p), static_cast<const T*>(dout), sg, static_cast<const A*>(lse),
                         static_cast<const A*>(delta), static_cast<T*>(dk), static_cast<T*>(dv));
  });
}

}  // namespace flash_launch
}  // namespace asc::cuda
