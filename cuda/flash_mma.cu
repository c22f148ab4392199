// Tensor-core flash attention (cuda/flash_attention_launch.h: mma_takes, mma_forward, mma_backward): the formulas and
// the semantics (masks, bias, causal with T != S, NaN rows, rows without a kept key) of cuda/flash_attention.cu, with
// every product on tensor cores through cuda/mma.cuh — bfloat16 / float16 operands, or float32 as TF32 when the user
// allows it (asc::cuda::set_allow_tf32) — and float32 accumulators, softmax and statistics.
//
// A block has 4 warps (blockDim (32, 4)) and a warp owns 16 rows of its block's tile; operands are copied into shared
// memory as they are stored (cuda/async_copy.cuh; the loaders of cuda/mma.cuh round float32 to TF32 once), in two
// sets of tile buffers so that the next tile's copies are in flight while a tile is computed; the owned rows'
// operands are held as A fragments in registers, and every sum has one owner (no atomics: results do not depend on
// scheduling).
//   forward     a warp owns 16 query rows. Per tile of 32 keys: S = Q Kᵀ (4 accumulator tiles of 16 × 8), scaled,
//               masked, biased; the online softmax over the row (each row's 8 entries per lane, then the 4 lanes
//               of its group by shuffles); O += P V with P as the next A operand (16-bit kinds: straight from the
//               accumulators; TF32, whose A layout differs: through the warp's slice of shared memory).
//   backward dq a warp owns 16 query rows; per key tile: P = exp(S - lse), dP = dO Vᵀ, dS = scale P (dP - delta),
//               dq += dS K. It also stores delta = dO · o per row for the next kernel.
//   backward dk dv  a warp owns 16 keys; per tile of 32 queries: Pᵀ = exp(K Qᵀ - lse), dv += Pᵀ dO,
//               dPᵀ = V dOᵀ, dSᵀ = scale Pᵀ (dPᵀ - delta), dk += dSᵀ Q.
// Head dims up to 64 (kMaxD, a multiple of the operand kind's k step); other inputs take the CUDA-core kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/async_copy.cuh"
#include "cuda/attention_tiles.cuh"
#include "cuda/flash_attention_launch.h"
#include "cuda/flash_common.cuh"
#include "cuda/launch_kernel.cuh"
#include "cuda/mma.cuh"
#include "cuda/mma_tiles.cuh"
#include "cuda/row_kernels.cuh"

namespace asc::cuda {
namespace {

using namespace flash_launch;
using namespace flash_common;  // Args, args_of, at, score, keys_for, prob: cuda/flash_attention.cu's semantics
using mma::FragC;
using mma::Kind;
using mma_tiles::col_of;
using mma_tiles::group_max;
using mma_tiles::group_sum;
using mma_tiles::kNt;
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

constexpr int kWarps = 4;                   // blockDim (32, kWarps)
constexpr int kBlockRows = kWarps * kRows;  // 64 query rows (forward, dq) or keys (dk dv) per block
constexpr int kMaxD = 64;                   // head dims this path takes
constexpr int kDt = kMaxD / 8;              // accumulator tiles across the head dim
template <Kind K>
using Rows = mma_tiles::RowsA<K, kMaxD>;  // a warp's 16 rows over the head dim
// The row stride of a staged tile of T: rows start on 16 bytes (the copies' pieces) and the fragment loads' 8 rows
// fall in distinct banks; a tile's elements; the shared memory of two sets of two tiles (16-byte aligned).
template <class T>
constexpr int kLd = kMaxD + 16 / static_cast<int>(sizeof(T));
template <class T>
constexpr int kTileElems = kTile* kLd<T>;
template <class T>
constexpr int kSetsWords = 2 * 2 * kTileElems<T>* static_cast<int>(sizeof(T)) / 16;

// Rows [r0, r0 + rows) (r0 < limit) of a (·, D) operand into dst (stride kLd<T>), of its own type, 0 from `limit`
// on and past D (to Dp): copies started by the block's threads, complete after staged().
template <class T>
__device__ __forceinline__ void stage(T* dst, const T* __restrict__ x, const View4& s, int64_t b, int64_t h, int64_t r0,
                                      int rows, int64_t limit, int64_t D, int64_t Dp) {
  async_copy::view_rows(dst, kLd<T>, x + at(s, b, h, r0, 0), s.t, s.c, limit - r0, rows, D, Dp,
                        static_cast<int>(threadIdx.y * 32 + threadIdx.x), 32 * kWarps);
}
using async_copy::staged;

// Key tile t (keys [t·kTile, +kTile)) and its value tile into buffer set `set` of KV (the forward's and dq's).
template <class T>
__device__ __forceinline__ void stage_keys(T* KV, const Args<T>& p, int64_t b, int64_t h, int64_t t, int set, int64_t D,
                                           int64_t Dp) {
  T* const Ks = KV + set * 2 * kTileElems<T>;
  stage(Ks, p.k, p.sk, b, h, t * kTile, kTile, p.S, D, Dp);
  stage(Ks + kTileElems<T>, p.v, p.sv, b, h, t * kTile, kTile, p.S, D, Dp);
}

template <class T>
__global__ void __launch_bounds__(32 * kWarps, 1)
    mma_forward_kernel(Args<T> p, T* __restrict__ o, View4 so, float* __restrict__ lse) {
  constexpr Kind K = mma::kind_of<T>();
  constexpr int ld = kLd<T>;
  __shared__ async_copy::Bytes16 KV_[kSetsWords<T>];     // 2 sets of a key and a value tile; first the block's queries
  __shared__ float Ps[kWarps][kRows * mma_tiles::kPld];  // TF32's P, per warp
  T* const KV = reinterpret_cast<T*>(KV_);
  const int warp = threadIdx.y;
  const int64_t bh = blockIdx.y, b = bh / p.H, h = bh % p.H, t0 = int64_t(blockIdx.x) * kBlockRows, D = p.D;
  const int64_t Dp = padded<K>(D);
  static_assert(2 * kTile == kBlockRows, "a block's rows are staged where a key and a value tile go");
  stage(KV, p.q, p.sq, b, h, t0, kBlockRows, p.Tq, D, Dp);
  staged();
  Rows<K> qa;
  mma_tiles::load_rows(qa, KV + warp * kRows * ld, ld, Dp);
  float m[2] = {neg_inf<float>(), neg_inf<float>()}, l[2] = {0.0f, 0.0f};  // rows g and g + 8
  FragC acc[kDt] = {};
  const int64_t n = keys_for(p, t0, kBlockRows), tw = t0 + warp * kRows;
  auto keys = [&](int64_t t, int set) { stage_keys(KV, p, b, h, t, set, D, Dp); };
  async_copy::pipeline((n + kTile - 1) / kTile, keys, [&](int64_t t, int set) {
    const int64_t s0 = t * kTile;
    const T *const Ks = KV + set * 2 * kTileElems<T>, *const Vs = Ks + kTileElems<T>;
    FragC s[kNt];
    mma_tiles::products(s, qa, Ks, ld, Dp);
    float mx[2] = {neg_inf<float>(), neg_inf<float>()};
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[j].x[i] = score(p, b, h, tw + row_of(i), s0 + col_of(j, i), s[j].x[i]);
        mx[i >> 1] = nan_max(mx[i >> 1], s[j].x[i]);
      }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float tile_max = group_max(mx[r]);
      // A NaN score poisons the row: m, l and the accumulator become NaN and stay NaN (fmax would drop it).
      const float m_new = tile_max != tile_max ? tile_max : fmaxf(m[r], tile_max);
      corr[r] = m_new == neg_inf<float>() ? 1.0f : dexp(m[r] - m_new);  // exp(-inf) = 0 on the first kept tile
      mx[r] = m_new;                                                    // the row's new max; m[r] still the old one
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float mr = mx[i >> 1];
        s[j].x[i] = mr == neg_inf<float>() ? 0.0f : dexp(s[j].x[i] - mr);  // masked keys: exp(-inf) = 0
        sum[i >> 1] += s[j].x[i];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + group_sum(sum[r]), m[r] = mx[r];
#pragma unroll
    for (int d = 0; d < kDt; ++d)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[d].x[i] *= corr[i >> 1];
    mma_tiles::times_tile<K, kMaxD>(acc, s, Vs, ld, Dp, Ps[warp]);
  });
  const int tt = mma::lane_t();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t t = tw + mma::lane_g() + 8 * r;
    if (t >= p.Tq) continue;
    const bool live = l[r] > 0.0f || l[r] != l[r];  // no kept key: a zero row; a NaN row stays NaN
    const float inv = live ? 1.0f / l[r] : 0.0f;
#pragma unroll
    for (int d = 0; d < kDt; ++d)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t c = 8 * d + 2 * tt + e;
        if (c < D) o[at(so, b, h, t, c)] = from_acc<T>(live ? acc[d].x[2 * r + e] * inv : 0.0f);  // exact 0: no key
      }
    if (tt == 0) lse[bh * p.Tq + t] = live ? m[r] + dlog(l[r]) : neg_inf<float>();
  }
}

template <class T>
__global__ void __launch_bounds__(32 * kWarps, 1)
    mma_backward_dq_kernel(Args<T> p, const T* __restrict__ o, View4 so, const T* __restrict__ dout, View4 sg,
                           const float* __restrict__ lse, float* __restrict__ delta, T* __restrict__ dq) {
  constexpr Kind K = mma::kind_of<T>();
  constexpr int ld = kLd<T>;
  __shared__ async_copy::Bytes16 KV_[kSetsWords<T>];  // 2 sets of a key and a value tile; first the block's q and dO
  __shared__ float Ps[kWarps][kRows * mma_tiles::kPld];
  T* const KV = reinterpret_cast<T*>(KV_);
  const int warp = threadIdx.y, lane = threadIdx.x;
  const int64_t bh = blockIdx.y, b = bh / p.H, h = bh % p.H, t0 = int64_t(blockIdx.x) * kBlockRows, D = p.D;
  const int64_t Dp = padded<K>(D), tw = t0 + warp * kRows;
  Rows<K> qa, ga;
  stage(KV, p.q, p.sq, b, h, t0, kBlockRows, p.Tq, D, Dp);
  stage(KV + 2 * kTileElems<T>, dout, sg, b, h, t0, kBlockRows, p.Tq, D, Dp);
  staged();
  mma_tiles::load_rows(qa, KV + warp * kRows * ld, ld, Dp);
  mma_tiles::load_rows(ga, KV + 2 * kTileElems<T> + warp * kRows * ld, ld, Dp);
  // delta = dO · o of the warp's rows (lane c's columns, then the warp's sum), and their lse.
  float L[2], dl[2];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t t = tw + r;
    float part = 0.0f;
    if (t < p.Tq)
      for (int64_t c = lane; c < D; c += 32) part += to_acc(dout[at(sg, b, h, t, c)]) * to_acc(o[at(so, b, h, t, c)]);
    part = tiles::warp_sum(part);
    if (t < p.Tq && lane == 0) delta[bh * p.Tq + t] = part;
    if (r == mma::lane_g()) dl[0] = part;
    if (r == mma::lane_g() + 8) dl[1] = part;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t t = tw + mma::lane_g() + 8 * r;
    L[r] = t < p.Tq ? lse[bh * p.Tq + t] : neg_inf<float>();
  }
  FragC acc[kDt] = {};
  const int64_t n = keys_for(p, t0, kBlockRows);
  auto keys = [&](int64_t t, int set) { stage_keys(KV, p, b, h, t, set, D, Dp); };
  async_copy::pipeline((n + kTile - 1) / kTile, keys, [&](int64_t t, int set) {
    const int64_t s0 = t * kTile;
    const T *const Ks = KV + set * 2 * kTileElems<T>, *const Vs = Ks + kTileElems<T>;
    FragC s[kNt], dp[kNt];
    mma_tiles::products(s, qa, Ks, ld, Dp);
    mma_tiles::products(dp, ga, Vs, ld, Dp);  // dP = dO Vᵀ
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float pj = prob(score(p, b, h, tw + row_of(i), s0 + col_of(j, i), s[j].x[i]), L[i >> 1]);
        s[j].x[i] = p.scale * pj * (dp[j].x[i] - dl[i >> 1]);  // dS
      }
    mma_tiles::times_tile<K, kMaxD>(acc, s, Ks, ld, Dp, Ps[warp]);  // dq += dS K
  });
  const int tt = mma::lane_t();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t t = tw + mma::lane_g() + 8 * r;
    if (t >= p.Tq) continue;
#pragma unroll
    for (int d = 0; d < kDt; ++d)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t c = 8 * d + 2 * tt + e;
        if (c < D) dq[(bh * p.Tq + t) * D + c] = from_acc<T>(L[r] == neg_inf<float>() ? 0.0f : acc[d].x[2 * r + e]);
      }
  }
}

template <class T>
__global__ void __launch_bounds__(32 * kWarps, 1)
    mma_backward_dkv_kernel(Args<T> p, const T* __restrict__ dout, View4 sg, const float* __restrict__ lse,
                            const float* __restrict__ delta, T* __restrict__ dk, T* __restrict__ dv) {
  constexpr Kind K = mma::kind_of<T>();
  constexpr int ld = kLd<T>;
  __shared__ async_copy::Bytes16 QG_[kSetsWords<T>];  // 2 sets of a query and a dO tile; first the block's k and v
  __shared__ float LD[2][2][kTile];                   // per set, the query tile's lse and delta
  __shared__ float Ps[kWarps][kRows * mma_tiles::kPld];
  T* const QG = reinterpret_cast<T*>(QG_);
  const int warp = threadIdx.y, tid = warp * 32 + threadIdx.x;
  const int64_t bh = blockIdx.y, b = bh / p.H, h = bh % p.H, j0 = int64_t(blockIdx.x) * kBlockRows, D = p.D;
  const int64_t Dp = padded<K>(D), jw = j0 + warp * kRows;
  Rows<K> ka, va;
  stage(QG, p.k, p.sk, b, h, j0, kBlockRows, p.S, D, Dp);
  stage(QG + 2 * kTileElems<T>, p.v, p.sv, b, h, j0, kBlockRows, p.S, D, Dp);
  staged();
  mma_tiles::load_rows(ka, QG + warp * kRows * ld, ld, Dp);
  mma_tiles::load_rows(va, QG + 2 * kTileElems<T> + warp * kRows * ld, ld, Dp);
  FragC dka[kDt] = {}, dva[kDt] = {};
  // With causal, query t sees key j when t >= j - (S - T): the block's first key bounds the first query tile.
  int64_t first = p.causal ? j0 - (p.S - p.Tq) : 0;
  first = first < 0 ? 0 : first - first % kTile;
  const int64_t count = first < p.Tq ? (p.Tq - first + kTile - 1) / kTile : 0;
  // The query tile's lse and delta are 0 past Tq: such a query's score is -inf, its P 0 whatever its lse.
  auto stage_queries = [&](int64_t t, int set) {
    const int64_t i0 = first + t * kTile;
    T* const Qs = QG + set * 2 * kTileElems<T>;
    stage(Qs, p.q, p.sq, b, h, i0, kTile, p.Tq, D, Dp);
    stage(Qs + kTileElems<T>, dout, sg, b, h, i0, kTile, p.Tq, D, Dp);
    async_copy::float_run(LD[set][0], lse + bh * p.Tq, i0, kTile, p.Tq, tid, 32 * kWarps);
    async_copy::float_run(LD[set][1], delta + bh * p.Tq, i0, kTile, p.Tq, tid, 32 * kWarps);
  };
  async_copy::pipeline(count, stage_queries, [&](int64_t t, int set) {
    const int64_t i0 = first + t * kTile;
    const T *const Qs = QG + set * 2 * kTileElems<T>, *const Gs = Qs + kTileElems<T>;
    const float *const Ls = LD[set][0], *const Ds = LD[set][1];
    FragC s[kNt], dp[kNt];
    mma_tiles::products(s, ka, Qs, ld, Dp);   // Sᵀ = K Qᵀ: row = key, column = query
    mma_tiles::products(dp, va, Gs, ld, Dp);  // dPᵀ = V dOᵀ
    FragC ds[kNt];
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int qi = col_of(j, i);
        const float pi = prob(score(p, b, h, i0 + qi, jw + row_of(i), s[j].x[i]), Ls[qi]);
        s[j].x[i] = pi;
        ds[j].x[i] = p.scale * pi * (dp[j].x[i] - Ds[qi]);
      }
    mma_tiles::times_tile<K, kMaxD>(dva, s, Gs, ld, Dp, Ps[warp]);   // dv += Pᵀ dO
    mma_tiles::times_tile<K, kMaxD>(dka, ds, Qs, ld, Dp, Ps[warp]);  // dk += dSᵀ Q
  });
  const int tt = mma::lane_t();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t j = jw + mma::lane_g() + 8 * r;
    if (j >= p.S) continue;
#pragma unroll
    for (int d = 0; d < kDt; ++d)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t c = 8 * d + 2 * tt + e;
        if (c < D) {
          dk[(bh * p.S + j) * D + c] = from_acc<T>(dka[d].x[2 * r + e]);
          dv[(bh * p.S + j) * D + c] = from_acc<T>(dva[d].x[2 * r + e]);
        }
      }
  }
}

const dim3 kBlock(32, kWarps);

dim3 grid_of(int64_t n, int64_t heads) {
  return dim3(grid_dim((n + kBlockRows - 1) / kBlockRows), grid_dim(heads, kMaxGridYZ));
}

}  // namespace

namespace flash_launch {

bool mma_takes(const Problem& p, FloatElem elem) {
  if (elem == FloatElem::F64 || (elem == FloatElem::F32 && !p.allow_tf32)) return false;
  return p.D >= 1 && p.D <= kMaxD;
}

cudaError_t mma_forward(const Problem& p, void* o, View4 so, void* lse, FloatElem elem, cudaStream_t stream) {
  if (p.T == 0 || p.B * p.H == 0) return cudaSuccess;
  return visit_mma_elem(elem, [&](auto tag) {
    using T = decltype(tag);
    return launch_kernel(mma_forward_kernel<T>, grid_of(p.T, p.B * p.H), kBlock, stream, args_of<T>(p),
                         static_cast<T*>(o), so, static_cast<float*>(lse));
  });
}

cudaError_t mma_backward(const Problem& p, const void* o, View4 so, const void* dout, View4 sg, const void* lse,
                         void* delta, void* dq, void* dk, void* dv, FloatElem elem, cudaStream_t stream) {
  if (p.B * p.H == 0) return cudaSuccess;
  return visit_mma_elem(elem, [&](auto tag) {
    using T = decltype(tag);
    if (p.T > 0) {
      const cudaError_t err =
          launch_kernel(mma_backward_dq_kernel<T>, grid_of(p.T, p.B * p.H), kBlock, stream, args_of<T>(p),
                        static_cast<const T*>(o), so, static_cast<const T*>(dout), sg, static_cast<const float*>(lse),
                        static_cast<float*>(delta), static_cast<T*>(dq));
      if (err != cudaSuccess) return err;
    }
    if (p.S == 0) return cudaSuccess;
    return launch_kernel(mma_backward_dkv_kernel<T>, grid_of(p.S, p.B * p.H), kBlock, stream, args_of<T>(p),
                         static_cast<const T*>(dout), sg, static_cast<const float*>(lse),
                         static_cast<const float*>(delta), static_cast<T*>(dk), static_cast<T*>(dv));
  });
}

}  // namespace flash_launch
}  // namespace asc::cuda
