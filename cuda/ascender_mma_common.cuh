#pragma once
// What the tensor-core kernels of fused ASCender attention share — the forward (cuda/ascender_mma.cu) and the
// backward (cuda/ascender_mma_backward.cu): the size limits, one head's inputs, staging rows into shared memory, the
// key tiles a block of rows visits (windowed mode), the keep test, A fragments read from global memory, the raw
// rows' moments and standardisation, and the per-row record the forward leaves for the backward (Rec).
// C++17 and CUDA headers only (included from .cu files, which the CUDA emulator also compiles as C++).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cuda/ascender_launch.h"
#include "cuda/async_copy.cuh"
#include "cuda/mma.cuh"
#include "cuda/mma_tiles.cuh"
#include "cuda/row_kernels.cuh"

namespace asc::cuda::ascender_mma {

using ascender_launch::Params;
using mma::FragC;
using mma::Kind;
using mma_tiles::kRows;
using mma_tiles::kTile;
using rows::to_acc;

constexpr int kMaxD = 64;    // d
constexpr int kMaxL = 32;    // d_z, d_a
constexpr int kMaxNbr = 32;  // k
// The row stride, in elements, of a staged tile of element type T up to W columns wide: rows start on 16 bytes (the
// pieces async_copy moves) and the fragment loads' 8 rows fall in distinct banks.
template <class T>
__host__ __device__ constexpr int ld_of(int W) {
  return W + 16 / static_cast<int>(sizeof(T));
}
constexpr int kLdD = ld_of<float>(kMaxD), kLdL = ld_of<float>(kMaxL);  // float32 tiles

// Bytes rounded up to 16, and typed arrays carved one after another out of a byte region of shared memory, each on
// 16 bytes (the kernels' tiles have the inputs' element type, their per-key fields float32).
__host__ __device__ constexpr int bytes16(int b) { return (b + 15) / 16 * 16; }
template <class T>
__host__ __device__ constexpr int tile_bytes(int W, int rows = kTile) {
  return bytes16(rows * ld_of<T>(W) * static_cast<int>(sizeof(T)));
}
using async_copy::Bytes16;
struct Carve {
  unsigned char* at;
  template <class T>
  __device__ T* take(int count) {
    T* const r = reinterpret_cast<T*>(at);
    at += bytes16(count * static_cast<int>(sizeof(T)));
    return r;
  }
  template <class T>
  __device__ T* tile(int W, int rows = kTile) {
    return take<T>(rows * ld_of<T>(W));
  }
};

// The block's linear thread index and size (blockDim (32, warps)).
__device__ __forceinline__ int block_thread() { return threadIdx.y * 32 + threadIdx.x; }
__device__ __forceinline__ int block_threads() { return blockDim.x * blockDim.y; }

// What the forward leaves per query row for the backward, float32 at (bh·T + i)·kRec + field: the row's softmax
// (max of S / τ over kept keys, and its sum l), the coefficients of S (S = q k_rotᵀ / √d + k0 + ka r + ks φ + kc dc +
// bias), the gates' factors, and per raw row (align r, sep φ, coh dc) the moments of its kept entries with the
// standardisation's σ and scale (0: a constant row, or none kept).
enum Rec : int {
  rMax,
  rSum,
  rK0,
  rKa,
  rKs,
  rKc,
  rFa,
  rLa,
  rGammaA,
  rSnorm,
  rNbr,  // align: fa, λ_a γ, γ, |s|, |N(i)| (-1: a NaN candidate)
  rLs,
  rEta,
  rRho,  // sep: λ_s η, η, ρ
  rLc,
  rGammaC,
  rVarC,
  rW,     // coh: λ_c γ, γ, Var, W
  rStat,  // 3 × {count, mean, M2, σ, scale}: align, sep, coh
  kRec = rStat + 15
};
enum StatField : int { sCount, sMean, sM2, sSd, sScale };
__host__ __device__ constexpr int rec_stat(int term, int field) { return rStat + 5 * term + field; }

// The forward's workspace (mma_workspace_floats), float32: per row, the norms |k_j|, |e_j|, the inverses the
// products are divided by, 1 / max(|k_j|, 1e-12) and 1 / max(|e_j|, 1e-8), and |z_j|² of z as the operands read it
// (each (rows)); u_i (rows, d), c_i (rows, d_z), and — when the forward keeps them for the backward — the records
// (rows, kRec). The per-key fields are made once by key_fields_kernel and copied into each key tile with it.
// The row count B·H·T rounded up to 4: the workspaces' arrays are spaced by it, so that each starts on 16 bytes (the
// pieces async_copy moves).
__host__ __device__ inline int64_t rows16(const Params& p) { return (p.B * p.H * p.T + 3) / 4 * 4; }

struct MmaWorkspace {
  float *knorm, *enorm, *kinv, *einv, *zsq, *u, *c, *rec;
  int64_t rows;
  static constexpr int kKeyFields = 5;  // knorm ... zsq
  __host__ __device__ MmaWorkspace(const Params& p, void* base) : rows(p.B * p.H * p.T) {
    const int64_t r = rows16(p);
    knorm = static_cast<float*>(base), enorm = knorm + r, kinv = enorm + r, einv = kinv + r;
    zsq = einv + r, u = zsq + r, c = u + r * p.d, rec = c + r * p.dz;
  }
};

// One (batch, head): its (T, width) input rows, per-key norms and scalars.
template <class S>
struct Head {
  const S *q, *kr, *k, *v, *z, *e, *scal;
  const float *kinv, *einv, *zsq;  // 1 / max(|k_j|, 1e-12), 1 / max(|e_j|, 1e-8), |z_j|² (MmaWorkspace)
  int64_t b, h, bh;
  __device__ float scalar(int s, int64_t H) const { return to_acc(scal[s * H + h]); }
};

// Rows [r0, r0 + rows) of a (n, width) array into dst (stride ld), of its own element type, 0 past n and past the
// width (up to wp columns): copies started by the block's threads (cuda/async_copy.cuh), complete after staged().
// The unit vectors k̂ and ê are never staged: the products take the inputs themselves (exact operands in bfloat16 /
// float16) and are divided by the norms after (inv_norms).
template <class T>
__device__ __forceinline__ void stage(T* dst, int ld, const T* x, int64_t r0, int rows, int64_t n, int64_t width,
                                      int64_t wp) {
  async_copy::tile(dst, ld, x, r0, rows, n, width, wp, block_thread(), block_threads());
}
using async_copy::staged;

// A per-key field of the workspace (MmaWorkspace: an inverse norm, |z_j|²) for keys [r0, r0 + kTile), 0 past n:
// copies started by the block's threads, complete after staged().
__device__ __forceinline__ void fields(float* dst, const float* x, int64_t r0, int64_t n) {
  async_copy::float_run(dst, x, r0, kTile, n, block_thread(), block_threads());
}

// The key tiles a block of rows [t0, t0 + rows) visits: [a0, a1) then [b0, b1), tile starts step kTile. Every key,
// or in windowed mode the tiles of the global tokens and of the window's band (a block holding a global row sees
// every key).
struct Visit {
  int64_t a0, a1, b0, b1;
};
__device__ __forceinline__ Visit visit_of(const Params& p, int64_t t0, int64_t rows) {
  const int64_t n = p.T, w = p.window, g = p.global_tokens < n ? p.global_tokens : n;
  if (w <= 0 || t0 < g) return {0, n, 0, 0};
  const int64_t lo = t0 - w + 1 > 0 ? t0 - w + 1 : 0, hi = t0 + rows - 1 + w < n ? t0 + rows - 1 + w : n;
  const int64_t g_end = (g + kTile - 1) / kTile * kTile, lo_tile = lo / kTile * kTile;
  return {0, g, lo_tile > g_end ? lo_tile : g_end, hi};
}
template <class F>
__device__ __forceinline__ void for_tiles(const Visit& v, F&& f) {
  for (int64_t s0 = v.a0; s0 < v.a1; s0 += kTile) f(s0);
  for (int64_t s0 = v.b0; s0 < v.b1; s0 += kTile) f(s0);
}
// How many tiles v holds, and the start of tile t (in for_tiles' order).
__device__ __forceinline__ int64_t tiles_in(const Visit& v) {
  return (v.a1 - v.a0 + kTile - 1) / kTile + (v.b1 > v.b0 ? (v.b1 - v.b0 + kTile - 1) / kTile : 0);
}
__device__ __forceinline__ int64_t tile_at(const Visit& v, int64_t t) {
  const int64_t na = (v.a1 - v.a0 + kTile - 1) / kTile;
  return t < na ? v.a0 + t * kTile : v.b0 + (t - na) * kTile;
}

// Sets of tile buffers a kernel of element type S keeps: two for the 16-bit kinds, whose next tile is copied while
// one is computed; one for float32 (TF32), whose tiles leave no room for a second set in 48 KiB of shared memory.
template <class S>
inline constexpr int kSets = sizeof(S) == 2 ? 2 : 1;

// The tiles of v, as for_tiles, each copied into shared memory before it is computed:
//   stage(s0, set)    starts the copies of tile s0 into buffer set `set` (stage(), fields());
//   compute(s0, set)  reads them.
// With 2 sets there is one barrier per tile: it finds tile t's copies complete and every thread done with tile
// t - 1, whose set the copies of tile t + 1 then take while tile t is computed. With 1 set copies and products
// alternate. It begins with a barrier (the sets may hold what the block read before) and ends without one.
template <int kNumSets, class Stage, class Compute>
__device__ __forceinline__ void for_tiles_pipelined(const Visit& v, Stage&& stage, Compute&& compute) {
  const int64_t count = tiles_in(v);
  if constexpr (kNumSets == 2) {
    async_copy::pipeline(
        count, [&](int64_t t, int set) { stage(tile_at(v, t), set); },
        [&](int64_t t, int set) { compute(tile_at(v, t), set); });
  } else {
    for (int64_t t = 0; t < count; ++t) {
      const int64_t s0 = tile_at(v, t);
      __syncthreads();
      stage(s0, 0);
      staged();
      compute(s0, 0);
    }
  }
}

// Whether row i attends to key j: inside the sequence, the window or a global token, and the keep mask.
__device__ __forceinline__ bool kept(const Params& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (i >= p.T || j >= p.T) return false;
  const int64_t w = p.window, g = p.global_tokens;
  bool kp = w <= 0 || (i > j ? i - j : j - i) < w || i < g || j < g;
  if (p.keep)
    kp = kp && p.keep[b * p.keep_stride[0] + h * p.keep_stride[1] + i * p.keep_stride[2] + j * p.keep_stride[3]];
  return kp;
}

// The warp's 16 rows [r0, r0 + 16) of a (n, width) row-major array as A fragments over wp columns, read from global
// memory (0 past n and the width). Used for the operands of two passes only (q, u_i, c_i): held across the others,
// they would cost the registers the products need.
template <Kind K, int W, class X>
__device__ __forceinline__ void load_global(mma_tiles::RowsA<K, W>& ra, const X* x, int64_t r0, int64_t n,
                                            int64_t width, int64_t wp) {
  const int g = mma::lane_g(), t = mma::lane_t();
  auto at = [&](int m, int64_t c) { return r0 + m < n && c < width ? to_acc(x[(r0 + m) * width + c]) : 0.0f; };
#pragma unroll
  for (int s = 0; s < mma_tiles::RowsA<K, W>::kSteps; ++s) {
    const int64_t k0 = int64_t(s) * mma::kK<K>;
    if (k0 >= wp) break;
    mma::FragA& a = ra.a[s];
    if constexpr (K == Kind::TF32) {
      a.r[0] = mma::tf32_bits(at(g, k0 + t)), a.r[1] = mma::tf32_bits(at(g + 8, k0 + t));
      a.r[2] = mma::tf32_bits(at(g, k0 + t + 4)), a.r[3] = mma::tf32_bits(at(g + 8, k0 + t + 4));
    } else {
      auto two = [&](int m, int64_t c) { return mma::pack2<K>(at(m, c), at(m, c + 1)); };
      a.r[0] = two(g, k0 + 2 * t), a.r[1] = two(g + 8, k0 + 2 * t);
      a.r[2] = two(g, k0 + 2 * t + 8), a.r[3] = two(g + 8, k0 + 2 * t + 8);
    }
  }
}

// Bit 4 j + e: entry e of accumulator tile j is a kept pair — the lane's rows own[0], own[1] (g and g + 8 of the
// warp's) against the tile's columns s0 + col_of(j, e). kOwnKeys: the rows are keys and the columns queries (the
// backward's key blocks).
template <bool kOwnKeys = false>
__device__ __forceinline__ unsigned keep_bits(const Params& p, int64_t b, int64_t h, const int64_t (&own)[2],
                                              int64_t s0) {
  unsigned bits = 0;
#pragma unroll
  for (int j = 0; j < mma_tiles::kNt; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t other = s0 + mma_tiles::col_of(j, e);
      if (kOwnKeys ? kept(p, b, h, other, own[e >> 1]) : kept(p, b, h, own[e >> 1], other)) bits |= 1u << (4 * j + e);
    }
  return bits;
}

// The additive bias of (row i, key j), of element type S (p.bias set).
template <class S>
__device__ __forceinline__ float bias_at(const Params& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  return to_acc(static_cast<const S*>(
      p.bias)[b * p.bias_stride[0] + h * p.bias_stride[1] + i * p.bias_stride[2] + j * p.bias_stride[3]]);
}

// A squared distance from its expansion |x|² + |y|² - 2 x·y (the product's value), clamped at 0 against rounding.
__device__ __forceinline__ float dist2(float xx, float yy, float xy) {
  const float v = xx + yy - 2.0f * xy;
  return v < 0.0f ? 0.0f : v;  // a NaN stays
}

// x as the tensor core reads it as an operand of kind K (the squared norms that complete a distance's expansion must
// be those of the same values, or |z_i - z_i|² is not 0).
template <Kind K>
__device__ __forceinline__ float as_operand(float x) {
  if constexpr (K == Kind::TF32) {
    const uint32_t u = mma::tf32_bits(x);
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  } else if constexpr (K == Kind::BF16) {
    return __bfloat162float(__float2bfloat16(x));
  } else {
    return __half2float(__float2half(x));
  }
}

// |x|² of a row of `width` values as operands of kind K, summed in column order (every |z|² of the kernels is this
// sum, so that |z_i - z_i|² is 0).
template <Kind K, class S>
__device__ __forceinline__ float operand_sq(const S* x, int64_t width) {
  float s = 0.0f;
  for (int64_t c = 0; c < width; ++c) {
    const float v = as_operand<K>(to_acc(x[c]));
    s += v * v;
  }
  return s;
}

// (x, j) ranks before (y, l) in a neighbourhood: larger score, ties to the lower index.
__device__ __forceinline__ bool better(float x, int j, float y, int l) { return x > y || (x == y && j < l); }

// A running count, mean and M2 of a raw row's entries, with its largest magnitude; merged across tiles by Welford's
// update and across the lanes of a group as Chan et al. (stable where sums of squares are not).
struct Moments {
  float n = 0, mean = 0, m2 = 0, big = 0;
  __device__ void add(float x) {
    n += 1.0f;
    const float dlt = x - mean;
    mean += dlt / n;
    m2 += dlt * (x - mean);
    const float ax = x < 0.0f ? -x : x;
    big = ax > big ? ax : big;  // a NaN does not enter big (as the row kernel's max)
  }
  __device__ void merge_group() {
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {
      const float nb = __shfl_xor_sync(0xffffffffu, n, o), mb = __shfl_xor_sync(0xffffffffu, mean, o);
      const float m2b = __shfl_xor_sync(0xffffffffu, m2, o), bb = __shfl_xor_sync(0xffffffffu, big, o);
      const float nt = n + nb;
      if (nt > 0.0f) {
        const float dlt = mb - mean;
        mean += dlt * nb / nt;
        m2 += m2b + dlt * dlt * n * nb / nt;
      }
      n = nt;
      big = bb > big ? bb : big;
    }
  }
};

// A raw row's standardisation from the moments of its source (raw = f src): β̃_j = (raw_j - mu) scale; scale 0 on a
// constant row (σ <= constant_row max|raw|: Params::constant_row, at the operands' rounding level, mma_constant_row)
// and on a row without kept keys.
struct Standardise {
  float mu = 0, scale = 0, sd = 0;  // sd: σ of the raw row (the backward's standardisation needs it)
  Standardise() = default;
  __device__ Standardise(const Moments& m, float f, double eps, double constant_rel) {
    if (m.n == 0.0f) return;
    mu = f * m.mean;
    const float af = f < 0.0f ? -f : f;
    const double sdd = double(af) * sqrt(double(m.m2 > 0.0f ? m.m2 : 0.0f) / m.n);
    const bool constant = sdd <= constant_rel * double(af * m.big);
    scale = constant ? 0.0f : static_cast<float>(1 / (sdd + eps));
    sd = static_cast<float>(sdd);
    if (m.mean != m.mean || f != f) mu = scale = NAN;  // a NaN entry or factor: the row is NaN
  }
};

// Two raw rows of a warp's 16 query rows over a staged tile of 32 keys, as the forward and the backward's query
// blocks compute them:
//   align_tile  r_ij = u_i · k̂_j: the rows of u (n, d) times the raw keys KHs, over |k_j| (KN = 1 / max(|k_j|, ε));
//   coh_tile    dc_ij = |z_j - c_i|²: the rows of c (n, d_z) times the keys' z (Zs), with ZZs = |z_j|² and cc the
//               lane's rows' |c_i|².
// The key tiles have the inputs' element type and stride ld_of.
template <Kind K, class T>
__device__ __forceinline__ void align_tile(FragC (&x)[mma_tiles::kNt], const float* U, int64_t tw, int64_t n, int64_t d,
                                           int64_t dp, const T* KHs, const float* KN) {
  mma_tiles::RowsA<K, kMaxD> ua;
  load_global(ua, U, tw, n, d, dp);
  mma_tiles::products(x, ua, KHs, ld_of<T>(kMaxD), dp);
#pragma unroll
  for (int j = 0; j < mma_tiles::kNt; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) x[j].x[e] *= KN[mma_tiles::col_of(j, e)];
}
template <Kind K, class T>
__device__ __forceinline__ void coh_tile(FragC (&x)[mma_tiles::kNt], const float* C, int64_t tw, int64_t n, int64_t dz,
                                         int64_t dzp, const T* Zs, const float* ZZs, const float (&cc)[2]) {
  mma_tiles::RowsA<K, kMaxL> ca;
  load_global(ca, C, tw, n, dz, dzp);
  mma_tiles::products(x, ca, Zs, ld_of<T>(kMaxL), dzp);
#pragma unroll
  for (int j = 0; j < mma_tiles::kNt; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) x[j].x[e] = dist2(ZZs[mma_tiles::col_of(j, e)], cc[e >> 1], x[j].x[e]);
}

}  // namespace asc::cuda::ascender_mma
