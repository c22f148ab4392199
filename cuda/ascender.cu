// CUDA kernels of fused ASCender attention, forward and backward (see cuda/ascender_launch.h; the formulas are
// docs/ascender.md's, the order of computation and the backward's derivation the CPU kernel's, ops/cpu/ascender.cpp).
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
#include "cuda/launch_kernel.cuh"
#include "cuda/row_kernels.cuh"
#include "ops/ascender_scalars.h"
#include "ops/math.h"

namespace asc::cuda {
namespace {

using namespace ascender_launch;

constexpr int kThreads = 128;
using namespace ascender;  // Scalar rows of the (9, H) scalars, kConstantRow (ops/ascender_scalars.h)
using math::sigmoid;       // ops/math.h: the stable logistic every backend uses

template <class T>
constexpr FloatElem kElem = std::is_same_v<T, double> ? FloatElem::F64 : FloatElem::F32;

template <class T>
__device__ __forceinline__ T block_sum(T v, T* red) {
  return rows::row_reduce(v, rows::SumOp{}, red);
}
template <class T>
__device__ __forceinline__ T block_max(T v, T* red) {
  return rows::row_reduce(v, rows::MaxOp{}, red);
}

// An input array of storage type S, read in the compute type (bfloat16 / float16 widen to float32).
template <class S>
struct In {
  const S* p;
  __device__ __forceinline__ auto operator[](int64_t i) const { return rows::to_acc(p[i]); }
};
// Host and device: the launchers build In views for their kernels' arguments too (a __device__-only function called
// from host code compiles, under nvcc, to a stub that exits the program; tools/check_cuda_host_pass.py finds them).
template <class S>
__host__ __device__ __forceinline__ In<S> in(const void* base, int64_t offset) {
  return {static_cast<const S*>(base) + offset};
}

// A query row's (key) arrays, n entries each: in shared memory for rows up to max_keys, else in this block's slice of
// a global workspace (RowArrays::count arrays of n per block).
template <class T>
struct RowKeys {
  T* s;     // S_base, then S
  T* aff;   // a_ij = ê_i · ê_j
  T* d2;    // |z_i - z_j|²
  T* keep;  // 1 where row i attends to key j
  T* r;     // r_ij = u_i · k̂_j          (raw align = fa r)
  T* rs;    // -f_s w_ij [a_ij - δ]_+      (raw sep)
  T* dc;    // |z_j - c_i|²               (raw coh = fc dc)
  static constexpr int count = kForwardArrays;
  __device__ static RowKeys at(T* base, int64_t n) {
    return {base, base + n, base + 2 * n, base + 3 * n, base + 4 * n, base + 5 * n, base + 6 * n};
  }
};

// The row's small vectors, always in shared memory. No initialisers: a __shared__ variable cannot have a constructor.
template <class T>
struct RowVecs {
  T qi[kMaxDim], ei[kMaxDim], zi[kMaxDim], u[kMaxDim], cv[kMaxDim], kinv[kMaxK], topv[kMaxK];
  int64_t topi[kMaxK];
  int top_m;
  T red[32];
};

// Where this block's key arrays live: `arrays` arrays of n in static shared memory of `shared` elements, or — kGlobal
// — in the block's slice of p.scratch. Rows are then visited grid-strided (i = blockIdx.x, += gridDim.x).
template <class T, bool kGlobal>
__device__ T* key_storage(const Params& p, T* shared, int arrays) {
  if constexpr (kGlobal)
    return static_cast<T*>(p.scratch) + (int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * arrays * p.T;
  else
    return shared;
}

// The statistics of one raw bias row over its kept entries: β̃_j = scale (x_j - mu), scale = 1 / (σ + eps), or 0 on
// a constant row (σ <= 1e-5 max|x|) and on a row with no kept entry.
template <class T>
struct RowStats {
  T mu, scale;
  double sd, s, count;
  bool constant;
};

// What row_forward leaves besides the shared arrays: the same values in every thread of the block.
template <class T>
struct RowState {
  int m;         // |N(i)|
  T la, ls, lc;  // λ times the gate, per term
  T gamma_a, gamma_c, eta, rho, W, var_c, snorm, cdiv;
  T fa, fc;  // raw align = fa r, raw coh = fc dc
  RowStats<T> sa, ss, sc;
  T mx;  // max_j S_j / τ over kept keys; -inf: the row keeps no key (A is not set)
};

template <class T>
__device__ RowStats<T> row_stats(const T* src, T f, const T* keep, int64_t n, double eps, T* red) {
  T sum = 0, count = 0, big = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    if (keep[j] != T(0)) {
      const T x = f * src[j];
      sum += x;
      count += T(1);
      const T ax = x < T(0) ? -x : x;
      big = ax > big ? ax : big;
    }
  sum = block_sum(sum, red);
  count = block_sum(count, red);
  big = block_max(big, red);
  RowStats<T> st{T(0), T(0), 0.0, 1.0, double(count), true};
  if (count == T(0)) return st;
  st.mu = static_cast<T>(double(sum) / double(count));
  T var = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    if (keep[j] != T(0)) var += (f * src[j] - st.mu) * (f * src[j] - st.mu);
  var = block_sum(var, red);
  st.sd = sqrt(double(var) / double(count));
  st.s = st.sd + eps;
  st.constant = st.sd <= kConstantRow * double(big);
  st.scale = st.constant ? T(0) : static_cast<T>(1 / st.s);
  return st;
}

// Backward of the standardisation, in place on g: dx_j = (g_j - mean(g) - xc_j mean(g xc) / (σ s)) / s on kept j,
// 0 elsewhere and on constant rows (x_j = f src_j, xc = x - μ, means over kept entries).
template <class T>
__device__ void standardize_backward(const T* src, T f, const T* keep, int64_t n, const RowStats<T>& st, T* g, T* red) {
  if (st.constant || st.count == 0) {
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) g[j] = T(0);
    __syncthreads();
    return;
  }
  T mg = 0, mgx = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    if (keep[j] != T(0)) {
      mg += g[j];
      mgx += g[j] * (f * src[j] - st.mu);
    }
  mg = block_sum(mg, red);
  mgx = block_sum(mgx, red);
  const T a = static_cast<T>(double(mg) / st.count);
  const T coef = static_cast<T>(st.sd > 0 ? double(mgx) / st.count / (st.sd * st.s) : 0.0);
  const T inv_s = static_cast<T>(1 / st.s);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    g[j] = keep[j] != T(0) ? (g[j] - a - (f * src[j] - st.mu) * coef) * inv_s : T(0);
  __syncthreads();
}

// The forward of query row i of head blockIdx.y into w, v and A (A may alias w.aff: it is written last).
template <class S, class T>
__device__ void row_forward(const Params& p, int64_t i, const RowKeys<T>& w, RowVecs<T>& v, T* A, RowState<T>& st) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t n = p.T, d = p.d, dz = p.dz, da = p.da, H = p.H;
  const int64_t bh = blockIdx.y, b = bh / H, h = bh % H;
  const In<S> Q = in<S>(p.q, bh * n * d), KR = in<S>(p.k_rot, bh * n * d), KK = in<S>(p.k, bh * n * d);
  const In<S> Z = in<S>(p.z, bh * n * dz), E = in<S>(p.e, bh * n * da), sc = in<S>(p.scalars, 0);
  auto scal = [&](int s) { return sc[s * H + h]; };
  const T ninf = -INFINITY;
  T* red = v.red;

  // ---- this row's q_i, z_i, ê_i; then per key: S_base, a_ij, |z_i - z_j|², keep -------------------------------
  for (int64_t c = tid; c < d; c += nt) v.qi[c] = Q[i * d + c];
  for (int64_t c = tid; c < dz; c += nt) v.zi[c] = Z[i * dz + c];
  T e2 = 0;
  for (int64_t c = tid; c < da; c += nt) e2 += E[i * da + c] * E[i * da + c];
  e2 = block_sum(e2, red);
  const T einv = T(1) / fmax(sqrt(e2), T(1e-8));
  for (int64_t c = tid; c < da; c += nt) v.ei[c] = E[i * da + c] * einv;
  __syncthreads();
  const T inv_sqrt_d = T(1) / sqrt(T(d));
  const bool* km = p.keep ? p.keep + b * p.keep_stride[0] + h * p.keep_stride[1] + i * p.keep_stride[2] : nullptr;
  const int64_t win = p.window, g = p.global_tokens;
  for (int64_t j = tid; j < n; j += nt) {
    T s = 0, en = 0, a = 0, dd = 0;
    for (int64_t c = 0; c < d; ++c) s += v.qi[c] * KR[j * d + c];
    for (int64_t c = 0; c < da; ++c) {
      const T x = E[j * da + c];
      en += x * x;
      a += v.ei[c] * x;
    }
    for (int64_t c = 0; c < dz; ++c) {
      const T t = v.zi[c] - Z[j * dz + c];
      dd += t * t;
    }
    w.s[j] = s * inv_sqrt_d;
    w.aff[j] = a / fmax(sqrt(en), T(1e-8));
    w.d2[j] = dd;
    bool kp = win <= 0 || (i > j ? i - j : j - i) < win || i < g || j < g;
    if (km) kp = kp && km[j * p.keep_stride[3]];
    w.keep[j] = kp ? T(1) : T(0);
  }
  __syncthreads();
  const bool after = p.after_norm != 0;
  st = RowState<T>{};
  st.fa = T(1), st.fc = T(-1);

  // ---- alignment (§3): N(i), u_i, γ_align, r_ij = u_i · k̂_j -----------------------------------------------------
  if (p.use_align) {
    if (tid == 0) {
      const T* by = p.select_by_scores ? w.s : w.aff;
      const int K = static_cast<int>(p.k_nbr[h]);
      int m = 0;
      bool nan = false;  // a NaN candidate: N(i) is undefined and u_i NaN (the comparisons would skip it silently)
      T thr = ninf;
      for (int64_t j = 0; j < n; ++j) {
        if (w.keep[j] == T(0) || (!p.include_self && j == i)) continue;
        const T x = by[j];
        nan = nan || x != x;
        if (!(x > thr)) continue;
        int q = m < K ? m++ : m - 1;
        for (; q > 0 && v.topv[q - 1] < x; --q) v.topv[q] = v.topv[q - 1], v.topi[q] = v.topi[q - 1];
        v.topv[q] = x, v.topi[q] = j;
        if (m == K) thr = v.topv[m - 1];
      }
      v.top_m = nan ? -1 : m;
    }
    __syncthreads();
    const bool nan_nbr = v.top_m < 0;
    const int m = nan_nbr ? 0 : v.top_m;
    st.m = m;
    for (int t = tid; t < m; t += nt) {
      T s = 0;
      for (int64_t c = 0; c < d; ++c) s += KK[v.topi[t] * d + c] * KK[v.topi[t] * d + c];
      v.kinv[t] = T(1) / fmax(sqrt(s), T(1e-12));
    }
    __syncthreads();
    for (int64_t c = tid; c < d; c += nt) {
      T s = 0;
      for (int t = 0; t < m; ++t) s += KK[v.topi[t] * d + c] * v.kinv[t];
      v.u[c] = nan_nbr ? T(NAN) : s;  // Σ_{l∈N(i)} k̂_l
    }
    __syncthreads();
    T s2 = 0;
    for (int64_t c = tid; c < d; c += nt) s2 += v.u[c] * v.u[c];
    s2 = block_sum(s2, red);
    st.snorm = sqrt(s2);
    st.cdiv = m > 0 ? T(m) : T(1);
    // 1 - |k̄_i|², and 0 over an empty neighbourhood (SPEC §1.16: γ = σ(0) = 1/2 there)
    const T var = m > 0 || nan_nbr ? T(1) - s2 / (st.cdiv * st.cdiv) : T(0);
    st.gamma_a = sigmoid(static_cast<T>(-p.alpha_align[h]) * var);
    st.la = scal(kLambdaA) * st.gamma_a;
    st.fa = after ? T(1) : st.la;
    // u = s / |s|, and 0 where the headings cancel (|s| <= kConstantRow m, m = 0 included): |s| is then the
    // rounding of the sum and its direction noise (docs §3). A NaN |s| fails the test and stays.
    const T uinv = st.snorm <= static_cast<T>(kConstantRow) * T(m) ? T(0) : T(1) / st.snorm;
    for (int64_t c = tid; c < d; c += nt) v.u[c] *= uinv;
    __syncthreads();
    for (int64_t j = tid; j < n; j += nt) {
      T kn = 0, dot = 0;
      for (int64_t c = 0; c < d; ++c) {
        const T x = KK[j * d + c];
        kn += x * x;
        dot += v.u[c] * x;
      }
      w.r[j] = dot / fmax(sqrt(kn), T(1e-12));
    }
  }
  // ---- separation (§4): w = exp(-d²/τ_sep), ρ_i = Σ_{kept l≠i} w_il, η = min(1, ρ/κ), raw = -f w [a - δ]_+ --------
  if (p.use_sep) {
    const T inv_tau = static_cast<T>(1 / p.tau_sep[h]), delta = scal(kDelta);
    T rho = 0;
    for (int64_t j = tid; j < n; j += nt)
      if (w.keep[j] != T(0) && j != i) rho += rows::dexp(-w.d2[j] * inv_tau);
    st.rho = block_sum(rho, red);
    const T ratio = st.rho / scal(kKappa);
    st.eta = ratio >= T(1) ? T(1) : ratio;  // min(1, ρ/κ); fmin would turn a NaN into 1
    st.ls = scal(kLambdaS) * st.eta;
    const T f = after ? T(1) : st.ls;
    for (int64_t j = tid; j < n; j += nt) {
      const T hinge = w.aff[j] - delta;
      w.rs[j] = -f * rows::dexp(-w.d2[j] * inv_tau) * (hinge <= T(0) ? T(0) : hinge);  // a NaN stays NaN
    }
  }
  // ---- cohesion (§5): w' on kept keys, c_i = Σ w' z / Σ w', Var_i, γ_coh, raw = -f |z_j - c_i|² ---------------------
  if (p.use_coh) {
    const T inv_tau = static_cast<T>(1 / p.tau_coh[h]);
    T W = 0;
    for (int64_t j = tid; j < n; j += nt)
      if (w.keep[j] != T(0)) W += rows::dexp(-w.d2[j] * inv_tau);
    const T Wsum = block_sum(W, red);
    st.W = Wsum < T(1e-30) ? T(1e-30) : Wsum;  // fmax would turn a NaN into 1e-30
    for (int64_t c = tid; c < dz; c += nt) {
      T s = 0;
      for (int64_t j = 0; j < n; ++j)
        if (w.keep[j] != T(0)) s += rows::dexp(-w.d2[j] * inv_tau) * Z[j * dz + c];
      v.cv[c] = s / st.W;
    }
    __syncthreads();
    T var = 0;
    for (int64_t j = tid; j < n; j += nt) {
      T dc = 0;
      for (int64_t c = 0; c < dz; ++c) {
        const T t = Z[j * dz + c] - v.cv[c];
        dc += t * t;
      }
      w.dc[j] = dc;
      if (w.keep[j] != T(0)) var += rows::dexp(-w.d2[j] * inv_tau) * dc;
    }
    st.var_c = block_sum(var, red) / st.W;
    st.gamma_c = sigmoid(static_cast<T>(-p.alpha_coh[h]) * st.var_c);
    st.lc = scal(kLambdaC) * st.gamma_c;
    st.fc = -(after ? T(1) : st.lc * inv_tau);
  }
  __syncthreads();
  // ---- row statistics of the three raw biases; S = S_base + Σ ω' β̃ + bias; A = softmax(S / τ_score) --------------
  if (p.use_align) st.sa = row_stats(w.r, st.fa, w.keep, n, p.norm_eps, red);
  if (p.use_sep) st.ss = row_stats(w.rs, T(1), w.keep, n, p.norm_eps, red);
  if (p.use_coh) st.sc = row_stats(w.dc, st.fc, w.keep, n, p.norm_eps, red);
  const T om = static_cast<T>(p.omega_scale);
  const T wa = p.use_align ? scal(kOmegaA) * om * (after ? st.la : T(1)) * st.sa.scale : T(0);
  const T ws = p.use_sep ? scal(kOmegaS) * om * (after ? st.ls : T(1)) * st.ss.scale : T(0);
  const T wc = p.use_coh ? scal(kOmegaC) * om * (after ? st.lc : T(1)) * st.sc.scale : T(0);
  const In<S> bp{p.bias ? static_cast<const S*>(p.bias) + b * p.bias_stride[0] + h * p.bias_stride[1] +
                              i * p.bias_stride[2]
                        : nullptr};
  const T inv_tau = T(1) / scal(kTauScore);
  T mx = ninf, nans = 0;  // fmax passes NaN over: count the kept NaN scores, and make the row NaN if there is one
  for (int64_t j = tid; j < n; j += nt) {
    T Sj = w.s[j];
    if (p.use_align) Sj += wa * (st.fa * w.r[j] - st.sa.mu);
    if (p.use_sep) Sj += ws * (w.rs[j] - st.ss.mu);
    if (p.use_coh) Sj += wc * (st.fc * w.dc[j] - st.sc.mu);
    if (bp.p) Sj += bp[j * p.bias_stride[3]];
    w.s[j] = Sj;
    if (w.keep[j] != T(0)) {
      mx = fmax(mx, Sj * inv_tau);
      nans += Sj * inv_tau == Sj * inv_tau ? T(0) : T(1);
    }
  }
  st.mx = block_max(mx, red);
  if (block_sum(nans, red) > T(0)) st.mx = T(NAN);
  if (st.mx == ninf) return;  // uniform over the block
  T z = 0;
  for (int64_t j = tid; j < n; j += nt) {
    const T e = w.keep[j] != T(0) ? rows::dexp(w.s[j] * inv_tau - st.mx) : T(0);
    A[j] = e;
    z += e;
  }
  const T inv_z = T(1) / block_sum(z, red);
  for (int64_t j = tid; j < n; j += nt) A[j] *= inv_z;
  __syncthreads();
}

template <class S, bool kGlobal>
__global__ void __launch_bounds__(kThreads) ascender_forward_kernel(Params p) {
  using T = rows::acc_t<S>;
  constexpr int64_t N = kGlobal ? 1 : max_keys(kElem<T>);
  __shared__ T keys_shared[RowKeys<T>::count * N];
  __shared__ RowVecs<T> v;
  const int64_t n = p.T, d = p.d, bh = blockIdx.y;
  const RowKeys<T> w = RowKeys<T>::at(key_storage<T, kGlobal>(p, keys_shared, RowKeys<T>::count), kGlobal ? n : N);
  const In<S> V = in<S>(p.v, bh * n * d);
  T* const A = w.aff;  // the affinities are not read after the scores
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    __syncthreads();  // the previous row's arrays are read no more
    RowState<T> st;
    row_forward<S>(p, i, w, v, A, st);
    S* y = static_cast<S*>(p.y) + (bh * n + i) * d;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
      T s = 0;
      if (st.mx != T(-INFINITY))  // else no kept key: a zero row
        for (int64_t j = 0; j < n; ++j) s += A[j] * V[j * d + c];
      y[c] = rows::from_acc<S>(s);
    }
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

// The backward of query row i of head blockIdx.y; the arrays as ascender_backward_kernel lays them out.
template <class S, class T>
__device__ void backward_row(const BackwardParams& bp, int64_t i, const RowKeys<T>& w, RowVecs<T>& v, T* A, T* dS,
                             T* dd2, T* gyi, T* du, T* dsv, T* dC) {
  const Params& p = bp.fwd;
  RowState<T> st;
  row_forward<S>(p, i, w, v, A, st);
  if (st.mx == T(-INFINITY)) return;  // no kept key: y_i = 0 whatever the inputs (uniform over the block)
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t n = p.T, d = p.d, dz = p.dz, da = p.da, H = p.H;
  const int64_t bh = blockIdx.y, h = bh % H;
  const In<S> KR = in<S>(p.k_rot, bh * n * d), KK = in<S>(p.k, bh * n * d), V = in<S>(p.v, bh * n * d);
  const In<S> Z = in<S>(p.z, bh * n * dz), E = in<S>(p.e, bh * n * da), GY = in<S>(bp.gy, bh * n * d);
  const T* knorm = static_cast<const T*>(bp.knorm) + bh * n;
  const T* enorm = static_cast<const T*>(bp.enorm) + bh * n;
  T* DQ = static_cast<T*>(bp.dq) + bh * n * d;
  T* DKR = static_cast<T*>(bp.dkr) + bh * n * d;
  T* DV = static_cast<T*>(bp.dv) + bh * n * d;
  T* DZ = static_cast<T*>(bp.dz) + bh * n * dz;
  T* DKH = static_cast<T*>(bp.dkhat) + bh * n * d;
  T* DEH = static_cast<T*>(bp.dehat) + bh * n * da;
  T* dsc = static_cast<T*>(bp.dscalars);
  const In<S> sc = in<S>(p.scalars, 0);
  auto scal = [&](int s) { return sc[s * H + h]; };
  auto add_scalar = [&](int s, T v) {  // v is the same in every thread
    if (tid == 0) atomicAdd(dsc + s * H + h, v);
  };
  T* red = v.red;
  T* const g = A;  // once dS is formed the probabilities are not read again: the per-term gradient row lives there
  const bool after = p.after_norm != 0;
  const T om = static_cast<T>(p.omega_scale);

  // ---- y = A V:  dA_j = dy_i · v_j;  dv_j += A_ij dy_i ---------------------------------------------------------
  for (int64_t c = tid; c < d; c += nt) gyi[c] = GY[i * d + c];
  __syncthreads();
  T D = 0;
  for (int64_t j = tid; j < n; j += nt) {
    T s = 0;
    for (int64_t c = 0; c < d; ++c) s += gyi[c] * V[j * d + c];
    dS[j] = s;  // dA for now
    dd2[j] = T(0);
    D += A[j] * s;
    if (A[j] != T(0))
      for (int64_t c = 0; c < d; ++c) atomicAdd(DV + j * d + c, A[j] * gyi[c]);
  }
  D = block_sum(D, red);
  // ---- A = softmax(S / τ):  gg = A (dA - D);  dS = gg / τ;  dτ += -Σ gg S / τ² ----------------------------------
  const T tau = scal(kTauScore), inv_tau = T(1) / tau;
  T gs = 0;
  for (int64_t j = tid; j < n; j += nt) {
    const T gg = A[j] * (dS[j] - D);
    dS[j] = gg * inv_tau;
    gs += gg * w.s[j];
  }
  gs = block_sum(gs, red);  // its barrier also publishes dS
  add_scalar(kTauScore, -gs / (tau * tau));
  // ---- S_base = q k_rotᵀ / √d:  dq_i = Σ_j dS_j k_rot_j / √d;  dk_rot_j += dS_j q_i / √d -------------------------
  const T inv_sqrt_d = T(1) / sqrt(T(d));
  for (int64_t c = tid; c < d; c += nt) {
    T s = 0;
    for (int64_t j = 0; j < n; ++j) s += dS[j] * KR[j * d + c];
    DQ[i * d + c] = s * inv_sqrt_d;
  }
  for (int64_t j = tid; j < n; j += nt) {
    const T x = dS[j] * inv_sqrt_d;
    if (x != T(0))
      for (int64_t c = 0; c < d; ++c) atomicAdd(DKR + j * d + c, x * v.qi[c]);
  }
  // One bias term, from dβ̃ = ω' dS back to d(raw) (left in g); returns d(factor) of after_norm. β̃_j = f nr_j with
  // f the gate after_norm (else 1):  dω += Σ dS β̃;  d(nr_j) = ω f dS_j;  df = Σ ω dS nr.
  auto term_backward = [&](const T* src, T fsrc, const RowStats<T>& rs, T omega, T factor, int scalar) -> T {
    const T f = after ? factor : T(1), omf = omega * f;
    T dsn = 0;  // Σ_j dS_j nr_j (dS = 0 on masked keys)
    for (int64_t j = tid; j < n; j += nt) {
      dsn += dS[j] * (fsrc * src[j] - rs.mu) * rs.scale;
      g[j] = omf * dS[j];
    }
    dsn = block_sum(dsn, red);
    add_scalar(scalar, dsn * f * om);
    standardize_backward(src, fsrc, w.keep, n, rs, g, red);
    return after ? omega * dsn : T(0);
  };
  // ---- alignment: raw = fa r, r_ij = u_i · k̂_j, u = s / |s|, s = Σ_{l∈N(i)} k̂_l, γ = σ(-α (1 - |s / m|²)) -------
  if (p.use_align) {
    T dla = term_backward(w.r, st.fa, st.sa, scal(kOmegaA) * om, st.la, kOmegaA);
    T gr = 0;
    for (int64_t j = tid; j < n; j += nt) {
      gr += g[j] * w.r[j];
      g[j] *= st.fa;  // dr
    }
    gr = block_sum(gr, red);
    if (!after) dla += gr;
    add_scalar(kLambdaA, dla * st.gamma_a);
    const T dvar = dla * scal(kLambdaA) * st.gamma_a * (T(1) - st.gamma_a) * static_cast<T>(-p.alpha_align[h]);
    // dk̂_j += dr_j u_i;  du = Σ_j dr_j k̂_j
    for (int64_t j = tid; j < n; j += nt)
      if (g[j] != T(0))
        for (int64_t c = 0; c < d; ++c) atomicAdd(DKH + j * d + c, g[j] * v.u[c]);
    for (int64_t c = tid; c < d; c += nt) {
      T s = 0;
      for (int64_t j = 0; j < n; ++j) s += g[j] * KK[j * d + c] / fmax(knorm[j], T(1e-12));
      du[c] = s;
    }
    __syncthreads();
    // u = s / |s|:  ds = (du - u (u·du)) / |s|, nothing where the headings cancel (u = 0 there, a constant);
    // |s / m|²:  ds += -2 s / m² dvar
    T dot = 0;
    for (int64_t c = tid; c < d; c += nt) dot += v.u[c] * du[c];
    dot = block_sum(dot, red);
    const bool cancelled = st.snorm <= static_cast<T>(kConstantRow) * T(st.m);
    for (int64_t c = tid; c < d; c += nt) {
      T s = v.u[c] * st.snorm;  // Σ_{l∈N(i)} k̂_l; summed again where u = 0 keeps nothing of it
      if (cancelled) {
        s = 0;
        for (int t = 0; t < st.m; ++t) s += KK[v.topi[t] * d + c] * v.kinv[t];
      }
      const T dn = cancelled ? T(0) : (du[c] - v.u[c] * dot) / st.snorm;
      dsv[c] = T(-2) * s / (st.cdiv * st.cdiv) * dvar + dn;
    }
    __syncthreads();
    // s = Σ_{l∈N(i)} k̂_l:  dk̂_l += ds
    for (int64_t x = tid; x < st.m * d; x += nt) atomicAdd(DKH + v.topi[x / d] * d + x % d, dsv[x % d]);
  }
  // ---- separation: raw = -fs φ, φ = w [a - δ]_+, w = exp(-d² / τ_sep), fs = λ η (1 after_norm), η = min(1, ρ / κ) --
  if (p.use_sep) {
    T dls = term_backward(w.rs, T(1), st.ss, scal(kOmegaS) * om, st.ls, kOmegaS);
    const T fac = after ? T(1) : st.ls, delta = scal(kDelta), kappa = scal(kKappa);
    const T inv_tau_s = static_cast<T>(1 / p.tau_sep[h]);
    T gphi = 0, dhinge = 0;  // Σ g φ;  Σ dφ w 1[a > δ] with dφ = -fac g
    for (int64_t j = tid; j < n; j += nt) {
      const T hinge = w.aff[j] - delta, wj = rows::dexp(-w.d2[j] * inv_tau_s);
      gphi += g[j] * wj * (hinge <= T(0) ? T(0) : hinge);
      if (hinge > T(0)) dhinge += -fac * g[j] * wj;
    }
    gphi = block_sum(gphi, red);
    dhinge = block_sum(dhinge, red);
    if (!after) dls -= gphi;
    add_scalar(kDelta, -dhinge);
    add_scalar(kLambdaS, dls * st.eta);
    const T deta = dls * scal(kLambdaS);
    T drho = 0;  // η = min(1, ρ / κ):  dρ = dη / κ, dκ = -dη ρ / κ² while ρ / κ < 1
    if (st.rho / kappa < T(1)) {
      drho = deta / kappa;
      add_scalar(kKappa, -deta * st.rho / (kappa * kappa));
    }
    // dw = dφ [a - δ]_+ (+ dρ on kept l ≠ i);  dd² -= dw w / τ_sep;  da = dφ w 1[a > δ] (left in g)
    for (int64_t j = tid; j < n; j += nt) {
      const T hinge = w.aff[j] - delta, wj = rows::dexp(-w.d2[j] * inv_tau_s);
      const T dphi = -fac * g[j];
      const T dw = dphi * (hinge <= T(0) ? T(0) : hinge) + (w.keep[j] != T(0) && j != i ? drho : T(0));
      dd2[j] -= dw * wj * inv_tau_s;
      const T da_j = hinge > T(0) ? dphi * wj : T(0);
      g[j] = da_j;
      if (da_j != T(0))
        for (int64_t c = 0; c < da; ++c) atomicAdd(DEH + j * da + c, da_j * v.ei[c]);  // a = ê_i · ê_j
    }
    __syncthreads();
    for (int64_t c = tid; c < da; c += nt) {
      T s = 0;
      for (int64_t j = 0; j < n; ++j) s += g[j] * E[j * da + c] / fmax(enorm[j], T(1e-8));
      atomicAdd(DEH + i * da + c, s);
    }
    __syncthreads();  // cohesion overwrites g
  }
  // ---- cohesion: raw = fc dc, dc_j = |z_j - c_i|², c_i = Σ w' z / W, W = Σ w', Var = Σ w' dc / W, γ = σ(-α Var) ----
  if (p.use_coh) {
    T dlc = term_backward(w.dc, st.fc, st.sc, scal(kOmegaC) * om, st.lc, kOmegaC);
    const T inv_tau_c = static_cast<T>(1 / p.tau_coh[h]);
    T gdc = 0;
    for (int64_t j = tid; j < n; j += nt) gdc += g[j] * w.dc[j];
    gdc = block_sum(gdc, red);
    if (!after) dlc -= gdc * inv_tau_c;  // fc = -λγ / τ_coh
    add_scalar(kLambdaC, dlc * st.gamma_c);
    const T dvar = dlc * scal(kLambdaC) * st.gamma_c * (T(1) - st.gamma_c) * static_cast<T>(-p.alpha_coh[h]);
    T dW = -dvar * st.var_c / st.W;
    const T dvw = dvar / st.W;
    // ddc = fc g + dvw w' (left in g);  dz_j += 2 ddc_j (z_j - c_i)
    for (int64_t j = tid; j < n; j += nt) {
      const T wj = w.keep[j] != T(0) ? rows::dexp(-w.d2[j] * inv_tau_c) : T(0);
      const T ddc = st.fc * g[j] + dvw * wj;
      g[j] = ddc;
      if (ddc != T(0))
        for (int64_t c = 0; c < dz; ++c) atomicAdd(DZ + j * dz + c, T(2) * ddc * (Z[j * dz + c] - v.cv[c]));
    }
    __syncthreads();
    for (int64_t c = tid; c < dz; c += nt) {  // dc_i = -2 Σ_j ddc_j (z_j - c_i)
      T s = 0;
      for (int64_t j = 0; j < n; ++j) s += g[j] * (Z[j * dz + c] - v.cv[c]);
      dC[c] = T(-2) * s;
    }
    __syncthreads();
    T dcc = 0;
    for (int64_t c = tid; c < dz; c += nt) dcc += dC[c] * v.cv[c];
    dW -= block_sum(dcc, red) / st.W;
    // c_i = Σ_l w'_l z_l / W:  dz_l += w'_l / W dc_i;  dw'_l = dvw dc_l + dc_i·z_l / W + dW;  dd² -= dw' w' / τ_coh
    for (int64_t j = tid; j < n; j += nt) {
      const T wj = w.keep[j] != T(0) ? rows::dexp(-w.d2[j] * inv_tau_c) : T(0);
      if (wj == T(0)) continue;
      T zc = 0;
      for (int64_t c = 0; c < dz; ++c) zc += dC[c] * Z[j * dz + c];
      dd2[j] -= (dvw * w.dc[j] + zc / st.W + dW) * wj * inv_tau_c;
      for (int64_t c = 0; c < dz; ++c) atomicAdd(DZ + j * dz + c, wj / st.W * dC[c]);
    }
  }
  // ---- d²_ij = |z_i - z_j|²:  dz_j += 2 dd²_j (z_j - z_i);  dz_i += 2 Σ_j dd²_j (z_i - z_j) ------------------------
  if (p.use_sep || p.use_coh) {
    __syncthreads();
    for (int64_t j = tid; j < n; j += nt)
      if (dd2[j] != T(0))
        for (int64_t c = 0; c < dz; ++c) atomicAdd(DZ + j * dz + c, T(2) * dd2[j] * (Z[j * dz + c] - v.zi[c]));
    for (int64_t c = tid; c < dz; c += nt) {
      T s = 0;
      for (int64_t j = 0; j < n; ++j) s += dd2[j] * (v.zi[c] - Z[j * dz + c]);
      atomicAdd(DZ + i * dz + c, T(2) * s);
    }
  }
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
  T* const A = base + RowKeys<T>::count * stride;
  T* const dS = A + stride;
  T* const dd2 = dS + stride;
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    __syncthreads();  // the previous row's arrays are read no more
    backward_row<S>(bp, i, w, v, A, dS, dd2, gyi, du, dsv, dC);
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

cudaError_t backward(FloatElem t, const BackwardParams& p, cudaStream_t stream) {
  if (p.fwd.B * p.fwd.H == 0 || p.fwd.T == 0) return cudaSuccess;
  return visit_float_elem(t, [&](auto tag) { return backward_for<decltype(tag)>(p, stream); });
}

}  // namespace ascender_launch
}  // namespace asc::cuda
