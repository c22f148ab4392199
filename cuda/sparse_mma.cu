// Sparse attention on tensor cores (cuda/sparse_attention_launch.h: mma_takes, mma_forward, mma_backward): the
// formulas and semantics of cuda/sparse_attention.cu (padding, rows without a kept key, NaN reaching exactly the rows
// that attend it) over the same block view of the pattern, with every product on tensor cores through cuda/mma.cuh —
// bfloat16 / float16 operands, or float32 as TF32 when the user allows it (asc::cuda::set_allow_tf32) — and float32
// accumulators, softmax and statistics.
//
// A warp owns one block of the view — 16 query rows (forward, dq) or 16 keys (dk dv), one mma M — and walks its
// union in tiles of 32 entries gathered into the warp's own slice of shared memory; the view's bits mask the pairs
// of a tile that are not in the pattern (score -inf, P = dS = 0). Each warp is independent (a block's warps share
// nothing, and a tile no row of the warp attends is skipped), and every sum has one owner: no atomics.
//   forward     S = Q Kᵀ over the tile, masked, online softmax per row, O += P V.
//   backward dq P = exp(S - lse), dP = dO Vᵀ, dS = scale P (dP - delta), dq += dS K; stores delta = dO · o.
//   backward dk dv  over the union of the queries that see the warp's keys: Pᵀ = exp(K Qᵀ - lse), dv += Pᵀ dO,
//               dPᵀ = V dOᵀ, dSᵀ = scale Pᵀ (dPᵀ - delta), dk += dSᵀ Q.
// A masked pair's P is 0, but a tensor core adds 0 · x for it, and 0 · NaN is NaN: a tile whose gathered operand of
// the second product (V, K, or dO and Q) holds a non-finite value takes that product on CUDA cores instead, over the
// attended pairs only (times_tile_exact). Head dims up to 64; other inputs take the CUDA-core kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention_tiles.cuh"
#include "cuda/launch_kernel.cuh"
#include "cuda/mma.cuh"
#include "cuda/mma_tiles.cuh"
#include "cuda/row_kernels.cuh"
#include "cuda/sparse_attention_launch.h"
#include "cuda/sparse_common.cuh"
#include "cuda/stage_rows.cuh"

namespace asc::cuda {
namespace {

using namespace sparse_launch;
using namespace sparse_common;  // Args, args_of, Span, span_of, warp_or, prob: cuda/sparse_attention.cu's semantics
using mma::FragC;
using mma::Kind;
using mma_tiles::col_of;
using mma_tiles::group_max;
using mma_tiles::group_sum;
using mma_tiles::kNt;
using mma_tiles::kPld;
using mma_tiles::kRows;
using mma_tiles::kTile;
using mma_tiles::padded;
using mma_tiles::row_of;
using rows::dexp;
using rows::dlog;
using rows::from_acc;
using rows::to_acc;
using tiles::nan_max;
using tiles::neg_inf;

constexpr int kWarps = 2;       // blockDim (32, kWarps): a warp per block of the view, each with its own tiles
constexpr int kMaxD = 64;       // head dims this path takes
constexpr int kLd = kMaxD + 4;  // shared row stride: the fragment loads' 32 lanes hit distinct banks
constexpr int kDt = kMaxD / 8;  // accumulator tiles across the head dim
static_assert(kRowBlock == kRows && kKeyBlock == kRows, "a warp owns one block of the view: one mma M");
template <Kind K>
using Rows = mma_tiles::RowsA<K, kMaxD>;  // a warp's 16 rows over the head dim

// A warp's slice of shared memory.
struct WarpTiles {
  float a[kTile * kLd];            // gathered rows: K (forward, dq) or Q (dk dv); first the warp's own rows
  float b[kTile * kLd];            // gathered rows: V (forward, dq) or dO (dk dv)
  float p[kRows * kPld];           // P or dS as (16, kTile): TF32's next A operand, and the exact path's
  unsigned bits[kTile];            // per entry of the tile: the warp's rows (keys) that attend it
  float lse[kTile], delta[kTile];  // dk dv: the entries' lse and delta
};

__device__ __forceinline__ bool finite(float v) { return v - v == 0.0f; }  // false for NaN and ±inf

// Packs of 16 bytes a lane keeps in flight when the warp stages a tile: 4 (16 registers); 8 made the forward spill,
// its accumulators being live while it stages.
constexpr int kPacks = 4;

// The warp's 16 rows [r0, r0 + 16) of a contiguous (·, D) matrix into dst (stride kLd) in float32, 0 past `limit`
// and in the columns D .. Dp.
template <class T>
__device__ __forceinline__ void stage_own(float* dst, const T* __restrict__ x, int64_t r0, int64_t limit, int64_t D,
                                          int64_t Dp) {
  if (stage_rows::packable(x, D)) {  // 16-byte loads, kPacks of them in flight at once
    stage_rows::gather<kPacks>(
        dst, kLd, x, D, kRows, [&](int r) { return r0 + r < limit ? r0 + r : -1; }, threadIdx.x, 32);
    stage_rows::zero_columns(dst, kLd, kRows, D, Dp, threadIdx.x, 32);
    return;
  }
  for (int r = 0; r < kRows; ++r)
    for (int64_t c = threadIdx.x; c < Dp; c += 32)
      dst[r * kLd + c] = r0 + r < limit && c < D ? to_acc(x[(r0 + r) * D + c]) : 0.0f;
}

// Rows idx[0 .. n) of a contiguous (·, D) matrix into the warp's tile dst (stride kLd) in float32: 0 for the slots
// past n, for the entries whose bit in `live` is clear (padding: never read, even if NaN) and in the columns D .. Dp.
// Returns whether a staged value is not finite (the same on every lane).
template <class T>
__device__ __forceinline__ bool gather_tile(float* dst, const T* __restrict__ x, const int64_t* __restrict__ idx, int n,
                                            unsigned live, int64_t D, int64_t Dp) {
  if (stage_rows::packable(x, D)) {  // 16-byte loads, kPacks of them in flight at once
    const bool bad = stage_rows::gather<kPacks>(
        dst, kLd, x, D, kTile, [&](int r) { return r < n && ((live >> r) & 1u) ? idx[r] : int64_t{-1}; }, threadIdx.x,
        32);
    stage_rows::zero_columns(dst, kLd, kTile, D, Dp, threadIdx.x, 32);
    return warp_or(bad ? 1u : 0u) != 0;
  }
  unsigned bad = 0;
  for (int r = 0; r < kTile; ++r) {
    const bool on = r < n && ((live >> r) & 1u);
    const int64_t row = on ? idx[r] : 0;
    for (int64_t c = threadIdx.x; c < Dp; c += 32) {
      const float v = on && c < D ? to_acc(x[row * D + c]) : 0.0f;
      bad |= finite(v) ? 0u : 1u;
      dst[r * kLd + c] = v;
    }
  }
  return warp_or(bad) != 0;
}

// out[d] += P · vals over the pairs in the pattern only — entry e of the tile for row r when bits[e] has bit r — in
// float32 on CUDA cores: for a tile whose `vals` hold a non-finite value, which a tensor core would spread through
// the 0 · NaN of every masked pair. `scratch` is the warp's (16, kPld) slice. Rare (non-finite inputs only).
__device__ __forceinline__ void times_tile_exact(FragC (&out)[kDt], const FragC (&p)[kNt], const float* vals, int64_t D,
                                                 const unsigned* bits, float* scratch) {
#pragma unroll
  for (int j = 0; j < kNt; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) scratch[row_of(i) * kPld + col_of(j, i)] = p[j].x[i];
  __syncwarp();
#pragma unroll
  for (int d = 0; d < kDt; ++d)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = row_of(i);
      const int64_t c = 8 * d + 2 * mma::lane_t() + (i & 1);
      if (c >= D) continue;
      float sum = out[d].x[i];
      for (int e = 0; e < kTile; ++e)
        if ((bits[e] >> r) & 1u) sum += scratch[r * kPld + e] * vals[e * kLd + c];
      out[d].x[i] = sum;
    }
  __syncwarp();  // the slice is written again by the next call
}

// out += P · vals: on tensor cores, or exactly when the tile holds a non-finite value.
template <Kind K>
__device__ __forceinline__ void times_tile(FragC (&out)[kDt], const FragC (&p)[kNt], const float* vals, int64_t D,
                                           int64_t Dp, bool exact, WarpTiles& w) {
  if (exact)
    times_tile_exact(out, p, vals, D, w.bits, w.p);
  else
    mma_tiles::times_tile<K, kMaxD>(out, p, vals, kLd, Dp, w.p);
}

// Whether the pair (row r of the warp, entry e of the tile) is in the pattern.
__device__ __forceinline__ bool in_pattern(const WarpTiles& w, int r, int e) { return (w.bits[e] >> r) & 1u; }

// The entries of a tile with at least one attending row, as a lane mask.
__device__ __forceinline__ unsigned live_entries(unsigned bits) { return warp_or(bits != 0 ? 1u << threadIdx.x : 0u); }

template <class T>
__global__ void __launch_bounds__(32 * kWarps)
    sparse_mma_forward_kernel(Args<T> a, T* __restrict__ o, float* __restrict__ lse) {
  constexpr Kind K = mma::kind_of<T>();
  __shared__ WarpTiles tiles_[kWarps];
  WarpTiles& w = tiles_[threadIdx.y];
  const int lane = threadIdx.x;
  const int64_t nblk = (a.Tq + kRowBlock - 1) / kRowBlock, m = int64_t(blockIdx.x) * kWarps + threadIdx.y;
  if (m >= nblk) return;  // the whole warp: no block-wide barrier follows
  const int64_t bh = blockIdx.y, t0 = m * kRowBlock, D = a.D, Dp = padded<K>(D);
  const T* kb = a.k + bh * a.S * D;
  const T* vb = a.v + bh * a.S * D;
  const bool* keep = a.keep ? a.keep + (bh / a.H) * a.S : nullptr;
  const Span sp = span_of(a.p.rblk_ptr, a.p.groups, bh, nblk, m);
  stage_own(w.a, a.q + bh * a.Tq * D, t0, a.Tq, D, Dp);
  __syncwarp();
  Rows<K> qa;
  mma_tiles::load_rows(qa, w.a, kLd, Dp);
  float mx[2] = {neg_inf<float>(), neg_inf<float>()}, l[2] = {0.0f, 0.0f};  // rows g and g + 8
  bool seen[2] = {false, false};  // whether the row has a kept key at all (else it outputs 0)
  FragC acc[kDt] = {};
  for (int64_t s0 = sp.first; s0 < sp.last; s0 += kTile) {
    const int n = sp.last - s0 < kTile ? static_cast<int>(sp.last - s0) : kTile;
    const int64_t* keys = a.p.rblk_keys + s0;
    // The rows of the warp that attend lane e's key (none past the union, none for a padding key).
    const unsigned bits = lane < n && !(keep && !keep[keys[lane]]) ? unsigned(a.p.rblk_bits[s0 + lane]) : 0u;
    const unsigned any = warp_or(bits);
    if (any == 0) continue;  // no row of the warp attends this tile
    __syncwarp();            // the previous tile's readers are done
    w.bits[lane] = bits;
    const unsigned live = live_entries(bits);
    gather_tile(w.a, kb, keys, n, live, D, Dp);
    const bool exact = gather_tile(w.b, vb, keys, n, live, D, Dp);
    __syncwarp();
    FragC s[kNt];
    mma_tiles::products(s, qa, w.a, kLd, Dp);
    float tmax[2] = {neg_inf<float>(), neg_inf<float>()};
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[j].x[i] = in_pattern(w, row_of(i), col_of(j, i)) ? s[j].x[i] * a.scale : neg_inf<float>();
        tmax[i >> 1] = nan_max(tmax[i >> 1], s[j].x[i]);
      }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      seen[r] = seen[r] || ((any >> (mma::lane_g() + 8 * r)) & 1u);
      const float tile_max = group_max(tmax[r]);
      // A NaN score poisons the row: m, l and the accumulator become NaN and stay NaN (fmax would drop it).
      const float m_new = tile_max != tile_max ? tile_max : fmaxf(mx[r], tile_max);
      corr[r] = m_new == neg_inf<float>() ? 1.0f : dexp(mx[r] - m_new);  // exp(-inf) = 0 on the first kept tile
      tmax[r] = m_new;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float mr = tmax[i >> 1];
        s[j].x[i] = mr == neg_inf<float>() ? 0.0f : dexp(s[j].x[i] - mr);  // masked pairs: exp(-inf) = 0
        sum[i >> 1] += s[j].x[i];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + group_sum(sum[r]), mx[r] = tmax[r];
#pragma unroll
    for (int d = 0; d < kDt; ++d)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[d].x[i] *= corr[i >> 1];
    times_tile<K>(acc, s, w.b, D, Dp, exact, w);  // O += P V
  }
  const int tt = mma::lane_t();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t t = t0 + mma::lane_g() + 8 * r;
    if (t >= a.Tq) continue;
    // No kept key: a zero row. Otherwise 1 / l, NaN propagating: l is NaN for a NaN score, and 0 (so o = 0 · inf,
    // NaN) only when every kept score is -inf — the composed softmax of such a row is NaN too.
    const float inv = seen[r] ? 1.0f / l[r] : 0.0f;
#pragma unroll
    for (int d = 0; d < kDt; ++d)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t c = 8 * d + 2 * tt + e;
        if (c < D) o[(bh * a.Tq + t) * D + c] = from_acc<T>(seen[r] ? acc[d].x[2 * r + e] * inv : 0.0f);
      }
    if (tt == 0)
      lse[bh * a.Tq + t] = !seen[r] ? neg_inf<float>() : l[r] > 0.0f ? mx[r] + dlog(l[r]) : static_cast<float>(NAN);
  }
}

template <class T>
__global__ void __launch_bounds__(32 * kWarps)
    sparse_mma_backward_dq_kernel(Args<T> a, const T* __restrict__ o, const T* __restrict__ dout,
                                  const float* __restrict__ lse, float* __restrict__ delta, T* __restrict__ dq) {
  constexpr Kind K = mma::kind_of<T>();
  __shared__ WarpTiles tiles_[kWarps];
  WarpTiles& w = tiles_[threadIdx.y];
  const int lane = threadIdx.x;
  const int64_t nblk = (a.Tq + kRowBlock - 1) / kRowBlock, m = int64_t(blockIdx.x) * kWarps + threadIdx.y;
  if (m >= nblk) return;
  const int64_t bh = blockIdx.y, t0 = m * kRowBlock, D = a.D, Dp = padded<K>(D);
  const T* kb = a.k + bh * a.S * D;
  const T* vb = a.v + bh * a.S * D;
  const bool* keep = a.keep ? a.keep + (bh / a.H) * a.S : nullptr;
  const Span sp = span_of(a.p.rblk_ptr, a.p.groups, bh, nblk, m);
  Rows<K> qa, ga;
  stage_own(w.a, a.q + bh * a.Tq * D, t0, a.Tq, D, Dp);
  __syncwarp();
  mma_tiles::load_rows(qa, w.a, kLd, Dp);
  __syncwarp();
  stage_own(w.a, dout + bh * a.Tq * D, t0, a.Tq, D, Dp);
  __syncwarp();
  mma_tiles::load_rows(ga, w.a, kLd, Dp);
  // delta = dO · o of the warp's rows (lane c's columns, then the warp's sum), and their lse.
  float L[2], dl[2];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t t = t0 + r;
    float part = 0.0f;
    if (t < a.Tq)
      for (int64_t c = lane; c < D; c += 32)
        part += to_acc(dout[(bh * a.Tq + t) * D + c]) * to_acc(o[(bh * a.Tq + t) * D + c]);
    part = tiles::warp_sum(part);
    if (t < a.Tq && lane == 0) delta[bh * a.Tq + t] = part;
    if (r == mma::lane_g()) dl[0] = part;
    if (r == mma::lane_g() + 8) dl[1] = part;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t t = t0 + mma::lane_g() + 8 * r;
    L[r] = t < a.Tq ? lse[bh * a.Tq + t] : neg_inf<float>();
  }
  FragC acc[kDt] = {};
  for (int64_t s0 = sp.first; s0 < sp.last; s0 += kTile) {
    const int n = sp.last - s0 < kTile ? static_cast<int>(sp.last - s0) : kTile;
    const int64_t* keys = a.p.rblk_keys + s0;
    const unsigned bits = lane < n && !(keep && !keep[keys[lane]]) ? unsigned(a.p.rblk_bits[s0 + lane]) : 0u;
    if (warp_or(bits) == 0) continue;
    __syncwarp();
    w.bits[lane] = bits;
    const unsigned live = live_entries(bits);
    const bool exact = gather_tile(w.a, kb, keys, n, live, D, Dp);
    gather_tile(w.b, vb, keys, n, live, D, Dp);
    __syncwarp();
    FragC s[kNt], dp[kNt];
    mma_tiles::products(s, qa, w.a, kLd, Dp);
    mma_tiles::products(dp, ga, w.b, kLd, Dp);  // dP = dO Vᵀ
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float Lr = L[i >> 1];
        const bool on = in_pattern(w, row_of(i), col_of(j, i)) && Lr != neg_inf<float>();
        s[j].x[i] = on ? a.scale * prob(s[j].x[i] * a.scale, Lr) * (dp[j].x[i] - dl[i >> 1]) : 0.0f;  // dS
      }
    times_tile<K>(acc, s, w.a, D, Dp, exact, w);  // dq += dS K
  }
  const int tt = mma::lane_t();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t t = t0 + mma::lane_g() + 8 * r;
    if (t >= a.Tq) continue;
#pragma unroll
    for (int d = 0; d < kDt; ++d)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t c = 8 * d + 2 * tt + e;
        if (c < D) dq[(bh * a.Tq + t) * D + c] = from_acc<T>(L[r] == neg_inf<float>() ? 0.0f : acc[d].x[2 * r + e]);
      }
  }
}

template <class T>
__global__ void __launch_bounds__(32 * kWarps)
    sparse_mma_backward_dkv_kernel(Args<T> a, const T* __restrict__ dout, const float* __restrict__ lse,
                                   const float* __restrict__ delta, T* __restrict__ dk, T* __restrict__ dv) {
  constexpr Kind K = mma::kind_of<T>();
  __shared__ WarpTiles tiles_[kWarps];
  WarpTiles& w = tiles_[threadIdx.y];
  const int lane = threadIdx.x;
  const int64_t nblk = (a.S + kKeyBlock - 1) / kKeyBlock, m = int64_t(blockIdx.x) * kWarps + threadIdx.y;
  if (m >= nblk) return;
  const int64_t bh = blockIdx.y, j0 = m * kKeyBlock, D = a.D, Dp = padded<K>(D);
  const T* qb = a.q + bh * a.Tq * D;
  const T* gb = dout + bh * a.Tq * D;
  const bool* keep = a.keep ? a.keep + (bh / a.H) * a.S : nullptr;
  const Span sp = span_of(a.p.kblk_ptr, a.p.groups, bh, nblk, m);
  Rows<K> ka, va;
  stage_own(w.a, a.k + bh * a.S * D, j0, a.S, D, Dp);
  __syncwarp();
  mma_tiles::load_rows(ka, w.a, kLd, Dp);
  __syncwarp();
  stage_own(w.a, a.v + bh * a.S * D, j0, a.S, D, Dp);
  __syncwarp();
  mma_tiles::load_rows(va, w.a, kLd, Dp);
  // The warp's keys that exist and are not padding (a padding key's dk and dv are 0): bit c for key j0 + c.
  const int64_t jl = j0 + lane;
  const unsigned keys_live = warp_or(lane < kKeyBlock && jl < a.S && !(keep && !keep[jl]) ? 1u << lane : 0u);
  FragC dka[kDt] = {}, dva[kDt] = {};
  for (int64_t s0 = sp.first; s0 < sp.last; s0 += kTile) {
    const int n = sp.last - s0 < kTile ? static_cast<int>(sp.last - s0) : kTile;
    const int64_t* qrows = a.p.kblk_rows + s0;
    // Lane e's query: which of the warp's keys it attends.
    const unsigned bits = lane < n ? unsigned(a.p.kblk_bits[s0 + lane]) & keys_live : 0u;
    if (warp_or(bits) == 0) continue;
    __syncwarp();
    w.bits[lane] = bits;
    w.lse[lane] = lane < n ? lse[bh * a.Tq + qrows[lane]] : neg_inf<float>();
    w.delta[lane] = lane < n ? delta[bh * a.Tq + qrows[lane]] : 0.0f;
    const unsigned live = live_entries(bits);
    const bool bad_q = gather_tile(w.a, qb, qrows, n, live, D, Dp);
    const bool bad_g = gather_tile(w.b, gb, qrows, n, live, D, Dp);
    __syncwarp();
    FragC s[kNt], dp[kNt], ds[kNt];
    mma_tiles::products(s, ka, w.a, kLd, Dp);   // Sᵀ = K Qᵀ: row = key, column = query
    mma_tiles::products(dp, va, w.b, kLd, Dp);  // dPᵀ = V dOᵀ
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int e = col_of(j, i);
        const bool on = in_pattern(w, row_of(i), e);
        const float Li = w.lse[e];
        const float pi = on ? prob(s[j].x[i] * a.scale, Li) : 0.0f;
        s[j].x[i] = pi;
        ds[j].x[i] = on && Li != neg_inf<float>() ? a.scale * pi * (dp[j].x[i] - w.delta[e]) : 0.0f;
      }
    const bool exact = bad_q || bad_g;
    times_tile<K>(dva, s, w.b, D, Dp, exact, w);   // dv += Pᵀ dO
    times_tile<K>(dka, ds, w.a, D, Dp, exact, w);  // dk += dSᵀ Q
  }
  const int tt = mma::lane_t();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t j = j0 + mma::lane_g() + 8 * r;
    if (j >= a.S) continue;
#pragma unroll
    for (int d = 0; d < kDt; ++d)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t c = 8 * d + 2 * tt + e;
        if (c < D) {
          dk[(bh * a.S + j) * D + c] = from_acc<T>(dka[d].x[2 * r + e]);
          dv[(bh * a.S + j) * D + c] = from_acc<T>(dva[d].x[2 * r + e]);
        }
      }
  }
}

const dim3 kBlock(32, kWarps);

// A warp per block of the view: ceil(blocks / kWarps) thread blocks on x, the B·H heads on y.
dim3 grid_of(int64_t blocks, int64_t heads) {
  return dim3(grid_dim((blocks + kWarps - 1) / kWarps), grid_dim(heads, kMaxGridYZ));
}

}  // namespace

namespace sparse_launch {

bool mma_takes(Dims d, FloatElem elem, bool allow_tf32) {
  if (elem == FloatElem::F64 || (elem == FloatElem::F32 && !allow_tf32)) return false;
  return d.D >= 1 && d.D <= kMaxD;
}

cudaError_t mma_forward(const void* q, const void* k, const void* v, Pattern p, const bool* keep, Dims d, double scale,
                        void* o, void* lse, FloatElem elem, cudaStream_t stream) {
  if (d.T == 0 || d.B * d.H == 0) return cudaSuccess;
  return visit_mma_elem(elem, [&](auto tag) {
    using T = decltype(tag);
    return launch_kernel(sparse_mma_forward_kernel<T>, grid_of((d.T + kRowBlock - 1) / kRowBlock, d.B * d.H), kBlock,
                         stream, args_of<T>(q, k, v, keep, p, d, scale), static_cast<T*>(o), static_cast<float*>(lse));
  });
}

cudaError_t mma_backward(const void* q, const void* k, const void* v, Pattern p, const bool* keep, Dims d, double scale,
                         const void* o, const void* dout, const void* lse, void* delta, void* dq, void* dk, void* dv,
                         FloatElem elem, cudaStream_t stream) {
  if (d.T == 0 || d.S == 0 || d.B * d.H == 0) return cudaSuccess;
  return visit_mma_elem(elem, [&](auto tag) {
    using T = decltype(tag);
    const Args<T> a = args_of<T>(q, k, v, keep, p, d, scale);
    const cudaError_t err =
        launch_kernel(sparse_mma_backward_dq_kernel<T>, grid_of((d.T + kRowBlock - 1) / kRowBlock, d.B * d.H), kBlock,
                      stream, a, static_cast<const T*>(o), static_cast<const T*>(dout), static_cast<const float*>(lse),
                      static_cast<float*>(delta), static_cast<T*>(dq));
    if (err != cudaSuccess) return err;
    return launch_kernel(sparse_mma_backward_dkv_kernel<T>, grid_of((d.S + kKeyBlock - 1) / kKeyBlock, d.B * d.H),
                         kBlock, stream, a, static_cast<const T*>(dout), static_cast<const float*>(lse),
                         static_cast<const float*>(delta), static_cast<T*>(dk), static_cast<T*>(dv));
  });
}

}  // namespace sparse_launch
}  // namespace asc::cuda
