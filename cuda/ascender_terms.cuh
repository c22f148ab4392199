#pragma once
// The row computations of fused ASCender attention, term by term; cuda/ascender.cu holds the kernels, the drivers
// (row_forward, backward_row) that call these in order, and the launchers; cuda/ascender_row.cuh the row's data. One
// thread block works on query row i: S_ij = S_base_ij + Σ_terms ω' β̃_ij + bias_ij over the keys j,
// A = softmax(S / τ_score), y_i = A V.
//
// Each part has its forward beside its backward, with the backward's derivation in the comment above it: the scores
// and the row's key arrays (with the backward of the squared distances), the top-k neighbourhood (no backward), the
// standardisation of a raw bias row (which the three terms share), alignment, separation, cohesion, and the softmax
// with y = A V. Every function is called by all threads of the block — most synchronise it (__syncthreads, block
// reductions) — and leaves the same values in every thread. The formulas are docs/ascender.md's, the order of
// computation and the backward's derivation the CPU kernel's (ops/cpu/ascender.cpp).
// C++17 and CUDA headers only (included from cuda/ascender.cu, which the CUDA emulator also compiles as C++).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/ascender_launch.h"
#include "cuda/ascender_row.cuh"
#include "cuda/row_kernels.cuh"
#include "ops/ascender_scalars.h"
#include "ops/math.h"

namespace asc::cuda::ascender_rows {

using namespace ascender_launch;  // Params, BackwardParams, kMaxDim, kMaxK, kForwardArrays
using namespace ascender;         // Scalar rows of the (9, H) scalars, kConstantRow (ops/ascender_scalars.h)
using math::sigmoid;              // ops/math.h: the stable logistic every backend uses

// ==== the scores and the row's key arrays ==========================================================================

// This row's q_i, z_i, ê_i = e_i / max(|e_i|, 1e-8); then per key j: S_base_ij = q_i · k_rot_j / √d,
// a_ij = ê_i · ê_j, d²_ij = |z_i - z_j|², and keep_ij (within the window or a global token, and not masked).
template <class S, class T>
__device__ __forceinline__ void scores_forward(const QueryRow<S>& r, const RowKeys<T>& w, RowVecs<T>& v) {
  const Params& p = r.p;
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t i = r.i, n = r.p.T, d = r.p.d, dz = r.p.dz, da = r.p.da;
  const In<S> Q = r.view(p.q, d), KR = r.view(p.k_rot, d), Z = r.view(p.z, dz), E = r.view(p.e, da);
  for (int64_t c = tid; c < d; c += nt) v.qi[c] = Q[i * d + c];
  for (int64_t c = tid; c < dz; c += nt) v.zi[c] = Z[i * dz + c];
  T e2 = 0;
  for (int64_t c = tid; c < da; c += nt) e2 += E[i * da + c] * E[i * da + c];
  e2 = block_sum(e2, v.red);
  const T einv = T(1) / fmax(sqrt(e2), T(1e-8));
  for (int64_t c = tid; c < da; c += nt) v.ei[c] = E[i * da + c] * einv;
  __syncthreads();
  const T inv_sqrt_d = T(1) / sqrt(T(d));
  const bool* km =
      p.keep ? p.keep + r.batch() * p.keep_stride[0] + r.head() * p.keep_stride[1] + i * p.keep_stride[2] : nullptr;
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
}

// S_base = q k_rotᵀ / √d:  dq_i = Σ_j dS_j k_rot_j / √d;  dk_rot_j += dS_j q_i / √d.
// (a_ij's backward is separation's, the only term that reads it; d²'s is distances_backward.)
template <class S, class T>
__device__ __forceinline__ void scores_backward(const QueryRow<S>& r, const RowVecs<T>& v, const RowGrads<S>& gr) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t i = r.i, n = r.p.T, d = r.p.d;
  const In<S> KR = r.view(r.p.k_rot, d);
  const T inv_sqrt_d = T(1) / sqrt(T(d));
  for (int64_t c = tid; c < d; c += nt) {
    T s = 0;
    for (int64_t j = 0; j < n; ++j) s += gr.dS[j] * KR[j * d + c];
    gr.dq[i * d + c] = s * inv_sqrt_d;
  }
  for (int64_t j = tid; j < n; j += nt) {
    const T x = gr.dS[j] * inv_sqrt_d;
    if (x != T(0))
      for (int64_t c = 0; c < d; ++c) atomicAdd(gr.dkr + j * d + c, x * v.qi[c]);
  }
}

// d²_ij = |z_i - z_j|²:  dz_j += 2 dd²_j (z_j - z_i);  dz_i += 2 Σ_j dd²_j (z_i - z_j). Separation and cohesion have
// collected dd² (the barrier: each thread reads every entry).
template <class S, class T>
__device__ __forceinline__ void distances_backward(const QueryRow<S>& r, const RowVecs<T>& v, const RowGrads<S>& gr) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t i = r.i, n = r.p.T, dz = r.p.dz;
  const In<S> Z = r.view(r.p.z, dz);
  const T* dd2 = gr.dd2;
  __syncthreads();
  for (int64_t j = tid; j < n; j += nt)
    if (dd2[j] != T(0))
      for (int64_t c = 0; c < dz; ++c) atomicAdd(gr.dz + j * dz + c, T(2) * dd2[j] * (Z[j * dz + c] - v.zi[c]));
  for (int64_t c = tid; c < dz; c += nt) {
    T s = 0;
    for (int64_t j = 0; j < n; ++j) s += dd2[j] * (v.zi[c] - Z[j * dz + c]);
    atomicAdd(gr.dz + i * dz + c, T(2) * s);
  }
}

// ==== the top-k neighbourhood N(i) =================================================================================

// N(i): the K = k_nbr[h] kept keys (i itself only with include_self) of largest selection score — S_base, or the
// affinity a_ij — into v.topi / v.topv, best first, ties to the lower index (as the CPU). One thread streams the row,
// keeping the best K in a sorted list. v.top_m = |N(i)|, or -1 when a candidate's score is NaN: N(i) is then
// undefined and u_i NaN (the comparisons would skip it silently). No backward: the selection is piecewise constant.
// With p.saved_nbr (the backward after the tensor-core forward), the neighbourhoods that forward chose.
template <class S, class T>
__device__ __forceinline__ void neighbourhood_forward(const QueryRow<S>& r, const RowKeys<T>& w, RowVecs<T>& v) {
  const Params& p = r.p;
  if (p.saved_nbr) {  // the backward of the tensor-core forward: the neighbourhoods it chose
    if (threadIdx.x == 0) {
      const int64_t* q = p.saved_nbr + (r.batch_head() * p.T + r.i) * p.saved_nbr_k;
      int m = 0;
      while (m < p.saved_nbr_k && q[m] >= 0) v.topi[m] = q[m], ++m;
      v.top_m = q[0] == -2 ? -1 : m;
    }
    __syncthreads();
    return;
  }
  if (threadIdx.x == 0) {
    const T* by = p.select_by_scores ? w.s : w.aff;
    const int K = static_cast<int>(p.k_nbr[r.head()]);
    int m = 0;
    bool nan = false;
    T thr = -INFINITY;
    for (int64_t j = 0; j < r.p.T; ++j) {
      if (w.keep[j] == T(0) || (!p.include_self && j == r.i)) continue;
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
}

// ==== standardisation of a raw bias row ============================================================================

// The statistics of the raw row x_j = f src_j over its kept entries (two passes, so a constant row is recognised as
// on the CPU): constant when σ <= constant_row max|x| (Params::constant_row).
template <class T>
__device__ __forceinline__ RowStats<T> row_stats(const T* src, T f, const T* keep, int64_t n, double eps,
                                                 double constant_row, T* red) {
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
  st.constant = st.sd <= constant_row * double(big);
  st.scale = st.constant ? T(0) : static_cast<T>(1 / st.s);
  return st;
}

// Backward of the standardisation, in place on g: dx_j = (g_j - mean(g) - xc_j mean(g xc) / (σ s)) / s on kept j,
// 0 elsewhere and on constant rows (x_j = f src_j, xc = x - μ, means over kept entries).
template <class T>
__device__ __forceinline__ void standardize_backward(const T* src, T f, const T* keep, int64_t n, const RowStats<T>& st,
                                                     T* g, T* red) {
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

// One bias term of S, from dS back to d(raw), left in gr.g. The term is ω' f nr_j with nr_j = (fsrc src_j - μ) scale
// the standardised raw row (fsrc src = raw), f the gate after_norm (else 1: the gate is inside raw), ω' = ω
// omega_scale:  dω += Σ_j dS_j f nr_j omega_scale;  d(nr_j) = ω' f dS_j, then standardize_backward;
// returns df = ω' Σ_j dS_j nr_j after_norm (else 0).
template <class S, class T>
__device__ __forceinline__ T bias_backward(const QueryRow<S>& r, const RowKeys<T>& w, T* red, const RowGrads<S>& gr,
                                           const T* src, T fsrc, const RowStats<T>& rs, T omega, T factor, int scalar) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const T f = r.after() ? factor : T(1), omf = omega * f;
  T dsn = 0;  // Σ_j dS_j nr_j (dS = 0 on masked keys)
  for (int64_t j = tid; j < r.p.T; j += nt) {
    dsn += gr.dS[j] * (fsrc * src[j] - rs.mu) * rs.scale;
    gr.g[j] = omf * gr.dS[j];
  }
  dsn = block_sum(dsn, red);
  gr.add_scalar(scalar, dsn * f * r.om());
  standardize_backward(src, fsrc, w.keep, r.p.T, rs, gr.g, red);
  return r.after() ? omega * dsn : T(0);
}

// ==== alignment (docs §3) ==========================================================================================

// s = Σ_{l∈N(i)} k̂_l (k̂ = k / max(|k|, 1e-12)), γ_align = σ(-α_align (1 - |s / m|²)), u_i = s / |s|, and
// r_ij = u_i · k̂_j: raw align = fa r, fa = λ_a γ_align (1 after_norm).
template <class S, class T>
__device__ __forceinline__ void align_forward(const QueryRow<S>& r, const RowKeys<T>& w, RowVecs<T>& v,
                                              RowState<T>& st) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t n = r.p.T, d = r.p.d;
  const In<S> KK = r.view(r.p.k, d);
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
  s2 = block_sum(s2, v.red);
  st.snorm = sqrt(s2);
  st.cdiv = m > 0 ? T(m) : T(1);
  // 1 - |k̄_i|², and 0 over an empty neighbourhood (SPEC §1.16: γ = σ(0) = 1/2 there)
  const T var = m > 0 || nan_nbr ? T(1) - s2 / (st.cdiv * st.cdiv) : T(0);
  st.gamma_a = sigmoid(static_cast<T>(-r.p.alpha_align[r.head()]) * var);
  st.la = r.scal(kLambdaA) * st.gamma_a;
  st.fa = r.after() ? T(1) : st.la;
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

// Backward of alignment. bias_backward leaves g = d(raw) and returns dl = d(λ_a γ) when the gate scales the
// standardised term (after_norm); before it, raw = fa r with fa = λ_a γ gives dl = Σ_j g_j r_j. And dr = fa g.
//   fa = λ_a γ:  dλ_a += dl γ;  γ = σ(-α var):  dvar = dl λ_a γ (1 - γ) (-α)
//   r_ij = u_i · k̂_j:  dk̂_j += dr_j u_i;  du = Σ_j dr_j k̂_j
//   u = s / |s|:  ds = (du - u (u · du)) / |s|, nothing where the headings cancel (u = 0 there, a constant)
//   var = 1 - |s / m|²:  ds += -2 s / m² dvar
//   s = Σ_{l∈N(i)} k̂_l:  dk̂_l += ds
template <class S, class T>
__device__ __forceinline__ void align_backward(const QueryRow<S>& r, const RowKeys<T>& w, RowVecs<T>& v,
                                               const RowState<T>& st, const RowGrads<S>& gr) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t n = r.p.T, d = r.p.d;
  const In<S> KK = r.view(r.p.k, d);
  T* const g = gr.g;
  T* const du = gr.du;
  T dla = bias_backward(r, w, v.red, gr, w.r, st.fa, st.sa, r.scal(kOmegaA) * r.om(), st.la, kOmegaA);
  T gra = 0;
  for (int64_t j = tid; j < n; j += nt) {
    gra += g[j] * w.r[j];
    g[j] *= st.fa;  // dr
  }
  gra = block_sum(gra, v.red);
  if (!r.after()) dla += gra;
  gr.add_scalar(kLambdaA, dla * st.gamma_a);
  const T dvar = dla * r.scal(kLambdaA) * st.gamma_a * (T(1) - st.gamma_a) * static_cast<T>(-r.p.alpha_align[r.head()]);
  for (int64_t j = tid; j < n; j += nt)
    if (g[j] != T(0))
      for (int64_t c = 0; c < d; ++c) atomicAdd(gr.dkhat + j * d + c, g[j] * v.u[c]);
  for (int64_t c = tid; c < d; c += nt) {
    T s = 0;
    for (int64_t j = 0; j < n; ++j) s += g[j] * KK[j * d + c] / fmax(gr.knorm[j], T(1e-12));
    du[c] = s;
  }
  __syncthreads();
  T dot = 0;
  for (int64_t c = tid; c < d; c += nt) dot += v.u[c] * du[c];
  dot = block_sum(dot, v.red);
  const bool cancelled = st.snorm <= static_cast<T>(kConstantRow) * T(st.m);
  for (int64_t c = tid; c < d; c += nt) {
    T s = v.u[c] * st.snorm;  // Σ_{l∈N(i)} k̂_l; summed again where u = 0 keeps nothing of it
    if (cancelled) {
      s = 0;
      for (int t = 0; t < st.m; ++t) s += KK[v.topi[t] * d + c] * v.kinv[t];
    }
    const T dn = cancelled ? T(0) : (du[c] - v.u[c] * dot) / st.snorm;
    gr.dsv[c] = T(-2) * s / (st.cdiv * st.cdiv) * dvar + dn;
  }
  __syncthreads();
  for (int64_t x = tid; x < st.m * d; x += nt) atomicAdd(gr.dkhat + v.topi[x / d] * d + x % d, gr.dsv[x % d]);
}

// ==== separation (docs §4) =========================================================================================

// w_ij = exp(-d²_ij / τ_sep), ρ_i = Σ_{kept l≠i} w_il, η = min(1, ρ / κ), and raw sep_ij = -fs w_ij [a_ij - δ]_+ with
// fs = λ_s η (1 after_norm).
template <class S, class T>
__device__ __forceinline__ void sep_forward(const QueryRow<S>& r, const RowKeys<T>& w, T* red, RowState<T>& st) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t i = r.i, n = r.p.T;
  const T inv_tau = static_cast<T>(1 / r.p.tau_sep[r.head()]), delta = r.scal(kDelta);
  T rho = 0;
  for (int64_t j = tid; j < n; j += nt)
    if (w.keep[j] != T(0) && j != i) rho += rows::dexp(-w.d2[j] * inv_tau);
  st.rho = block_sum(rho, red);
  const T ratio = st.rho / r.scal(kKappa);
  st.eta = ratio >= T(1) ? T(1) : ratio;  // min(1, ρ/κ); fmin would turn a NaN into 1
  st.ls = r.scal(kLambdaS) * st.eta;
  const T f = r.after() ? T(1) : st.ls;
  for (int64_t j = tid; j < n; j += nt) {
    const T hinge = w.aff[j] - delta;
    w.rs[j] = -f * rows::dexp(-w.d2[j] * inv_tau) * (hinge <= T(0) ? T(0) : hinge);  // a NaN stays NaN
  }
}

// Backward of separation: raw = -fs φ, φ_j = w_j [a_j - δ]_+, w_j = exp(-d²_j / τ_sep), fs = λ_s η (1 after_norm),
// η = min(1, ρ / κ), ρ = Σ_{kept l≠i} w_l. bias_backward leaves g = d(raw) and returns dl = d(λ_s η) after_norm;
// before it dl = d(fs) = -Σ_j g_j φ_j. And dφ = -fs g.
//   fs = λ_s η:  dλ_s += dl η;  dη = dl λ_s
//   [a - δ]_+:  dδ += -Σ_j dφ_j w_j 1[a_j > δ];  da_j = dφ_j w_j 1[a_j > δ]
//   η = min(1, ρ / κ):  dρ = dη / κ, dκ += -dη ρ / κ² while ρ / κ < 1
//   dw_j = dφ_j [a_j - δ]_+ (+ dρ on kept j ≠ i);  w = exp(-d² / τ_sep):  dd²_j -= dw_j w_j / τ_sep
//   a_ij = ê_i · ê_j:  dê_j += da_j ê_i;  dê_i += Σ_j da_j ê_j, ê_j = e_j / max(|e_j|, 1e-8)
template <class S, class T>
__device__ __forceinline__ void sep_backward(const QueryRow<S>& r, const RowKeys<T>& w, RowVecs<T>& v,
                                             const RowState<T>& st, const RowGrads<S>& gr) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t i = r.i, n = r.p.T, da = r.p.da;
  const In<S> E = r.view(r.p.e, da);
  T* const g = gr.g;
  T dls = bias_backward(r, w, v.red, gr, w.rs, T(1), st.ss, r.scal(kOmegaS) * r.om(), st.ls, kOmegaS);
  const T fac = r.after() ? T(1) : st.ls, delta = r.scal(kDelta), kappa = r.scal(kKappa);
  const T inv_tau_s = static_cast<T>(1 / r.p.tau_sep[r.head()]);
  T gphi = 0, dhinge = 0;  // Σ g φ;  Σ dφ w 1[a > δ] with dφ = -fac g
  for (int64_t j = tid; j < n; j += nt) {
    const T hinge = w.aff[j] - delta, wj = rows::dexp(-w.d2[j] * inv_tau_s);
    gphi += g[j] * wj * (hinge <= T(0) ? T(0) : hinge);
    if (hinge > T(0)) dhinge += -fac * g[j] * wj;
  }
  gphi = block_sum(gphi, v.red);
  dhinge = block_sum(dhinge, v.red);
  if (!r.after()) dls -= gphi;
  gr.add_scalar(kDelta, -dhinge);
  gr.add_scalar(kLambdaS, dls * st.eta);
  const T deta = dls * r.scal(kLambdaS);
  T drho = 0;
  if (st.rho / kappa < T(1)) {
    drho = deta / kappa;
    gr.add_scalar(kKappa, -deta * st.rho / (kappa * kappa));
  }
  for (int64_t j = tid; j < n; j += nt) {
    const T hinge = w.aff[j] - delta, wj = rows::dexp(-w.d2[j] * inv_tau_s);
    const T dphi = -fac * g[j];
    const T dw = dphi * (hinge <= T(0) ? T(0) : hinge) + (w.keep[j] != T(0) && j != i ? drho : T(0));
    gr.dd2[j] -= dw * wj * inv_tau_s;
    const T da_j = hinge > T(0) ? dphi * wj : T(0);
    g[j] = da_j;
    if (da_j != T(0))
      for (int64_t c = 0; c < da; ++c) atomicAdd(gr.dehat + j * da + c, da_j * v.ei[c]);
  }
  __syncthreads();
  for (int64_t c = tid; c < da; c += nt) {
    T s = 0;
    for (int64_t j = 0; j < n; ++j) s += g[j] * E[j * da + c] / fmax(gr.enorm[j], T(1e-8));
    atomicAdd(gr.dehat + i * da + c, s);
  }
  __syncthreads();  // cohesion overwrites g
}

// ==== cohesion (docs §5) ===========================================================================================

// w'_j = exp(-d²_ij / τ_coh) on kept keys, W = Σ w' (at least 1e-30), c_i = Σ_j w'_j z_j / W, dc_j = |z_j - c_i|²,
// Var_i = Σ w' dc / W, γ_coh = σ(-α_coh Var_i), and raw coh = fc dc with fc = -λ_c γ_coh / τ_coh (-1 after_norm).
template <class S, class T>
__device__ __forceinline__ void coh_forward(const QueryRow<S>& r, const RowKeys<T>& w, RowVecs<T>& v, RowState<T>& st) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t n = r.p.T, dz = r.p.dz;
  const In<S> Z = r.view(r.p.z, dz);
  const T inv_tau = static_cast<T>(1 / r.p.tau_coh[r.head()]);
  T W = 0;
  for (int64_t j = tid; j < n; j += nt)
    if (w.keep[j] != T(0)) W += rows::dexp(-w.d2[j] * inv_tau);
  const T Wsum = block_sum(W, v.red);
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
  st.var_c = block_sum(var, v.red) / st.W;
  st.gamma_c = sigmoid(static_cast<T>(-r.p.alpha_coh[r.head()]) * st.var_c);
  st.lc = r.scal(kLambdaC) * st.gamma_c;
  st.fc = -(r.after() ? T(1) : st.lc * inv_tau);
}

// Backward of cohesion: raw = fc dc, fc = -λ_c γ / τ_coh (-1 after_norm), dc_j = |z_j - c_i|², c_i = Σ w' z / W,
// W = Σ_{kept} w', Var = Σ w' dc / W, γ = σ(-α Var), w'_j = exp(-d²_j / τ_coh). bias_backward leaves g = d(raw) and
// returns dl = d(λ_c γ) after_norm; before it dl = -Σ_j g_j dc_j / τ_coh.
//   dλ_c += dl γ;  dvar = dl λ_c γ (1 - γ) (-α)
//   Var = Σ w' dc / W:  ddc_j = fc g_j + dvar / W w'_j;  dW = -dvar Var / W;  dw'_j = dvar / W dc_j
//   dc_j = |z_j - c_i|²:  dz_j += 2 ddc_j (z_j - c_i);  dc_i = -2 Σ_j ddc_j (z_j - c_i)
//   c_i = Σ_l w'_l z_l / W:  dz_l += w'_l / W dc_i;  dw'_l += dc_i · z_l / W;  dW -= dc_i · c_i / W
//   W = Σ w':  dw'_l += dW;  w' = exp(-d² / τ_coh):  dd²_l -= dw'_l w'_l / τ_coh
template <class S, class T>
__device__ __forceinline__ void coh_backward(const QueryRow<S>& r, const RowKeys<T>& w, RowVecs<T>& v,
                                             const RowState<T>& st, const RowGrads<S>& gr) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t n = r.p.T, dz = r.p.dz;
  const In<S> Z = r.view(r.p.z, dz);
  T* const g = gr.g;
  T* const dC = gr.dcv;
  T dlc = bias_backward(r, w, v.red, gr, w.dc, st.fc, st.sc, r.scal(kOmegaC) * r.om(), st.lc, kOmegaC);
  const T inv_tau_c = static_cast<T>(1 / r.p.tau_coh[r.head()]);
  T gdc = 0;
  for (int64_t j = tid; j < n; j += nt) gdc += g[j] * w.dc[j];
  gdc = block_sum(gdc, v.red);
  if (!r.after()) dlc -= gdc * inv_tau_c;  // fc = -λγ / τ_coh
  gr.add_scalar(kLambdaC, dlc * st.gamma_c);
  const T dvar = dlc * r.scal(kLambdaC) * st.gamma_c * (T(1) - st.gamma_c) * static_cast<T>(-r.p.alpha_coh[r.head()]);
  T dW = -dvar * st.var_c / st.W;
  const T dvw = dvar / st.W;
  for (int64_t j = tid; j < n; j += nt) {  // ddc (left in g), and dz_j from dc_j
    const T wj = w.keep[j] != T(0) ? rows::dexp(-w.d2[j] * inv_tau_c) : T(0);
    const T ddc = st.fc * g[j] + dvw * wj;
    g[j] = ddc;
    if (ddc != T(0))
      for (int64_t c = 0; c < dz; ++c) atomicAdd(gr.dz + j * dz + c, T(2) * ddc * (Z[j * dz + c] - v.cv[c]));
  }
  __syncthreads();
  for (int64_t c = tid; c < dz; c += nt) {
    T s = 0;
    for (int64_t j = 0; j < n; ++j) s += g[j] * (Z[j * dz + c] - v.cv[c]);
    dC[c] = T(-2) * s;
  }
  __syncthreads();
  T dcc = 0;
  for (int64_t c = tid; c < dz; c += nt) dcc += dC[c] * v.cv[c];
  dW -= block_sum(dcc, v.red) / st.W;
  for (int64_t j = tid; j < n; j += nt) {  // dz_l and dd²_l through c_i, W and w'
    const T wj = w.keep[j] != T(0) ? rows::dexp(-w.d2[j] * inv_tau_c) : T(0);
    if (wj == T(0)) continue;
    T zc = 0;
    for (int64_t c = 0; c < dz; ++c) zc += dC[c] * Z[j * dz + c];
    gr.dd2[j] -= (dvw * w.dc[j] + zc / st.W + dW) * wj * inv_tau_c;
    for (int64_t c = 0; c < dz; ++c) atomicAdd(gr.dz + j * dz + c, wj / st.W * dC[c]);
  }
}

// ==== S, the softmax and y = A V ===================================================================================

// S_ij = S_base_ij + Σ_terms ω' f β̃_ij + bias_ij (β̃ the standardised raw rows, f the gate after_norm, else 1), then
// A = softmax(S / τ_score) over the kept keys, 0 elsewhere. st.mx = max_j S_j / τ over kept keys: NaN if one of them
// is, -inf (and A not set) if the row keeps no key.
template <class S, class T>
__device__ __forceinline__ void softmax_forward(const QueryRow<S>& r, const RowKeys<T>& w, T* A, T* red,
                                                RowState<T>& st) {
  const Params& p = r.p;
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t n = r.p.T;
  const bool after = r.after();
  const T ninf = -INFINITY, om = r.om();
  const T wa = p.use_align ? r.scal(kOmegaA) * om * (after ? st.la : T(1)) * st.sa.scale : T(0);
  const T ws = p.use_sep ? r.scal(kOmegaS) * om * (after ? st.ls : T(1)) * st.ss.scale : T(0);
  const T wc = p.use_coh ? r.scal(kOmegaC) * om * (after ? st.lc : T(1)) * st.sc.scale : T(0);
  const In<S> bias{p.bias ? static_cast<const S*>(p.bias) + r.batch() * p.bias_stride[0] + r.head() * p.bias_stride[1] +
                                r.i * p.bias_stride[2]
                          : nullptr};
  const T inv_tau = T(1) / r.scal(kTauScore);
  T mx = ninf, nans = 0;  // fmax passes NaN over: count the kept NaN scores, and make the row NaN if there is one
  for (int64_t j = tid; j < n; j += nt) {
    T Sj = w.s[j];
    if (p.use_align) Sj += wa * (st.fa * w.r[j] - st.sa.mu);
    if (p.use_sep) Sj += ws * (w.rs[j] - st.ss.mu);
    if (p.use_coh) Sj += wc * (st.fc * w.dc[j] - st.sc.mu);
    if (bias.p) Sj += bias[j * p.bias_stride[3]];
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

// A = softmax(S / τ):  with dA in gr.dS and D = Σ_j A_j dA_j (output_backward), gg_j = A_j (dA_j - D);
// dS_j = gg_j / τ (into gr.dS);  dτ += -Σ_j gg_j S_j / τ².
template <class S, class T>
__device__ __forceinline__ void softmax_backward(const QueryRow<S>& r, const RowKeys<T>& w, T* red, T D,
                                                 const RowGrads<S>& gr) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const T tau = r.scal(kTauScore), inv_tau = T(1) / tau;
  T gs = 0;
  for (int64_t j = tid; j < r.p.T; j += nt) {
    const T gg = gr.A[j] * (gr.dS[j] - D);
    gr.dS[j] = gg * inv_tau;
    gs += gg * w.s[j];
  }
  gs = block_sum(gs, red);  // its barrier also publishes dS
  gr.add_scalar(kTauScore, -gs / (tau * tau));
}

// y_i = Σ_j A_ij v_j, or 0 when the row keeps no key.
template <class S, class T>
__device__ __forceinline__ void output_forward(const QueryRow<S>& r, const T* A, const RowState<T>& st) {
  const int64_t n = r.p.T, d = r.p.d;
  const In<S> V = r.view(r.p.v, d);
  S* y = static_cast<S*>(r.p.y) + (r.batch_head() * n + r.i) * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    T s = 0;
    if (st.mx != T(-INFINITY))  // else no kept key: a zero row
      for (int64_t j = 0; j < n; ++j) s += A[j] * V[j * d + c];
    y[c] = rows::from_acc<S>(s);
  }
}

// y = A V:  dA_j = dy_i · v_j (into gr.dS, which the softmax's backward turns into dS);  dv_j += A_ij dy_i.
// Returns D = Σ_j A_j dA_j. Also zeroes dd² for the terms' backward.
template <class S, class T>
__device__ __forceinline__ T output_backward(const QueryRow<S>& r, T* red, const RowGrads<S>& gr) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t i = r.i, n = r.p.T, d = r.p.d;
  const In<S> V = r.view(r.p.v, d);
  const T* A = gr.A;
  T* const gyi = gr.gyi;
  for (int64_t c = tid; c < d; c += nt) gyi[c] = gr.GY[i * d + c];
  __syncthreads();
  T D = 0;
  for (int64_t j = tid; j < n; j += nt) {
    T s = 0;
    for (int64_t c = 0; c < d; ++c) s += gyi[c] * V[j * d + c];
    gr.dS[j] = s;  // dA for now
    gr.dd2[j] = T(0);
    D += A[j] * s;
    if (A[j] != T(0))
      for (int64_t c = 0; c < d; ++c) atomicAdd(gr.dv + j * d + c, A[j] * gyi[c]);
  }
  return block_sum(D, red);
}

}  // namespace asc::cuda::ascender_rows
