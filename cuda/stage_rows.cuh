#pragma once
// Staging rows of a row-major (·, width) matrix into float32 shared memory, for the tensor-core kernels
// (cuda/sparse_mma.cu): 16 bytes per global load, and every load of a batch issued before the
// batch's first store. The element-wise loops this replaces waited out a whole memory round trip per element: a load
// cannot move above an earlier store to shared memory, which the compiler must assume may alias it, so each load
// started only when the previous element had been stored.
//
//   // rows keys[0 .. 32) of K (·, 64), bfloat16, into a (32, ld) float tile, by a warp's 32 lanes:
//   stage_rows::gather<4>(tile, ld, K, 64, 32, [&](int r) { return keys[r]; }, lane, 32);
// C++17 and CUDA headers only (included from .cu files; the CPU emulator compiles them as C++).
#include <cstdint>

#include "cuda/row_kernels.cuh"

namespace asc::cuda::stage_rows {

// Elements of T in one 16-byte load, and the load's type: an aggregate of T, so that reading T through it is allowed
// (also the dense elementwise kernels' packs, cuda/elementwise.cu).
template <class T>
inline constexpr int kVec = 16 / static_cast<int>(sizeof(T));
template <class T>
struct alignas(16) Pack {
  T v[kVec<T>];
};

// Whether rows of `width` elements from x can be read in packs: x 16-byte aligned and width a multiple of the pack
// (then every row starts on a pack).
template <class T>
__device__ __forceinline__ bool packable(const T* x, int64_t width) {
  return width % kVec<T> == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

// Rows r = 0 .. rows-1 of the tile: source row src(r) of x (a negative source: a row of zeros), columns [0, width),
// into dst[r * ld + c] as float32. Thread t of the nthreads that call it together takes packs t, t + nthreads, ...;
// kBatch packs per thread are in flight at once. Returns whether a staged value is not finite (this thread's
// values only). Needs packable(x, width).
template <int kBatch, class T, class Src>
__device__ __forceinline__ bool gather(float* dst, int ld, const T* __restrict__ x, int64_t width, int rows_n,
                                       Src&& src, int t, int nthreads) {
  constexpr int V = kVec<T>;
  const int per_row = static_cast<int>(width) / V, total = rows_n * per_row;
  bool bad = false;
  for (int base = t; base < total; base += kBatch * nthreads) {
    Pack<T> buf[kBatch];
    unsigned on = 0;
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {  // the loads
      const int e = base + i * nthreads;
      if (e < total) {
        const int64_t s = src(e / per_row);
        if (s >= 0) {
          buf[i] = *reinterpret_cast<const Pack<T>*>(x + s * width + static_cast<int64_t>(e % per_row) * V);
          on |= 1u << i;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {  // then the stores
      const int e = base + i * nthreads;
      if (e >= total) break;
      float* d = dst + (e / per_row) * ld + (e % per_row) * V;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float v = (on >> i) & 1u ? cuda::rows::to_acc(buf[i].v[k]) : 0.0f;
        bad |= !(v - v == 0.0f);  // NaN or ±inf
        d[k] = v;
      }
    }
  }
  return bad;
}

// Columns [width, wp) of rows 0 .. rows-1 of the tile set to 0 (the padding the products read).
__device__ __forceinline__ void zero_columns(float* dst, int ld, int rows_n, int64_t width, int64_t wp, int t,
                                             int nthreads) {
  const int pad = static_cast<int>(wp - width);
  for (int e = t; e < rows_n * pad; e += nthreads) dst[(e / pad) * ld + width + e % pad] = 0.0f;
}

}  // namespace asc::cuda::stage_rows
