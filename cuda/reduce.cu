// CUDA reduction kernels: max / min with indices over the last or a middle dimension, and logsumexp over the last
// dimension. Same semantics as the CPU kernels (ops/cpu/reduce.cpp): NaN wins (the first NaN), ties go to the
// first index, logsumexp gives -inf for an all -inf or empty row, +inf for a row with +inf, NaN for a row with NaN.
//
// Row layout as in cuda/nn.cu: a warp per row for n <= 256 (blockDim (32, 8)), a block of 64..512 threads per row
// otherwise, rows grid-strided; warp shuffles then 32 shared slots. The (value, index) reduction of max / min is an
// order-independent total order (NaN first, then the extreme, then the lower index), so its result is exact and
// the same as the CPU's whatever the split. bfloat16 / float16 compare in float32 but the stored value is the
// input element itself (bit-exact). Compiled as C++17: nothing here includes core/ headers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/launch_kernel.cuh"
#include "cuda/reduce_launch.h"
#include "cuda/row_kernels.cuh"

namespace asc::cuda::reduce_launch {
namespace {

using namespace asc::cuda::rows;

template <class A>
__device__ __forceinline__ bool is_nan(A v) {
  if constexpr (std::is_floating_point_v<A>)
    return v != v;
  else
    return false;
}

// ---- max / min over the last dim -------------------------------------------------------------------------------

// Whether candidate (v, i) beats (w, k): a NaN beats any number, then the larger (max) / smaller (min) value, then
// the lower index. k < 0 marks "no candidate yet" (a thread that saw no element).
template <class A>
__device__ __forceinline__ bool beats(A v, int64_t i, A w, int64_t k, bool is_max) {
  if (i < 0) return false;
  if (k < 0) return true;
  const bool nv = is_nan(v), nw = is_nan(w);
  if (nv || nw) return nv && nw ? i < k : nv;
  if (v != w) return is_max ? v > w : v < w;
  return i < k;
}

template <class T>
__global__ void __launch_bounds__(kMaxThreads)
    max_min_last_kernel(const T* __restrict__ x, bool is_max, T* __restrict__ values, int64_t* __restrict__ indices,
                        int64_t rows, int64_t n) {
  using A = acc_t<T>;
  __shared__ A shv[32];
  __shared__ int64_t shi[32];
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    const T* a = x + r * n;
    A bv = A(0);
    int64_t bi = -1;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const A v = to_acc(a[j]);
      if (beats(v, j, bv, bi, is_max)) bv = v, bi = j;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const A ov = shfl_xor(bv, o);
      const int64_t oi = shfl_xor(bi, o);
      if (beats(ov, oi, bv, bi, is_max)) bv = ov, bi = oi;
    }
    if (blockDim.x > 32) {
      const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
      if (lane == 0) shv[w] = bv, shi[w] = bi;
      __syncthreads();
      bv = shv[0], bi = shi[0];
      for (int k = 1; k < nw; ++k)
        if (beats(shv[k], shi[k], bv, bi, is_max)) bv = shv[k], bi = shi[k];
      __syncthreads();
    }
    if (threadIdx.x == 0 && bi >= 0) {  // n >= 1, so bi >= 0 here
      values[r] = a[bi];                // the element itself (bit-exact, NaN payload included)
      if (indices) indices[r] = bi;
    }
  }
}

// ---- max / min over a middle dim ---------------------------------------------------------------------------------

// One thread per output (o, c), walking the n reduced rows with stride `inner` (warps read consecutive c:
// coalesced). Exactly the CPU's running update: take u when it beats the current value or is the first NaN.
template <class T>
__global__ void max_min_mid_kernel(const T* __restrict__ x, bool is_max, T* __restrict__ values,
                                   int64_t* __restrict__ indices, int64_t outer, int64_t n, int64_t inner) {
  using A = acc_t<T>;
  const int64_t total = outer * inner;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = idx / inner, c = idx - o * inner;
    const T* a = x + o * n * inner + c;
    T bt = a[0];
    A bv = to_acc(bt);
    int64_t bi = 0;
    for (int64_t j = 1; j < n; ++j) {
      const T ut = a[j * inner];
      const A u = to_acc(ut);
      const bool take = (is_max ? u > bv : u < bv) || (is_nan(u) && !is_nan(bv));
      if (take) bt = ut, bv = u, bi = j;
    }
    values[idx] = bt;
    if (indices) indices[idx] = bi;
  }
}

// ---- logsumexp over the last dim ---------------------------------------------------------------------------------

template <class T>
__global__ void __launch_bounds__(kMaxThreads)
    logsumexp_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t rows, int64_t n) {
  using A = acc_t<T>;
  __shared__ A sh[32];
  const A inf = static_cast<A>(INFINITY);
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    const T* a = x + r * n;
    A m = -inf, nan = 0;  // nan: 1 when the row holds a NaN (reduced with max)
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const A v = to_acc(a[j]);
      nan = is_nan(v) ? A(1) : nan;
      m = v > m ? v : m;
    }
    m = row_reduce(m, MaxOp{}, sh);
    nan = row_reduce(nan, MaxOp{}, sh);
    if (nan != A(0)) {
      if (threadIdx.x == 0) out[r] = from_acc<T>(static_cast<A>(NAN));
      continue;
    }
    if (m == inf || m == -inf) {  // -inf: every element is -inf (or the row is empty); +inf: the sum is +inf
      if (threadIdx.x == 0) out[r] = from_acc<T>(m);
      continue;
    }
    A s = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += dexp(to_acc(a[j]) - m);
    s = row_reduce(s, SumOp{}, sh);
    if (threadIdx.x == 0) out[r] = from_acc<T>(m + dlog(s));
  }
}

template <class F>
cudaError_t dispatch(Elem t, F&& f) {
  switch (t) {
    case Elem::F32: return f(float{});
    case Elem::F64: return f(double{});
    case Elem::BF16: return f(__nv_bfloat16{});
    case Elem::F16: return f(__half{});
    case Elem::I64: return f(int64_t{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t max_min_lastdim(Elem t, const void* x, bool is_max, void* values, int64_t* indices, int64_t rows, int64_t n,
                            cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (n <= 0) return cudaErrorInvalidValue;
  const RowLaunch l = row_launch(rows, n);
  return dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(max_min_last_kernel<T>, l.grid, l.block, stream, static_cast<const T*>(x), is_max,
                  static_cast<T*>(values), indices, rows, n);
    return cudaGetLastError();
  });
}

cudaError_t max_min_middim(Elem t, const void* x, bool is_max, void* values, int64_t* indices, int64_t outer, int64_t n,
                           int64_t inner, cudaStream_t stream) {
  if (outer <= 0 || inner <= 0) return cudaSuccess;
  if (n <= 0) return cudaErrorInvalidValue;
  const int64_t total = outer * inner;
  const int64_t blocks = (total + 255) / 256;
  const unsigned grid = static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
  return dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(max_min_mid_kernel<T>, grid, 256, stream, static_cast<const T*>(x), is_max, static_cast<T*>(values),
                  indices, outer, n, inner);
    return cudaGetLastError();
  });
}

cudaError_t logsumexp_lastdim(Elem t, const void* x, void* out, int64_t rows, int64_t n, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (t == Elem::I64) return cudaErrorInvalidValue;
  const RowLaunch l = row_launch(rows, n);
  return dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, int64_t>) {
      return cudaErrorInvalidValue;
    } else {
      launch_kernel(logsumexp_kernel<T>, l.grid, l.block, stream, static_cast<const T*>(x), static_cast<T*>(out), rows,
                    n);
      return cudaGetLastError();
    }
  });
}

}  // namespace asc::cuda::reduce_launch
