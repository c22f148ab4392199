// CUDA kernels of fused ASCender attention, forward and backward (see cuda/ascender_launch.h; the formulas are
// docs/ascender.md's, the order of computation and the backward's derivation the CPU kernel's, ops/cpu/ascender.cpp).
// The row's computations, term by term with each forward beside its backward, are in cuda/ascender_terms.cuh; the
// row's data (QueryRow, RowKeys, RowVecs, RowState, RowGrads) in cuda/ascender_row.cuh.
//
// One thread block per query row (grid: rows × batch·heads). row_forward computes the whole row into shared memory
// (long rows: the block's slice of a global workspace) — its base scores, affinities, squared latent distances,
// keep-mask, the three raw bias rows (each stored without its per-row factor), the scores S and the probabilities
// A — so nothing (B, H, T, T) is ever allocated. In turn: the keys' scores by strided loops over the keys, the top-k
// neighbourhood (one thread streams the row, keeping the best k in a sorted list: ties to the lower index, as the
// CPU), the mean heading u over the neighbours, ρ and the cohesion centroid by block reductions, the raw biases,
// their row statistics (two passes, so a constant row is recognised as on the CPU), S
// and a masked softmax. The forward kernel then forms y_i = A V.
//
// The backward kernel recomputes the row with the same row_forward (nothing but y is saved between the passes) and
// runs the chain rule back through it: softmax, base scores, each bias term through its standardisation, gates,
// kernels and centroid, down to the squared distances and the affinities. What row i owns — dq_i — it writes; what
// belongs to a key j (dK_rot, dV, dz, the unit-key and unit-embedding gradients) and the per-head scalars collect
// contributions from every row, by atomicAdd (so the order of those additions, and the last bits of a float32
// result, vary between runs). Two small kernels bracket it: the keys' and embeddings' norms before, and the
// backward of the unit-vector maps k̂ = k / |k|, ê = e / |e| after.
//
// Rows longer than shared memory holds keep their arrays in a global workspace (kGlobal, below): the same code, with
// memory traffic instead of shared-memory traffic. bfloat16 / float16 inputs are read into float32 (In<S>): every
// row array, reduction and gradient accumulator is of the compute type rows::acc_t<S>.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/ascender_launch.h"
#include "cuda/ascender_row.cuh"
#include "cuda/ascender_terms.cuh"
#include "cuda/launch_kernel.cuh"
#include "cuda/row_kernels.cuh"

namespace asc::cuda {
namespace {

using namespace ascender_launch;
using namespace ascender_rows;

constexpr int kThreads = 128;

template <class T>
constexpr FloatElem kElem = std::is_same_v<T, double> ? FloatElem::F64 : FloatElem::F32;

// Where this block's key arrays live: `arrays` arrays of n in static shared memory of `shared` elements, or — kGlobal
// — in the block's slice of p.scratch. Rows are then visited grid-strided (i = blockIdx.x, += gridDim.x).
template <class T, bool kGlobal>
__device__ T* key_storage(const Params& p, T* shared, int arrays) {
  if constexpr (kGlobal)
    return static_cast<T*>(p.scratch) + (int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * arrays * p.T;
  else
    return shared;
}

// The forward of query row r into w, v, A and st (A may alias w.aff: it is written last).
template <class S, class T>
__device__ void row_forward(const QueryRow<S>& r, const RowKeys<T>& w, RowVecs<T>& v, T* A, RowState<T>& st) {
  const Params& p = r.p;
  scores_forward(r, w, v);
  st = RowState<T>{};
  st.fa = T(1), st.fc = T(-1);
  if (p.use_align) {
    neighbourhood_forward(r, w, v);
    align_forward(r, w, v, st);
  }
  if (p.use_sep) sep_forward(r, w, v.red, st);
  if (p.use_coh) coh_forward(r, w, v, st);
  __syncthreads();  // row_stats reads every entry of the raw rows
  if (p.use_align) st.sa = row_stats(w.r, st.fa, w.keep, p.T, p.norm_eps, p.constant_row, v.red);
  if (p.use_sep) st.ss = row_stats(w.rs, T(1), w.keep, p.T, p.norm_eps, p.constant_row, v.red);
  if (p.use_coh) st.sc = row_stats(w.dc, st.fc, w.keep, p.T, p.norm_eps, p.constant_row, v.red);
  softmax_forward(r, w, A, v.red, st);
}

template <class S, bool kGlobal>
__global__ void __launch_bounds__(kThreads) ascender_forward_kernel(Params p) {
  using T = rows::acc_t<S>;
  constexpr int64_t N = kGlobal ? 1 : max_keys(kElem<T>);
  __shared__ T keys_shared[RowKeys<T>::count * N];
  __shared__ RowVecs<T> v;
  const int64_t n = p.T;
  const RowKeys<T> w = RowKeys<T>::at(key_storage<T, kGlobal>(p, keys_shared, RowKeys<T>::count), kGlobal ? n : N);
  T* const A = w.aff;  // the affinities are not read after the scores
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    __syncthreads();  // the previous row's arrays are read no more
    const QueryRow<S> r{p, i};
    RowState<T> st;
    row_forward(r, w, v, A, st);
    output_forward(r, A, st);
  }
}

// |x_r| of each row of a (rows, cols) matrix; one warp per row.
template <class S, class T>
__global__ void row_norms_kernel(In<S> x, int64_t rows, int64_t cols, T* norm) {
  const int64_t r = blockIdx.x;
  if (r >= rows) return;
  T s = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += x[r * cols + c] * x[r * cols + c];
  s = rows::row_reduce(s, rows::SumOp{}, static_cast<T*>(nullptr));  // a warp: no shared memory
  if (threadIdx.x == 0) norm[r] = sqrt(s);
}

// Backward of y = x / max(|x|, eps) per row: dx = (dy - y (y·dy)) / |x|, or dy / eps below eps. One warp per row.
template <class S, class T>
__global__ void unit_rows_backward_kernel(In<S> x, const T* norm, const T* dy, int64_t rows, int64_t cols, double eps,
                                          T* dx) {
  const int64_t r = blockIdx.x;
  if (r >= rows) return;
  const T nr = norm[r];
  if (nr < T(eps)) {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dx[r * cols + c] = dy[r * cols + c] / T(eps);
    return;
  }
  T dot = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dot += x[r * cols + c] / nr * dy[r * cols + c];
  dot = rows::row_reduce(dot, rows::SumOp{}, static_cast<T*>(nullptr));
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    dx[r * cols + c] = (dy[r * cols + c] - x[r * cols + c] / nr * dot) / nr;
}

// The backward of query row r: row_forward again, then the chain rule from dy_i back to the inputs. A, dS, dd2 (n)
// are the backward's key arrays, gyi, du, dsv (d) and dC (d_z) its vectors (RowGrads).
template <class S, class T>
__device__ void backward_row(const BackwardParams& bp, const QueryRow<S>& r, const RowKeys<T>& w, RowVecs<T>& v, T* A,
                             T* dS, T* dd2, T* gyi, T* du, T* dsv, T* dC) {
  const Params& p = r.p;
  RowState<T> st;
  row_forward(r, w, v, A, st);
  if (st.mx == T(-INFINITY)) return;  // no kept key: y_i = 0 whatever the inputs (uniform over the block)
  const RowGrads<S> gr(bp, A, dS, dd2, gyi, du, dsv, dC);  // formed here, so its pointers are not live in the forward
  const T D = output_backward(r, v.red, gr);
  softmax_backward(r, w, v.red, D, gr);
  scores_backward(r, v, gr);
  if (p.use_align) align_backward(r, w, v, st, gr);
  if (p.use_sep) sep_backward(r, w, v, st, gr);
  if (p.use_coh) coh_backward(r, w, v, st, gr);
  if (p.use_sep || p.use_coh) distances_backward(r, v, gr);
}

template <class S, bool kGlobal>
__global__ void __launch_bounds__(kThreads) ascender_backward_kernel(BackwardParams bp) {
  using T = rows::acc_t<S>;
  constexpr int64_t N = kGlobal ? 1 : max_keys_backward(kElem<T>);
  const Params& p = bp.fwd;
  __shared__ T keys_shared[kBackwardArrays * N];
  __shared__ RowVecs<T> v;
  __shared__ T gyi[kMaxDim], du[kMaxDim], dsv[kMaxDim], dC[kMaxDim];
  const int64_t n = p.T, stride = kGlobal ? n : N;
  T* const base = key_storage<T, kGlobal>(p, keys_shared, kBackwardArrays);
  const RowKeys<T> w = RowKeys<T>::at(base, stride);
  // The backward's own arrays follow the forward's.
  static_assert(RowKeys<T>::count + 3 == kBackwardArrays, "the backward's arrays: the forward's, A, dS and dd2");
  T* const A = base + RowKeys<T>::count * stride;
  T* const dS = A + stride;
  T* const dd2 = dS + stride;
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    __syncthreads();  // the previous row's arrays are read no more
    backward_row(bp, QueryRow<S>{p, i}, w, v, A, dS, dd2, gyi, du, dsv, dC);
  }
}

template <class S>
cudaError_t backward_for(const BackwardParams& bp, cudaStream_t stream) {
  using T = rows::acc_t<S>;
  const Params& p = bp.fwd;
  const int64_t rows = p.B * p.H * p.T;
  const dim3 warp(32, 1, 1), per_row(grid_dim(rows), 1, 1);
  auto check = [](cudaError_t e) { return e != cudaSuccess ? e : cudaGetLastError(); };
  T *knorm = static_cast<T*>(bp.knorm), *enorm = static_cast<T*>(bp.enorm);
  cudaError_t err;
  if ((err = check(launch_kernel(row_norms_kernel<S, T>, per_row, warp, stream, in<S>(p.k, 0), rows, p.d, knorm))) !=
      cudaSuccess)
    return err;
  if ((err = check(launch_kernel(row_norms_kernel<S, T>, per_row, warp, stream, in<S>(p.e, 0), rows, p.da, enorm))) !=
      cudaSuccess)
    return err;
  const dim3 grid(grid_dim(p.scratch ? p.rows_in_flight : p.T), grid_dim(p.B * p.H, kMaxGridYZ), 1);
  err = p.scratch ? launch_kernel(ascender_backward_kernel<S, true>, grid, dim3(kThreads), stream, bp)
                  : launch_kernel(ascender_backward_kernel<S, false>, grid, dim3(kThreads), stream, bp);
  if ((err = check(err)) != cudaSuccess) return err;
  if ((err = check(launch_kernel(unit_rows_backward_kernel<S, T>, per_row, warp, stream, in<S>(p.k, 0), knorm,
                                 static_cast<const T*>(bp.dkhat), rows, p.d, 1e-12, static_cast<T*>(bp.dk)))) !=
      cudaSuccess)
    return err;
  return check(launch_kernel(unit_rows_backward_kernel<S, T>, per_row, warp, stream, in<S>(p.e, 0), enorm,
                             static_cast<const T*>(bp.dehat), rows, p.da, 1e-8, static_cast<T*>(bp.de)));
}

}  // namespace

namespace ascender_launch {

cudaError_t forward(FloatElem t, const Params& p, cudaStream_t stream) {
  if (p.B * p.H == 0 || p.T == 0) return cudaSuccess;
  const dim3 grid(grid_dim(p.scratch ? p.rows_in_flight : p.T), grid_dim(p.B * p.H, kMaxGridYZ), 1);
  return visit_float_elem(t, [&](auto tag) {
    using S = decltype(tag);
    const cudaError_t err = p.scratch
                                ? launch_kernel(ascender_forward_kernel<S, true>, grid, dim3(kThreads), stream, p)
                                : launch_kernel(ascender_forward_kernel<S, false>, grid, dim3(kThreads), stream, p);
    return err != cudaSuccess ? err : cudaGetLastError();
  });
}

cudaError_t unit_rows_backward(FloatElem t, const void* x, const void* norm, const void* dy, int64_t rows, int64_t cols,
                               double eps, void* dx, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return visit_float_elem(t, [&](auto tag) {
    using S = decltype(tag);
    using T = rows::acc_t<S>;
    const cudaError_t err =
        launch_kernel(unit_rows_backward_kernel<S, T>, dim3(grid_dim(rows)), dim3(32), stream, in<S>(x, 0),
                      static_cast<const T*>(norm), static_cast<const T*>(dy), rows, cols, eps, static_cast<T*>(dx));
    return err != cudaSuccess ? err : cudaGetLastError();
  });
}

cudaError_t backward(FloatElem t, const BackwardParams& p, cudaStream_t stream) {
  if (p.fwd.B * p.fwd.H == 0 || p.fwd.T == 0) return cudaSuccess;
  return visit_float_elem(t, [&](auto tag) { return backward_for<decltype(tag)>(p, stream); });
}

}  // namespace ascender_launch
}  // namespace asc::cuda
