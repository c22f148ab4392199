#pragma once
// What the tensor-core attention kernels share (cuda/flash_mma.cu, cuda/ascender_mma.cu): a warp owns 16 rows of its
// block's tile and walks tiles of kTile = 32 keys; products over a width (the head dim, a latent dim) take the
// warp's rows as A fragments held in registers and a staged (kTile, ld) tile of shared memory as B; the
// (16 × kTile) results are kTile / 8 accumulator tiles, whose entries a lane holds for rows g and g + 8 (cuda/mma.cuh).
// C++17 and CUDA headers only (included from .cu files, which the CUDA emulator also compiles as C++).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention_tiles.cuh"
#include "cuda/mma.cuh"

namespace asc::cuda::mma_tiles {

using mma::FragA;
using mma::FragB;
using mma::FragC;
using mma::Kind;

constexpr int kRows = 16;        // rows a warp owns (one mma M)
constexpr int kTile = 32;        // keys (or queries) per tile
constexpr int kNt = kTile / 8;   // accumulator tiles across a tile
constexpr int kPld = kTile + 4;  // the row stride of a warp's (16, kTile) scratch for TF32's P

// A fragments covering a width of up to W columns (W a multiple of 16).
template <Kind K, int W>
struct RowsA {
  static constexpr int kSteps = W / mma::kK<K>;
  FragA a[kSteps];
};

// The width padded to the operand kind's k step (staged columns past the width are 0).
template <Kind K>
__host__ __device__ __forceinline__ int64_t padded(int64_t width) {
  return (width + mma::kK<K> - 1) / mma::kK<K> * mma::kK<K>;
}

// The warp's 16 rows of a staged (·, ld) tile as A fragments, over wp (padded) columns.
template <Kind K, int W, class T>
__device__ __forceinline__ void load_rows(RowsA<K, W>& r, const T* rows, int ld, int64_t wp) {
#pragma unroll
  for (int s = 0; s < RowsA<K, W>::kSteps; ++s)
    if (s * mma::kK<K> < wp) mma::load_a<K>(r.a[s], rows + s * mma::kK<K>, ld);
}

// acc[j] (+)= A · (rows 8j .. 8j + 7 of the staged (kTile, ld) tile `keys`)ᵀ over wp columns: a (16 × kTile) tile
// of products. zero: start from 0 (else accumulate). Tiles are float32, or 16-bit as the operands (mma::kStored).
template <Kind K, int W, class T>
__device__ __forceinline__ void products(FragC (&acc)[kNt], const RowsA<K, W>& r, const T* keys, int ld, int64_t wp,
                                         bool zero = true) {
#pragma unroll
  for (int j = 0; j < kNt; ++j) {
    if (zero) acc[j] = FragC{};
#pragma unroll
    for (int s = 0; s < RowsA<K, W>::kSteps; ++s) {
      if (s * mma::kK<K> >= wp) break;
      FragB fb;
      mma::load_b_nk<K>(fb, keys + 8 * j * ld + s * mma::kK<K>, ld);
      mma::mma<K>(acc[j], r.a[s], fb);
    }
  }
}

// out[d] += P · (the staged (kTile, ld) tile `vals`) over wp output columns (out covers up to W), P the (16 × kTile)
// accumulators p; `scratch` is this warp's (16, kPld) slice of shared memory, which TF32 goes through (its A layout
// differs from the accumulators'; the 16-bit kinds take them in registers).
template <Kind K, int W, class T>
__device__ __forceinline__ void times_tile(FragC (&out)[W / 8], const FragC (&p)[kNt], const T* vals, int ld,
                                           int64_t wp, float* scratch) {
  constexpr int kk = mma::kK<K>;
  FragA pa[kTile / kk];
  if constexpr (K == Kind::TF32) {
    const int g = mma::lane_g(), t = mma::lane_t();
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) scratch[(g + (i >= 2 ? 8 : 0)) * kPld + 8 * j + 2 * t + (i & 1)] = p[j].x[i];
    __syncwarp();
#pragma unroll
    for (int s = 0; s < kTile / kk; ++s) mma::load_a<K>(pa[s], scratch + s * kk, kPld);
    __syncwarp();  // the slice is written again by the next call
  } else {
#pragma unroll
    for (int s = 0; s < kTile / kk; ++s) pa[s] = mma::a_from_c<K>(p[2 * s], p[2 * s + 1]);
  }
#pragma unroll
  for (int d = 0; d < W / 8; ++d) {
    if (8 * d >= wp) break;
#pragma unroll
    for (int s = 0; s < kTile / kk; ++s) {
      FragB fb;
      mma::load_b_kn<K>(fb, vals + s * kk * ld + 8 * d, ld);
      mma::mma<K>(out[d], pa[s], fb);
    }
  }
}

// The row (g or g + 8) and column, relative to the tile's origin, of entry i of accumulator tile j.
__device__ __forceinline__ int row_of(int i) { return mma::lane_g() + (i >= 2 ? 8 : 0); }
__device__ __forceinline__ int col_of(int j, int i) { return 8 * j + 2 * mma::lane_t() + (i & 1); }

// The max (NaN-keeping) and sum over a row's entries held by the 4 lanes of a group (lanes 4g .. 4g + 3).
__device__ __forceinline__ float group_max(float v) {
  v = tiles::nan_max(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return tiles::nan_max(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float group_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

}  // namespace asc::cuda::mma_tiles
