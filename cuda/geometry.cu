// CUDA kernels of the geometry ops (see cuda/geometry_launch.h).
//
// topk is a block-select, not a sort: one block per row; each thread scans its strided share of the row and keeps
// a sorted register list of its K best candidates (K = 16 for k <= 16, else 32); then the block merges the lists
// with min(k, K) rounds of a block-wide arg-best over the list heads (the winning thread pops its head). For k > 32
// the scan + merge repeats, each pass only considering entries worse than the last one output, so any k works
// (ceil(k / 32) passes over the row). The candidate order is a strict total order (NaN largest, ties by the lower
// index), the same one the CPU kernel uses, so the selected indices are exactly the CPU's.
//
// The row reductions (topk_count, normalize_rows, row_standardize) use one warp per row and accumulate in float64
// like the CPU kernels. bfloat16 / float16 data is read into float (topk compares in float: the conversion is exact,
// so the selection is the float one of the same values) and rounded once on output.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/geometry_launch.h"
#include "cuda/launch_kernel.cuh"
#include "cuda/row_kernels.cuh"

namespace asc::cuda {
namespace {

using rows::acc_t;  // float for bfloat16 / float16, the type itself otherwise
using rows::from_acc;
using rows::to_acc;

constexpr unsigned kFull = 0xffffffffu;
constexpr int kRowThreads = 128;  // 4 warps, one row each, for the row reductions

// ---- topk -------------------------------------------------------------------------------------------------------

constexpr int kTopkMaxWarps = 4;

// true when candidate a (value va, index ia) comes before b; ia < 0 marks an empty slot, after everything.
template <class T>
__device__ __forceinline__ bool better(T va, int ia, T vb, int ib, bool largest) {
  if (ib < 0) return ia >= 0;
  if (ia < 0) return false;
  const bool na = isnan(va), nb = isnan(vb);
  if (na || nb) return (na && nb) ? ia < ib : (largest ? na : nb);
  if (va != vb) return largest ? va > vb : va < vb;
  return ia < ib;
}

template <class S, int K>
__global__ void __launch_bounds__(kTopkMaxWarps * 32)
    topk_kernel(const S* __restrict__ x, const bool* __restrict__ mask, int64_t n, int k, bool largest, int64_t diag_n,
                S* __restrict__ values, int64_t* __restrict__ indices) {
  using T = acc_t<S>;  // candidates are compared in T
  __shared__ T s_val[2][kTopkMaxWarps];
  __shared__ int s_idx[2][kTopkMaxWarps];
  const int64_t r = blockIdx.x;
  const S* row = x + r * n;
  const bool* mrow = mask ? mask + r * n : nullptr;
  const int64_t diag = diag_n > 0 ? r % diag_n : -1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  S* vout = values + r * k;
  int64_t* iout = indices + r * k;

  T thr_v = T(0);  // the last entry output by the previous pass; thr_i < 0: no pass yet
  int thr_i = -1;
  int round = 0;
  for (int produced = 0; produced < k;) {
    // Scan: this thread's K best selectable entries worse than the threshold, sorted best first.
    T lv[K];
    int li[K];
#pragma unroll
    for (int s = 0; s < K; ++s) {
      lv[s] = T(0);
      li[s] = -1;
    }
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      if ((mrow && !mrow[j]) || j == diag) continue;
      const T v = to_acc(row[j]);
      const int jj = static_cast<int>(j);
      if (thr_i >= 0 && !better(thr_v, thr_i, v, jj, largest)) continue;
      if (!better(v, jj, lv[K - 1], li[K - 1], largest)) continue;
      lv[K - 1] = v;
      li[K - 1] = jj;
#pragma unroll
      for (int s = K - 1; s > 0; --s) {  // bubble the new entry up to its place
        if (!better(lv[s], li[s], lv[s - 1], li[s - 1], largest)) break;
        const T tv = lv[s];
        const int ti = li[s];
        lv[s] = lv[s - 1];
        li[s] = li[s - 1];
        lv[s - 1] = tv;
        li[s - 1] = ti;
      }
    }
    // Merge: `take` rounds of a block-wide arg-best over the list heads.
    const int take = min(K, k - produced);
    T bv = T(0);
    int bi = -1;
    for (int t = 0; t < take; ++t, ++round) {
      bv = lv[0];
      bi = li[0];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {  // butterfly: every lane ends with the warp's best
        const T ov = __shfl_xor_sync(kFull, bv, o);
        const int oi = __shfl_xor_sync(kFull, bi, o);
        if (better(ov, oi, bv, bi, largest)) {
          bv = ov;
          bi = oi;
        }
      }
      // Double-buffered per-warp slots: one barrier per round suffices, since a warp can only overwrite a buffer
      // after passing the next round's barrier, which every warp reaches only after reading it.
      const int buf = round & 1;
      if (lane == 0) {
        s_val[buf][warp] = bv;
        s_idx[buf][warp] = bi;
      }
      __syncthreads();
      bv = s_val[buf][0];
      bi = s_idx[buf][0];
      for (int w = 1; w < nwarps; ++w)
        if (better(s_val[buf][w], s_idx[buf][w], bv, bi, largest)) {
          bv = s_val[buf][w];
          bi = s_idx[buf][w];
        }
      if (threadIdx.x == 0) {
        vout[produced + t] = from_acc<S>(bv);
        iout[produced + t] = bi;
      }
      if (bi >= 0 && li[0] == bi) {  // the owner (indices are unique across threads) pops its head
#pragma unroll
        for (int s = 0; s < K - 1; ++s) {
          lv[s] = lv[s + 1];
          li[s] = li[s + 1];
        }
        lv[K - 1] = T(0);
        li[K - 1] = -1;
      }
    }
    produced += take;
    thr_v = bv;
    thr_i = bi;
    if (bi < 0) break;  // fewer selectable entries than k (the op checks this never happens)
  }
}

template <class S, int K>
void topk_as(const void* x, const bool* mask, int64_t R, int64_t n, int64_t k, bool largest, int64_t diag_n,
             void* values, int64_t* indices, cudaStream_t s) {
  // Enough threads that each scans a few dozen entries; at least one warp, at most kTopkMaxWarps.
  const int threads = n <= 1024 ? 32 : (n <= 4096 ? 64 : kTopkMaxWarps * 32);
  launch_kernel(topk_kernel<S, K>, grid_dim(R), threads, s, static_cast<const S*>(x), mask, n, static_cast<int>(k),
                largest, diag_n, static_cast<S*>(values), indices);
}

template <class T>
void topk_dispatch(const void* x, const bool* mask, int64_t R, int64_t n, int64_t k, bool largest, int64_t diag_n,
                   void* values, int64_t* indices, cudaStream_t s) {
  // K = 64 lists would need ~200 (float) / ~400 (double) registers per thread and spill heavily; above 32 the
  // kernel makes ceil(k / 32) passes over the row instead.
  if (k <= 16)
    topk_as<T, 16>(x, mask, R, n, k, largest, diag_n, values, indices, s);
  else
    topk_as<T, 32>(x, mask, R, n, k, largest, diag_n, values, indices, s);
}

// ---- warp-per-row reductions ------------------------------------------------------------------------------------

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}
__device__ __forceinline__ long long warp_sum(long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// Loops `r` over the rows this warp owns (grid-stride over warps). Every lane of a warp runs the same rows, so
// warp shuffles inside the body are safe.
#define ASC_FOR_WARP_ROWS(r, R)                                                                 \
  for (int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; r < (R); \
       r += static_cast<int64_t>(gridDim.x) * blockDim.x / 32)

__global__ void topk_count_kernel(const bool* __restrict__ mask, int64_t R, int64_t n, int64_t diag_n,
                                  int64_t* __restrict__ counts) {
  const int lane = threadIdx.x & 31;
  ASC_FOR_WARP_ROWS(r, R) {
    const bool* mrow = mask + r * n;
    const int64_t diag = diag_n > 0 ? r % diag_n : -1;
    long long c = 0;
    for (int64_t j = lane; j < n; j += 32) c += (mrow[j] && j != diag) ? 1 : 0;
    c = warp_sum(c);
    if (lane == 0) counts[r] = c;
  }
}

template <class T>
__global__ void topk_backward_kernel(const T* __restrict__ g, const int64_t* __restrict__ indices, int64_t k, int64_t n,
                                     T* __restrict__ gx, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / k;
    // The indices of a row are distinct (topk selects each entry once), so a plain add would do; atomicAdd keeps
    // the kernel correct for any index set.
    atomicAdd(gx + r * n + indices[i], g[i]);
  }
}

template <class T>
__global__ void normalize_rows_kernel(const T* __restrict__ x, int64_t R, int64_t d, double eps, T* __restrict__ y,
                                      T* __restrict__ norm) {
  const int lane = threadIdx.x & 31;
  ASC_FOR_WARP_ROWS(r, R) {
    using A = acc_t<T>;
    const T* xr = x + r * d;
    double ss = 0;
    for (int64_t j = lane; j < d; j += 32) {
      const double v = to_acc(xr[j]);
      ss += v * v;
    }
    ss = warp_sum(ss);
    const double nr = sqrt(ss);
    const A inv = static_cast<A>(1.0 / (nr < eps ? eps : nr));  // std::max(nr, eps), NaN-propagating alike
    if (lane == 0) norm[r] = from_acc<T>(nr);
    T* yr = y + r * d;
    for (int64_t j = lane; j < d; j += 32) yr[j] = from_acc<T>(to_acc(xr[j]) * inv);
  }
}

template <class T>
__global__ void row_standardize_kernel(const T* __restrict__ x, const bool* __restrict__ mask, int64_t R, int64_t n,
                                       double eps, T* __restrict__ y, T* __restrict__ sd) {
  const int lane = threadIdx.x & 31;
  ASC_FOR_WARP_ROWS(r, R) {
    const T* xr = x + r * n;
    const bool* mr = mask ? mask + r * n : nullptr;
    T* yr = y + r * n;
    long long cnt = 0;
    double s = 0;
    for (int64_t j = lane; j < n; j += 32)
      if (!mr || mr[j]) {
        s += static_cast<double>(to_acc(xr[j]));
        ++cnt;
      }
    s = warp_sum(s);
    cnt = warp_sum(cnt);
    if (cnt == 0) {
      for (int64_t j = lane; j < n; j += 32) yr[j] = from_acc<T>(0.0);
      if (lane == 0) sd[r] = from_acc<T>(0.0);
      continue;
    }
    const double mu = s / static_cast<double>(cnt);
    double ss = 0;
    for (int64_t j = lane; j < n; j += 32)
      if (!mr || mr[j]) {
        const double c = static_cast<double>(to_acc(xr[j])) - mu;
        ss += c * c;
      }
    ss = warp_sum(ss);
    const double sdv = sqrt(ss / static_cast<double>(cnt));
    const double inv = 1.0 / (sdv + eps);
    if (lane == 0) sd[r] = from_acc<T>(sdv);
    for (int64_t j = lane; j < n; j += 32)
      yr[j] = from_acc<T>((!mr || mr[j]) ? (static_cast<double>(to_acc(xr[j])) - mu) * inv : 0.0);
  }
}

template <class T>
__global__ void surrogate_kernel(math::SurrogateKind kind, double width, const T* __restrict__ u, int64_t N,
                                 T* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < N;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = from_acc<T>(math::surrogate_derivative(kind, static_cast<double>(to_acc(u[i])), width));
}

unsigned warp_rows_grid(int64_t R) { return grid_for(R * 32, kRowThreads); }

}  // namespace

cudaError_t launch_topk(const void* x, const bool* mask, int64_t R, int64_t n, int64_t k, bool largest, int64_t diag_n,
                        void* values, int64_t* indices, FloatElem elem, cudaStream_t stream) {
  if (R == 0 || k == 0) return cudaSuccess;
  if (n >= (int64_t{1} << 31) || k >= (int64_t{1} << 31) || R >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  return visit_float_elem(elem, [&](auto tag) {
    topk_dispatch<decltype(tag)>(x, mask, R, n, k, largest, diag_n, values, indices, stream);
    return cudaGetLastError();
  });
}

cudaError_t launch_topk_count(const bool* mask, int64_t R, int64_t n, int64_t diag_n, int64_t* counts,
                              cudaStream_t stream) {
  if (R == 0) return cudaSuccess;
  launch_kernel(topk_count_kernel, warp_rows_grid(R), kRowThreads, stream, mask, R, n, diag_n, counts);
  return cudaGetLastError();
}

cudaError_t launch_topk_backward(const void* g, const int64_t* indices, int64_t R, int64_t k, int64_t n, void* gx,
                                 FloatElem elem, cudaStream_t stream) {
  const int64_t total = R * k;
  if (total == 0) return cudaSuccess;
  return visit_float_elem(elem, [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(topk_backward_kernel<T>, grid_for(total, 256), 256, stream, static_cast<const T*>(g), indices, k, n,
                  static_cast<T*>(gx), total);
    return cudaGetLastError();
  });
}

cudaError_t launch_normalize_rows(const void* x, int64_t R, int64_t d, double eps, void* y, void* norm, FloatElem elem,
                                  cudaStream_t stream) {
  if (R == 0) return cudaSuccess;
  return visit_float_elem(elem, [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(normalize_rows_kernel<T>, warp_rows_grid(R), kRowThreads, stream, static_cast<const T*>(x), R, d, eps,
                  static_cast<T*>(y), static_cast<T*>(norm));
    return cudaGetLastError();
  });
}

cudaError_t launch_row_standardize(const void* x, const bool* mask, int64_t R, int64_t n, double eps, void* y, void* sd,
                                   FloatElem elem, cudaStream_t stream) {
  if (R == 0) return cudaSuccess;
  return visit_float_elem(elem, [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(row_standardize_kernel<T>, warp_rows_grid(R), kRowThreads, stream, static_cast<const T*>(x), mask, R,
                  n, eps, static_cast<T*>(y), static_cast<T*>(sd));
    return cudaGetLastError();
  });
}

cudaError_t launch_apply_surrogate(math::SurrogateKind kind, double width, const void* u, int64_t N, void* out,
                                   FloatElem elem, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  return visit_float_elem(elem, [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(surrogate_kernel<T>, grid_for(N, 256), 256, stream, kind, width, static_cast<const T*>(u), N,
                  static_cast<T*>(out));
    return cudaGetLastError();
  });
}

}  // namespace asc::cuda
