#pragma once
// What the tiled attention kernels share (cuda/flash_attention.cu, dense; cuda/sparse_attention.cu, over a pattern):
// the block shape, the head-dimension bound, the warp reductions that keep NaN, and the loader that stages rows of
// an operand into shared memory. Each kernel file keeps its own walk over keys and its own online softmax.
// C++17 and CUDA headers only (included from .cu files, which the CUDA emulator also compiles as C++).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/row_kernels.cuh"

namespace asc::cuda::tiles {

constexpr int kWarps = 4;  // warps per block: blockDim (32, kWarps)
constexpr int kTile = 32;  // keys (or queries) per tile: one per lane
template <class A>
constexpr int kMaxD = sizeof(A) == 8 ? 64 : 128;  // the launchers' max_head_dim: the tiles fit 48 KiB of shared memory
template <class A>
constexpr int kPer = kMaxD<A> / 32;  // accumulator columns per lane (lane c holds c, c + 32, ...)

template <class A>
__device__ __forceinline__ A neg_inf() {
  return -static_cast<A>(INFINITY);
}
template <class A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// max(a, b) that is NaN when either is: a NaN score must make its row NaN, as in PyTorch (fmax would drop it).
template <class A>
__device__ __forceinline__ A nan_max(A a, A b) {
  return (b > a || b != b) ? b : a;
}
template <class A>
__device__ __forceinline__ A warp_max(A v) {
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Rows [r0, r0 + rows) of a (·, D) operand into dst (row stride ld) in the compute type, 0 for rows at or past
// `limit`; element (r, c) is read as at(r, c). All threads of the block take part (the caller synchronises).
template <class A, class At>
__device__ __forceinline__ void stage_rows(A* dst, int ld, int64_t r0, int rows, int64_t limit, int64_t D, At at) {
  const int tid = threadIdx.y * 32 + threadIdx.x;
  for (int64_t e = tid; e < rows * D; e += 32 * kWarps) {
    const int r = static_cast<int>(e / D);
    const int64_t c = e % D;
    dst[r * ld + c] = r0 + r < limit ? static_cast<A>(rows::to_acc(at(r0 + r, c))) : A(0);
  }
}

// A lane's share of a D-wide row held in registers: columns lane, lane + 32, ... (acc[u] is column lane + 32 u).
// acc += w · row, row a D-wide row of a tile in shared memory.
template <int PER, class A>
__device__ __forceinline__ void axpy_row(A (&acc)[PER], A w, const A* row, int64_t D) {
#pragma unroll
  for (int u = 0; u < PER; ++u) {
    const int64_t c = threadIdx.x + 32 * u;
    if (c < D) acc[u] += w * row[c];
  }
}
// dst[c · stride] = scale · acc, in the storage type T.
template <class T, int PER, class A>
__device__ __forceinline__ void store_row(T* dst, int64_t stride, const A (&acc)[PER], A scale, int64_t D) {
#pragma unroll
  for (int u = 0; u < PER; ++u) {
    const int64_t c = threadIdx.x + 32 * u;
    if (c < D) dst[c * stride] = rows::from_acc<T>(acc[u] * scale);
  }
}

}  // namespace asc::cuda::tiles
