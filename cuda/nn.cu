// CUDA kernels of the nn functional ops: softmax / log_softmax, layer_norm / rms_norm, cross_entropy, forward and
// backward. Same formulas and edge cases as the CPU kernels (ops/cpu/nn.cpp): max-shifted exponentials, two-pass
// mean / variance, dead (fully masked) rows, ignore_index, label smoothing, the saved mean / rstd / stats layouts.
//
// Layout: one row per warp when rows are short (n <= 256: blockDim (32, 8), eight rows per block) and one row per
// block otherwise (blockDim (64..512, 1)); rows are grid-strided. Row reductions are warp shuffles (xor butterfly,
// so every lane holds the same bit-identical total) followed, in block mode, by a pass over 32 shared slots.
// Control flow that depends on a row's reduced values is therefore uniform over the threads of that row, which in
// block mode are all threads of the block (so __syncthreads() is never skipped by part of a block).
// Accumulation: float32 for float32 / bfloat16 / float16 data, float64 for float64.
// Compiled as C++17 (see cmake/cuda.cmake): nothing here includes core/ headers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/launch_kernel.cuh"
#include "cuda/nn_launch.h"
#include "cuda/row_kernels.cuh"

namespace asc::cuda::nn_launch {
namespace {

using namespace asc::cuda::rows;

template <class A>
__device__ __forceinline__ A neg_inf() {
  return static_cast<A>(-INFINITY);
}

// ---- softmax ---------------------------------------------------------------------------------------------------

// Elements per thread a row kernel keeps in registers: rows up to kCached × the row's threads (all rows of the warp
// mode, n <= 256, and up to 4096 with a block of 512) are read from memory once.
constexpr int kCached = 8;

template <class T>
__global__ void __launch_bounds__(kMaxThreads)
    softmax_fwd_kernel(const T* __restrict__ x, const uint8_t* __restrict__ mask, bool log, T* __restrict__ y,
                       int64_t rows, int64_t n) {
  using A = acc_t<T>;
  __shared__ A sh[32];
  const A ninf = neg_inf<A>();
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    const T* xr = x + r * n;
    const uint8_t* kr = mask ? mask + r * n : nullptr;
    T* yr = y + r * n;
    A m = ninf;
    if (n <= static_cast<int64_t>(blockDim.x) * kCached) {
      // The row in registers: x read once, where the loops below read it three times (max, sum, write). The same
      // values in the same order as those loops, so the same results.
      A v[kCached];
      unsigned kept = 0;
#pragma unroll
      for (int i = 0; i < kCached; ++i) {
        const int64_t j = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
        const bool k = j < n && (!kr || kr[j]);
        v[i] = k ? to_acc(xr[j]) : ninf;
        kept |= k ? 1u << i : 0u;
        m = v[i] > m ? v[i] : m;
      }
      m = row_reduce(m, MaxOp{}, sh);
      if (m != ninf) {  // else the NaN / dead-row handling below
        A s = 0;
#pragma unroll
        for (int i = 0; i < kCached; ++i)
          if ((kept >> i) & 1u) s += dexp(v[i] - m);
        s = row_reduce(s, SumOp{}, sh);
        const A inv = A(1) / s, ls = log ? dlog(s) : A(0);
#pragma unroll
        for (int i = 0; i < kCached; ++i) {
          const int64_t j = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
          if (j >= n) break;
          const bool k = (kept >> i) & 1u;
          yr[j] = from_acc<T>(log ? (k ? (v[i] - m) - ls : ninf) : (k ? dexp(v[i] - m) * inv : A(0)));
        }
        continue;
      }
    } else {
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const A v = (!kr || kr[j]) ? to_acc(xr[j]) : ninf;
        m = v > m ? v : m;
      }
      m = row_reduce(m, MaxOp{}, sh);
    }
    if (m == ninf) {
      // The max skips NaN: a row whose kept entries are all NaN (or NaN and -inf) lands here and gives NaN on
      // its kept entries, as in PyTorch; otherwise nothing is kept, or every kept entry is -inf: a dead row,
      // all zeros (log too).
      A nan = 0;
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
        if ((!kr || kr[j]) && to_acc(xr[j]) != to_acc(xr[j])) nan = A(1);
      nan = row_reduce(nan, MaxOp{}, sh);
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const bool kept = !kr || kr[j];
        yr[j] = from_acc<T>(nan != A(0) && kept ? static_cast<A>(NAN) : nan != A(0) && log ? ninf : A(0));
      }
      continue;
    }
    A s = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      if (!kr || kr[j]) s += dexp(to_acc(xr[j]) - m);
    s = row_reduce(s, SumOp{}, sh);
    if (!log) {
      const A inv = A(1) / s;
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
        yr[j] = from_acc<T>((!kr || kr[j]) ? dexp(to_acc(xr[j]) - m) * inv : A(0));
    } else {
      const A ls = dlog(s);  // y = (x - m) - log(s), as on the CPU
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
        yr[j] = from_acc<T>((!kr || kr[j]) ? (to_acc(xr[j]) - m) - ls : ninf);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kMaxThreads)
    softmax_bwd_kernel(const T* __restrict__ g, const T* __restrict__ y, const uint8_t* __restrict__ mask, bool log,
                       T* __restrict__ gx, int64_t rows, int64_t n) {
  using A = acc_t<T>;
  __shared__ A sh[32];
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    const T* gr = g + r * n;
    const T* yr = y + r * n;
    const uint8_t* kr = mask ? mask + r * n : nullptr;
    T* o = gx + r * n;
    if (!log && n <= static_cast<int64_t>(blockDim.x) * kCached) {
      // As below, with g and y read once into registers (the same sums in the same order).
      A gv[kCached], yv[kCached], dot = 0;
#pragma unroll
      for (int i = 0; i < kCached; ++i) {
        const int64_t j = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
        gv[i] = j < n ? to_acc(gr[j]) : A(0), yv[i] = j < n ? to_acc(yr[j]) : A(0);
        if (j < n) dot += gv[i] * yv[i];
      }
      dot = row_reduce(dot, SumOp{}, sh);
#pragma unroll
      for (int i = 0; i < kCached; ++i) {
        const int64_t j = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
        if (j >= n) break;
        o[j] = from_acc<T>(yv[i] * (gv[i] - dot));
      }
      continue;
    }
    if (!log) {
      // Masked entries and dead rows have y == 0, so they get 0 without looking at the mask.
      A dot = 0;
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) dot += to_acc(gr[j]) * to_acc(yr[j]);
      dot = row_reduce(dot, SumOp{}, sh);
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const A yv = to_acc(yr[j]);
        o[j] = from_acc<T>(yv * (to_acc(gr[j]) - dot));
      }
      continue;
    }
    // log_softmax: sum g over kept entries. A dead row (forward wrote 0 everywhere) has no kept entry, or >= 2 kept
    // entries that are all exactly 0 (see the CPU kernel). The kept count is summed in A: exact up to 2^24 and
    // monotone beyond, which is all the == 0 / >= 2 tests need.
    A S = 0, ysum = 0, kept = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      if (kr && !kr[j]) continue;
      S += to_acc(gr[j]);
      ysum += to_acc(yr[j]);
      kept += A(1);
    }
    S = row_reduce(S, SumOp{}, sh);
    ysum = row_reduce(ysum, SumOp{}, sh);
    kept = row_reduce(kept, SumOp{}, sh);
    if (kept == A(0) || (kept >= A(2) && ysum == A(0))) {
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) o[j] = from_acc<T>(A(0));
      continue;
    }
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const A v = to_acc(gr[j]) - dexp(to_acc(yr[j])) * S;
      o[j] = from_acc<T>((!kr || kr[j]) ? v : A(0));
    }
  }
}

// ---- layer_norm / rms_norm -------------------------------------------------------------------------------------

template <class T>
__global__ void __launch_bounds__(kMaxThreads)
    ln_fwd_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, acc_t<T> eps, bool rms,
                  T* __restrict__ y, acc_t<T>* __restrict__ mean, acc_t<T>* __restrict__ rstd, int64_t rows,
                  int64_t n) {
  using A = acc_t<T>;
  __shared__ A sh[32];
  const A inv_n = A(1) / static_cast<A>(n);
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    A mu = 0;
    if (!rms) {
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mu += to_acc(xr[j]);
      mu = row_reduce(mu, SumOp{}, sh) * inv_n;
    }
    A ss = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const A d = to_acc(xr[j]) - mu;
      ss += d * d;
    }
    ss = row_reduce(ss, SumOp{}, sh);
    const A rs = A(1) / dsqrt(ss * inv_n + eps);
    if (threadIdx.x == 0) {
      if (mean) mean[r] = mu;
      rstd[r] = rs;
    }
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      A v = (to_acc(xr[j]) - mu) * rs;
      if (w) v *= to_acc(w[j]);
      if (b) v += to_acc(b[j]);
      yr[j] = from_acc<T>(v);
    }
  }
}

// gx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)), gh = g * w (rms: without the mean(gh) term).
template <class T>
__global__ void __launch_bounds__(kMaxThreads)
    ln_bwd_gx_kernel(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ w,
                     const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ rstd, bool rms, T* __restrict__ gx,
                     int64_t rows, int64_t n) {
  using A = acc_t<T>;
  __shared__ A sh[32];
  const A inv_n = A(1) / static_cast<A>(n);
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    const T* gr = g + r * n;
    const T* xr = x + r * n;
    const A mu = mean ? mean[r] : A(0);
    const A rs = rstd[r];
    A sum_gh = 0, sum_ghx = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      A gh = to_acc(gr[j]);
      if (w) gh *= to_acc(w[j]);
      sum_gh += gh;
      sum_ghx += gh * (to_acc(xr[j]) - mu) * rs;
    }
    sum_gh = row_reduce(sum_gh, SumOp{}, sh);
    sum_ghx = row_reduce(sum_ghx, SumOp{}, sh);
    const A a = rms ? A(0) : sum_gh * inv_n, c = sum_ghx * inv_n;
    T* o = gx + r * n;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      A gh = to_acc(gr[j]);
      if (w) gh *= to_acc(w[j]);
      o[j] = from_acc<T>(rs * (gh - a - (to_acc(xr[j]) - mu) * rs * c));
    }
  }
}

// gw / gb partial column sums: block (32, 16) covers 32 columns of one chunk of rows (blockIdx.y); warps read 32
// consecutive columns of a row (coalesced). part_w / part_b: (chunks, n), either may be nullptr.
constexpr int kColTx = 32, kColTy = 16;

template <class T>
__global__ void __launch_bounds__(kColTx* kColTy)
    ln_bwd_cols_kernel(const T* __restrict__ g, const T* __restrict__ x, const acc_t<T>* __restrict__ mean,
                       const acc_t<T>* __restrict__ rstd, acc_t<T>* __restrict__ part_w, acc_t<T>* __restrict__ part_b,
                       int64_t rows, int64_t n, int64_t rows_per_chunk) {
  using A = acc_t<T>;
  __shared__ A shw[kColTy][kColTx + 1];
  __shared__ A shb[kColTy][kColTx + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTx + tx;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  A aw = 0, ab = 0;
  if (c < n) {
    for (int64_t r = r0 + ty; r < r1; r += kColTy) {
      const A gv = to_acc(g[r * n + c]);
      if (part_w) {
        const A mu = mean ? mean[r] : A(0);
        aw += gv * (to_acc(x[r * n + c]) - mu) * rstd[r];
      }
      ab += gv;
    }
  }
  shw[ty][tx] = aw;
  shb[ty][tx] = ab;
  __syncthreads();
  if (ty == 0 && c < n) {
    A sw = 0, sb = 0;
    for (int k = 0; k < kColTy; ++k) {
      sw += shw[k][tx];
      sb += shb[k][tx];
    }
    if (part_w) part_w[chunk * n + c] = sw;
    if (part_b) part_b[chunk * n + c] = sb;
  }
}

template <class T>
__global__ void ln_bwd_cols_finish_kernel(const acc_t<T>* __restrict__ part_w, const acc_t<T>* __restrict__ part_b,
                                          T* __restrict__ gw, T* __restrict__ gb, int64_t chunks, int64_t n) {
  using A = acc_t<T>;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < n;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (gw) {
      A s = 0;
      for (int64_t k = 0; k < chunks; ++k) s += part_w[k * n + c];
      gw[c] = from_acc<T>(s);
    }
    if (gb) {
      A s = 0;
      for (int64_t k = 0; k < chunks; ++k) s += part_b[k * n + c];
      gb[c] = from_acc<T>(s);
    }
  }
}

// ---- cross_entropy ---------------------------------------------------------------------------------------------

template <class T>
__global__ void __launch_bounds__(kMaxThreads)
    ce_fwd_kernel(const T* __restrict__ x, const int64_t* __restrict__ target, int64_t ignore_index, acc_t<T> s,
                  acc_t<T> s_over_c, bool smooth, T* __restrict__ loss, T* __restrict__ stats, int64_t rows,
                  int64_t C) {
  using A = acc_t<T>;
  __shared__ A sh[32];
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    const int64_t t = target[r];
    if (t == ignore_index) {
      if (threadIdx.x == 0) {
        loss[r] = from_acc<T>(A(0));
        stats[2 * r] = stats[2 * r + 1] = from_acc<T>(A(0));
      }
      continue;
    }
    const T* xr = x + r * C;
    A m = neg_inf<A>();
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      const A v = to_acc(xr[j]);
      m = v > m ? v : m;
    }
    m = row_reduce(m, MaxOp{}, sh);
    A sum = 0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) sum += dexp(to_acc(xr[j]) - m);
    sum = row_reduce(sum, SumOp{}, sh);
    const A ls = dlog(sum);
    // lse - sum_j q_j x_j with sum_j q_j = 1, on shifted logits (x - m).
    A out = ls - (A(1) - s) * (to_acc(xr[t]) - m);
    if (smooth) {
      A sx = 0;
      for (int64_t j = threadIdx.x; j < C; j += blockDim.x) sx += to_acc(xr[j]) - m;
      sx = row_reduce(sx, SumOp{}, sh);
      out -= s_over_c * sx;
    }
    if (threadIdx.x == 0) {
      loss[r] = from_acc<T>(out);
      stats[2 * r] = from_acc<T>(m);
      stats[2 * r + 1] = from_acc<T>(ls);
    }
  }
}

// gx = coef * (softmax(x) - (1 - s) onehot(t) - s / C), coef = scale * gloss[r]. With `recompute` (16-bit types)
// log(sum exp(x - m)) is recomputed in float instead of read from the 16-bit stats (m itself is stored exactly:
// it is one of the logits).
template <class T>
__global__ void __launch_bounds__(kMaxThreads)
    ce_bwd_kernel(const T* __restrict__ gloss, int64_t gstride, acc_t<T> scale, const T* __restrict__ x,
                  const int64_t* __restrict__ target, const T* __restrict__ stats, int64_t ignore_index, acc_t<T> s,
                  acc_t<T> s_over_c, bool recompute, T* __restrict__ gx, int64_t rows, int64_t C) {
  using A = acc_t<T>;
  __shared__ A sh[32];
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    T* o = gx + r * C;
    const int64_t t = target[r];
    if (t == ignore_index) {
      for (int64_t j = threadIdx.x; j < C; j += blockDim.x) o[j] = from_acc<T>(A(0));
      continue;
    }
    const T* xr = x + r * C;
    const A coef = scale * to_acc(gloss[r * gstride]);
    const A m = to_acc(stats[2 * r]);
    A ls = to_acc(stats[2 * r + 1]);
    if (recompute) {
      A sum = 0;
      for (int64_t j = threadIdx.x; j < C; j += blockDim.x) sum += dexp(to_acc(xr[j]) - m);
      ls = dlog(row_reduce(sum, SumOp{}, sh));
    }
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      A v = coef * (dexp((to_acc(xr[j]) - m) - ls) - s_over_c);
      if (j == t) v -= coef * (A(1) - s);
      o[j] = from_acc<T>(v);
    }
  }
}

// ---- host side -------------------------------------------------------------------------------------------------

constexpr size_t align256(size_t b) { return (b + 255) / 256 * 256; }
size_t acc_size(Elem t) { return t == Elem::F64 ? sizeof(double) : sizeof(float); }
bool is16(Elem t) { return t == Elem::BF16 || t == Elem::F16; }

// Work split of the layer-norm backward and the layout of its workspace.
struct LnBwdPlan {
  int64_t chunks = 0, rows_per_chunk = 0;
  size_t part_bytes = 0;  // (chunks, n) partials for gw, then for gb
  size_t total = 0;
};

LnBwdPlan ln_bwd_plan(Elem t, bool want_gw, bool want_gb, int64_t rows, int64_t n) {
  LnBwdPlan p;
  if (rows <= 0 || n <= 0) return p;
  if (want_gw || want_gb) {
    // Enough blocks to fill the device (~512), each walking at least 128 rows.
    const int64_t col_blocks = (n + kColTx - 1) / kColTx;
    int64_t chunks = (rows + 127) / 128;
    const int64_t cap = col_blocks >= 512 ? 1 : 512 / col_blocks;
    if (chunks > cap) chunks = cap;
    if (chunks < 1) chunks = 1;
    p.rows_per_chunk = (rows + chunks - 1) / chunks;
    p.chunks = (rows + p.rows_per_chunk - 1) / p.rows_per_chunk;
    const size_t one = static_cast<size_t>(p.chunks) * static_cast<size_t>(n) * acc_size(t);
    p.part_bytes = align256(one) * ((want_gw ? 1 : 0) + (want_gb ? 1 : 0));
  }
  p.total = p.part_bytes;
  return p;
}

}  // namespace

cudaError_t softmax_forward(Elem t, const void* x, const uint8_t* mask, bool log, void* y, int64_t rows, int64_t n,
                            cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return cudaSuccess;
  const RowLaunch l = row_launch(rows, n);
  return visit_float_elem(t, [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(softmax_fwd_kernel<T>, l.grid, l.block, stream, static_cast<const T*>(x), mask, log,
                  static_cast<T*>(y), rows, n);
    return cudaGetLastError();
  });
}

cudaError_t softmax_backward(Elem t, const void* g, const void* y, const uint8_t* mask, bool log, void* gx,
                             int64_t rows, int64_t n, cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return cudaSuccess;
  const RowLaunch l = row_launch(rows, n);
  return visit_float_elem(t, [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(softmax_bwd_kernel<T>, l.grid, l.block, stream, static_cast<const T*>(g), static_cast<const T*>(y),
                  mask, log, static_cast<T*>(gx), rows, n);
    return cudaGetLastError();
  });
}

cudaError_t layer_norm_forward(Elem t, const void* x, const void* weight, const void* bias, double eps, bool rms,
                               void* y, void* mean, void* rstd, int64_t rows, int64_t n, cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return cudaSuccess;
  const RowLaunch l = row_launch(rows, n);
  return visit_float_elem(t, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    launch_kernel(ln_fwd_kernel<T>, l.grid, l.block, stream, static_cast<const T*>(x), static_cast<const T*>(weight),
                  rms ? nullptr : static_cast<const T*>(bias), static_cast<A>(eps), rms, static_cast<T*>(y),
                  rms ? nullptr : static_cast<A*>(mean), static_cast<A*>(rstd), rows, n);
    return cudaGetLastError();
  });
}

size_t layer_norm_backward_workspace(Elem t, bool /*rms*/, bool want_gw, bool want_gb, int64_t rows, int64_t n) {
  return ln_bwd_plan(t, want_gw, want_gb, rows, n).total;
}

cudaError_t layer_norm_backward(Elem t, const void* g, const void* x, const void* weight, const void* mean,
                                const void* rstd, bool rms, void* gx, void* gw, void* gb, void* workspace, int64_t rows,
                                int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (rows <= 0) {  // sums over no rows
    const size_t es = t == Elem::F64 ? 8 : (t == Elem::F32 ? 4 : 2);
    if (gw) {
      const cudaError_t e = cudaMemsetAsync(gw, 0, es * static_cast<size_t>(n), stream);
      if (e != cudaSuccess) return e;
    }
    if (gb) {
      const cudaError_t e = cudaMemsetAsync(gb, 0, es * static_cast<size_t>(n), stream);
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }
  const LnBwdPlan plan = ln_bwd_plan(t, gw != nullptr, gb != nullptr, rows, n);
  if (plan.total > 0 && workspace == nullptr) return cudaErrorInvalidValue;
  char* ws = static_cast<char*>(workspace);
  const RowLaunch l = row_launch(rows, n);
  return visit_float_elem(t, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* gp = static_cast<const T*>(g);
    const T* xp = static_cast<const T*>(x);
    const A* mean_a = rms ? nullptr : static_cast<const A*>(mean);  // saved in the accumulation type
    const A* rstd_a = static_cast<const A*>(rstd);
    if (gx) {
      launch_kernel(ln_bwd_gx_kernel<T>, l.grid, l.block, stream, gp, xp, static_cast<const T*>(weight), mean_a, rstd_a,
                    rms, static_cast<T*>(gx), rows, n);
      const cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) return e;
    }
    if (gw || gb) {
      const size_t one = align256(static_cast<size_t>(plan.chunks) * static_cast<size_t>(n) * sizeof(A));
      A* part_w = gw ? reinterpret_cast<A*>(ws) : nullptr;
      A* part_b = gb ? reinterpret_cast<A*>(ws + (gw ? one : 0)) : nullptr;
      const dim3 grid(grid_dim((n + kColTx - 1) / kColTx), grid_dim(plan.chunks, kMaxGridYZ), 1);
      launch_kernel(ln_bwd_cols_kernel<T>, grid, dim3(kColTx, kColTy, 1), stream, gp, xp, mean_a, rstd_a, part_w,
                    part_b, rows, n, plan.rows_per_chunk);
      cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) return e;
      const int64_t fb = (n + 255) / 256;
      launch_kernel(ln_bwd_cols_finish_kernel<T>, static_cast<unsigned>(fb < kMaxBlocks ? fb : kMaxBlocks), 256, stream,
                    part_w, part_b, static_cast<T*>(gw), static_cast<T*>(gb), plan.chunks, n);
      e = cudaGetLastError();
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  });
}

cudaError_t cross_entropy_forward(Elem t, const void* logits, const int64_t* target, int64_t ignore_index,
                                  double smoothing, void* loss, void* stats, int64_t rows, int64_t C,
                                  cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const RowLaunch l = row_launch(rows, C);
  return visit_float_elem(t, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    launch_kernel(ce_fwd_kernel<T>, l.grid, l.block, stream, static_cast<const T*>(logits), target, ignore_index,
                  static_cast<A>(smoothing), static_cast<A>(smoothing / static_cast<double>(C)), smoothing != 0,
                  static_cast<T*>(loss), static_cast<T*>(stats), rows, C);
    return cudaGetLastError();
  });
}

cudaError_t cross_entropy_backward(Elem t, const void* gloss, int64_t gloss_stride, double scale, const void* logits,
                                   const int64_t* target, const void* stats, int64_t ignore_index, double smoothing,
                                   void* gx, int64_t rows, int64_t C, cudaStream_t stream) {
  if (rows <= 0 || C <= 0) return cudaSuccess;
  const RowLaunch l = row_launch(rows, C);
  return visit_float_elem(t, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    launch_kernel(ce_bwd_kernel<T>, l.grid, l.block, stream, static_cast<const T*>(gloss), gloss_stride,
                  static_cast<A>(scale), static_cast<const T*>(logits), target, static_cast<const T*>(stats),
                  ignore_index, static_cast<A>(smoothing), static_cast<A>(smoothing / static_cast<double>(C)), is16(t),
                  static_cast<T*>(gx), rows, C);
    return cudaGetLastError();
  });
}

}  // namespace asc::cuda::nn_launch
