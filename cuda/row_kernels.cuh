#pragma once
// Device helpers shared by the row-wise CUDA kernels (cuda/nn.cu, cuda/reduce.cu): element <-> accumulator
// conversion (bfloat16 / float16 accumulate in float32), overloaded math, shuffles that carry 64-bit integers,
// and the row launch layout — a warp per row for n <= 256 (blockDim (32, 8)), else a block of 64..512 threads
// per row, rows grid-strided. C++17 and CUDA headers only (included from .cu files).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace asc::cuda::rows {

template <class T>
struct AccOf {
  using type = T;
};
template <>
struct AccOf<__nv_bfloat16> {
  using type = float;
};
template <>
struct AccOf<__half> {
  using type = float;
};
template <class T>
using acc_t = typename AccOf<T>::type;

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ int64_t to_acc(int64_t v) { return v; }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }

template <class T, class A>
__device__ __forceinline__ T from_acc(A v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, __half>)
    return __float2half(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

__device__ __forceinline__ float dexp(float x) { return expf(x); }
__device__ __forceinline__ double dexp(double x) { return exp(x); }
__device__ __forceinline__ float dlog(float x) { return logf(x); }
__device__ __forceinline__ double dlog(double x) { return log(x); }
__device__ __forceinline__ float dsqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double dsqrt(double x) { return sqrt(x); }

constexpr int kMaxThreads = 512;  // block mode; also the __launch_bounds__ of the row kernels
constexpr int kWarpRows = 8;      // warp mode: rows per block
constexpr int64_t kMaxBlocks = 65535;

struct RowLaunch {
  dim3 grid, block;
};

// Warp per row for n <= 256 (at most 8 elements per lane), else a block of 64..512 threads (about 8 elements each).
inline RowLaunch row_launch(int64_t rows, int64_t n) {
  RowLaunch l;
  if (n <= 256) {
    l.block = dim3(32, kWarpRows, 1);
    const int64_t blocks = (rows + kWarpRows - 1) / kWarpRows;
    l.grid = dim3(static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks), 1, 1);
  } else {
    int threads = 64;
    while (threads < kMaxThreads && static_cast<int64_t>(threads) * 8 < n) threads *= 2;
    l.block = dim3(threads, 1, 1);
    l.grid = dim3(static_cast<unsigned>(rows < kMaxBlocks ? rows : kMaxBlocks), 1, 1);
  }
  return l;
}

// First row of this thread and the grid stride (rows are uniform over a warp in warp mode, over the block else).
__device__ __forceinline__ int64_t first_row() { return static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; }
__device__ __forceinline__ int64_t row_step() { return static_cast<int64_t>(gridDim.x) * blockDim.y; }

// 64-bit values travel through shuffles as long long (int64_t may be `long`).
template <class A>
__device__ __forceinline__ A shfl_xor(A v, int o) {
  if constexpr (std::is_same_v<A, int64_t>)
    return static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, static_cast<long long>(v), o));
  else
    return __shfl_xor_sync(0xffffffffu, v, o);
}

struct SumOp {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return a + b;
  }
};
// NaN is never taken unless `a` already is one (the CPU row max ignores NaN the same way: its partials start at -inf).
struct MaxOp {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return b > a ? b : a;
  }
};

// Reduces v over the threads of this row: the warp (blockDim.x == 32) or the whole block (blockDim.y == 1).
// Every thread of the row gets the same result. `sh` is 32 shared slots; in block mode every thread of the block
// must call this (it synchronises twice, the second time so `sh` can be reused at once).
template <class A, class Op>
__device__ __forceinline__ A row_reduce(A v, Op op, A* sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, shfl_xor(v, o));
  if (blockDim.x == 32) return v;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) sh[w] = v;
  __syncthreads();
  A t = sh[0];
  for (int i = 1; i < nw; ++i) t = op(t, sh[i]);
  __syncthreads();
  return t;
}

}  // namespace asc::cuda::rows
