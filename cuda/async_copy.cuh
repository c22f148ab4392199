#pragma once
// Tiles of rows copied from global into shared memory by the copy engine of sm_80+ (PTX cp.async), for the
// tensor-core kernels: the data never passes through registers, every copy of a tile is in flight at once, and the
// thread goes on until wait_all(). The element-wise staging loops this replaces converted each element on its way
// (a load, then a store to shared memory, which the compiler must assume may alias the next load: one whole memory
// round trip per element) and, with 16-byte loads instead, needed registers the ASCender kernels do not have. Tiles
// keep their source's element type: the fragment loads of cuda/mma.cuh read 16-bit operands as they are stored.
//
//   // rows [s0, s0 + 32) of K (n, 64), bfloat16, into a (32, ld) tile; rows past n and columns past 64 are 0:
//   async_copy::tile(Ks, ld, K, s0, 32, n, 64, 64, thread, nthreads);  // s0 < n
//   async_copy::staged();     // every thread's copies are done (wait_all, then a barrier)
//
// On the CPU emulator (tests/cuda_emu) each copy is made at once, which is one of the orders the hardware may take.
// C++17 and CUDA headers only (included from .cu files, which the emulator compiles as C++).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "cuda/row_kernels.cuh"

namespace asc::cuda::async_copy {

template <class T>
__device__ __forceinline__ T rows_zero() {
  return cuda::rows::from_acc<T>(0.0f);
}

// One copy of kBytes (4, 8 or 16) from src to dst (shared memory), of which the first `valid` bytes are read and
// the rest set to 0 (valid 0: src is not read). Both addresses aligned to kBytes.
template <int kBytes>
__device__ __forceinline__ void copy(void* dst, const void* src, int valid) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(ASC_CUDA_EMULATION_RUNTIME)
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(s), "l"(src), "n"(kBytes), "r"(valid));
#else
  if (valid > 0) std::memcpy(dst, src, static_cast<size_t>(valid));
  if (valid < kBytes) std::memset(static_cast<unsigned char*>(dst) + valid, 0, static_cast<size_t>(kBytes - valid));
#endif
}

// Waits for every copy this thread has started (the block's need a __syncthreads() after).
__device__ __forceinline__ void wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(ASC_CUDA_EMULATION_RUNTIME)
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// Rows 0 .. rows_n-1 of a strided view — row r at x + r·row_stride, column c at + c·col_stride (elements) — into
// dst (row stride ld): columns [0, wp) of each, 0 from row `avail` on and past the width. wp and ld are whole
// 16-byte pieces; avail ≥ 1 (x is row 0's start, a valid address). The block's threads (linear index t of nthreads)
// share the pieces. In 16-byte copies when the view allows (columns contiguous, width whole pieces, every row on 16
// bytes); otherwise the same pieces element by element, synchronously (one loop for both: a second would cost the
// registers the kernels that stage tiles do not have).
template <class T>
__device__ __forceinline__ void view_rows(T* dst, int ld, const T* x, int64_t row_stride, int64_t col_stride,
                                          int64_t avail, int rows_n, int64_t width, int64_t wp, int t, int nthreads) {
  constexpr int V = 16 / static_cast<int>(sizeof(T));
  const bool packed = col_stride == 1 && width % V == 0 && ld % V == 0 && (row_stride * sizeof(T)) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const int per_row = static_cast<int>(wp) / V, total = rows_n * per_row;
  for (int e = t; e < total; e += nthreads) {
    const int r = e / per_row, c = (e % per_row) * V;
    const bool row_in = r < avail;
    T* const d = dst + r * ld + c;
    const T* const s = x + r * row_stride + c * col_stride;
    if (packed) {
      copy<16>(d, row_in && c < width ? s : x, row_in && c < width ? 16 : 0);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) d[k] = row_in && c + k < width ? s[k * col_stride] : rows_zero<T>();
    }
  }
}

// Rows [r0, r0 + rows_n) of a (n, width) row-major array x (r0 < n) into dst, as view_rows().
template <class T>
__device__ __forceinline__ void tile(T* dst, int ld, const T* x, int64_t r0, int rows_n, int64_t n, int64_t width,
                                     int64_t wp, int t, int nthreads) {
  view_rows(dst, ld, x + r0 * width, width, int64_t(1), n - r0, rows_n, width, wp, t, nthreads);
}

// Every copy the block's threads started is in shared memory, and every other write before it is visible: each
// thread waits for its own copies, then the block meets at a barrier.
__device__ __forceinline__ void staged() {
  wait_all();
  __syncthreads();
}

// The unit of a shared-memory region that copies land in: 16-byte aligned.
struct alignas(16) Bytes16 {
  unsigned char b[16];
};

// Tiles 0 .. count-1 computed in turn, each copied into shared memory first, with two sets of tile buffers:
//   stage(t, set)    starts the copies of tile t into buffer set `set` (0 or 1);
//   compute(t, set)  reads them.
// One barrier per tile: it finds tile t's copies complete and every thread done with tile t - 1, whose set the
// copies of tile t + 1 then take while tile t is computed. It begins with a barrier (the sets may hold what the
// block read before) and ends without one.
template <class Stage, class Compute>
__device__ __forceinline__ void pipeline(int64_t count, Stage&& stage, Compute&& compute) {
  __syncthreads();
  if (count > 0) stage(int64_t(0), 0);
  for (int64_t t = 0; t < count; ++t) {
    staged();
    if (t + 1 < count) stage(t + 1, static_cast<int>((t + 1) & 1));
    compute(t, static_cast<int>(t & 1));
  }
}

// Elements [r0, r0 + count) of a float array (0 past n) into dst, one 4-byte copy each.
__device__ __forceinline__ void float_run(float* dst, const float* x, int64_t r0, int count, int64_t n, int t,
                                          int nthreads) {
  for (int e = t; e < count; e += nthreads) copy<4>(dst + e, r0 + e < n ? x + r0 + e : x, r0 + e < n ? 4 : 0);
}

}  // namespace asc::cuda::async_copy
