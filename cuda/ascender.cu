// CUDA kernel of fused ASCender attention, forward (see cuda/ascender_launch.h; the formulas are docs/ascender.md's,
// the order of computation the CPU kernel's, ops/cpu/ascender.cpp).
//
// One thread block per query row (grid: rows × batch·heads). The row's base scores, affinities, squared latent
// distances, keep-mask and three raw biases live in shared memory — seven arrays of the row's length, which is what
// bounds it (ascender_launch::max_keys) — and nothing (B, H, T, T) is ever written to global memory. In turn, for the
// row: its keys' scores by strided loops over the keys, the top-k neighbourhood (one thread streams the row, keeping
// the best k in a sorted list: ties to the lower index, as the CPU), the mean heading u over the neighbours, ρ and
// the cohesion centroid by block reductions, the three raw biases, their row statistics (two passes, so a constant
// row is recognised as on the CPU), the scores S, a masked softmax, and y = A V.
//
// This is the first CUDA kernel of the op: forward only (the op runs the reference for inputs that need a
// gradient), float32 and float64, rows up to max_keys keys; a flash-style tiled version for long rows, the backward
// and bfloat16 / float16 are still to come.
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
constexpr int64_t kKeys = std::is_same_v<T, double> ? max_keys(FloatElem::F64) : max_keys(FloatElem::F32);

template <class T>
__device__ __forceinline__ T block_sum(T v, T* red) {
  return rows::row_reduce(v, rows::SumOp{}, red);
}
template <class T>
__device__ __forceinline__ T block_max(T v, T* red) {
  return rows::row_reduce(v, rows::MaxOp{}, red);
}

// The statistics of one raw bias row over its kept entries: μ and the factor 1 / (σ + eps), or 0 on a constant row
// (σ <= 1e-5 max|x|) and on a row with no kept entry. Every thread gets both.
template <class T>
__device__ void row_stats(const T* x, const T* keep, int64_t n, double eps, T* red, T& mu, T& scale) {
  T sum = 0, count = 0, big = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    if (keep[j] != T(0)) {
      sum += x[j];
      count += T(1);
      const T ax = x[j] < T(0) ? -x[j] : x[j];
      big = ax > big ? ax : big;
    }
  sum = block_sum(sum, red);
  count = block_sum(count, red);
  big = block_max(big, red);
  mu = T(0), scale = T(0);
  if (count == T(0)) return;
  mu = static_cast<T>(double(sum) / double(count));
  T var = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    if (keep[j] != T(0)) var += (x[j] - mu) * (x[j] - mu);
  var = block_sum(var, red);
  const double sd = sqrt(double(var) / double(count));
  scale = sd <= kConstantRow * double(big) ? T(0) : static_cast<T>(1 / (sd + eps));
}

template <class T>
__global__ void __launch_bounds__(kThreads) ascender_forward_kernel(Params p) {
  constexpr int64_t N = kKeys<T>;
  __shared__ T s0[N], aff[N], d2[N], keep[N], ra[N], rs[N], rc[N];  // (row, key) arrays
  __shared__ T qi[kMaxDim], ei[kMaxDim], zi[kMaxDim], u[kMaxDim], cv[kMaxDim], kinv[kMaxK], topv[kMaxK];
  __shared__ int64_t topi[kMaxK];
  __shared__ int top_m;
  __shared__ T red[32];
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t n = p.T, d = p.d, dz = p.dz, da = p.da, H = p.H;
  const int64_t i = blockIdx.x, bh = blockIdx.y, b = bh / H, h = bh % H;
  const T* Q = static_cast<const T*>(p.q) + bh * n * d;
  const T* KR = static_cast<const T*>(p.k_rot) + bh * n * d;
  const T* KK = static_cast<const T*>(p.k) + bh * n * d;
  const T* V = static_cast<const T*>(p.v) + bh * n * d;
  const T* Z = static_cast<const T*>(p.z) + bh * n * dz;
  const T* E = static_cast<const T*>(p.e) + bh * n * da;
  const T* sc = static_cast<const T*>(p.scalars);
  auto scal = [&](int s) { return sc[s * H + h]; };
  const T ninf = -INFINITY;

  // ---- this row's q_i, z_i, ê_i; then per key: S_base, a_ij, |z_i - z_j|², keep -------------------------------
  for (int64_t c = tid; c < d; c += nt) qi[c] = Q[i * d + c];
  for (int64_t c = tid; c < dz; c += nt) zi[c] = Z[i * dz + c];
  T e2 = 0;
  for (int64_t c = tid; c < da; c += nt) e2 += E[i * da + c] * E[i * da + c];
  e2 = block_sum(e2, red);
  const T einv = T(1) / fmax(sqrt(e2), T(1e-8));
  for (int64_t c = tid; c < da; c += nt) ei[c] = E[i * da + c] * einv;
  __syncthreads();
  const T inv_sqrt_d = T(1) / sqrt(T(d));
  const bool* km = p.keep ? p.keep + b * p.keep_stride[0] + h * p.keep_stride[1] + i * p.keep_stride[2] : nullptr;
  const int64_t w = p.window, g = p.global_tokens;
  for (int64_t j = tid; j < n; j += nt) {
    T s = 0, en = 0, a = 0, dd = 0;
    for (int64_t c = 0; c < d; ++c) s += qi[c] * KR[j * d + c];
    for (int64_t c = 0; c < da; ++c) {
      const T x = E[j * da + c];
      en += x * x;
      a += ei[c] * x;
    }
    for (int64_t c = 0; c < dz; ++c) {
      const T t = zi[c] - Z[j * dz + c];
      dd += t * t;
    }
    s0[j] = s * inv_sqrt_d;
    aff[j] = a / fmax(sqrt(en), T(1e-8));
    d2[j] = dd;
    bool kp = w <= 0 || (i > j ? i - j : j - i) < w || i < g || j < g;
    if (km) kp = kp && km[j * p.keep_stride[3]];
    keep[j] = kp ? T(1) : T(0);
  }
  __syncthreads();
  const bool after = p.after_norm != 0;
  T la = 0, ls = 0, lc = 0;  // λ times the gate, per term

  // ---- alignment (§3): N(i), u_i, γ_align, r_ij = u_i · k̂_j -----------------------------------------------------
  if (p.use_align) {
    if (tid == 0) {
      const T* by = p.select_by_scores ? s0 : aff;
      const int K = static_cast<int>(p.k_nbr[h]);
      int m = 0;
      T thr = ninf;
      for (int64_t j = 0; j < n; ++j) {
        if (keep[j] == T(0) || (!p.include_self && j == i)) continue;
        const T x = by[j];
        if (!(x > thr)) continue;
        int q = m < K ? m++ : m - 1;
        for (; q > 0 && topv[q - 1] < x; --q) topv[q] = topv[q - 1], topi[q] = topi[q - 1];
        topv[q] = x, topi[q] = j;
        if (m == K) thr = topv[m - 1];
      }
      top_m = m;
    }
    __syncthreads();
    const int m = top_m;
    for (int t = tid; t < m; t += nt) {
      T s = 0;
      for (int64_t c = 0; c < d; ++c) s += KK[topi[t] * d + c] * KK[topi[t] * d + c];
      kinv[t] = T(1) / fmax(sqrt(s), T(1e-12));
    }
    __syncthreads();
    for (int64_t c = tid; c < d; c += nt) {
      T s = 0;
      for (int t = 0; t < m; ++t) s += KK[topi[t] * d + c] * kinv[t];
      u[c] = s;  // Σ_{l∈N(i)} k̂_l
    }
    __syncthreads();
    T s2 = 0;
    for (int64_t c = tid; c < d; c += nt) s2 += u[c] * u[c];
    s2 = block_sum(s2, red);
    const T cdiv = m > 0 ? T(m) : T(1);
    const T var = T(1) - s2 / (cdiv * cdiv);  // 1 - |k̄_i|²
    la = scal(kLambdaA) * sigmoid(static_cast<T>(-p.alpha_align[h]) * var);
    const T uinv = T(1) / fmax(sqrt(s2), T(1e-12));
    for (int64_t c = tid; c < d; c += nt) u[c] *= uinv;
    __syncthreads();
    const T f = after ? T(1) : la;
    for (int64_t j = tid; j < n; j += nt) {
      T kn = 0, dot = 0;
      for (int64_t c = 0; c < d; ++c) {
        const T x = KK[j * d + c];
        kn += x * x;
        dot += u[c] * x;
      }
      ra[j] = f * dot / fmax(sqrt(kn), T(1e-12));
    }
  }
  // ---- separation (§4): w = exp(-d²/τ_sep), ρ_i = Σ_{kept l≠i} w_il, η = min(1, ρ/κ), raw = -f w [a - δ]_+ --------
  if (p.use_sep) {
    const T inv_tau = static_cast<T>(1 / p.tau_sep[h]), delta = scal(kDelta);
    T rho = 0;
    for (int64_t j = tid; j < n; j += nt)
      if (keep[j] != T(0) && j != i) rho += rows::dexp(-d2[j] * inv_tau);
    rho = block_sum(rho, red);
    const T eta = fmin(T(1), rho / scal(kKappa));
    ls = scal(kLambdaS) * eta;
    const T f = after ? T(1) : ls;
    for (int64_t j = tid; j < n; j += nt) {
      const T hinge = aff[j] - delta;
      rs[j] = -f * rows::dexp(-d2[j] * inv_tau) * (hinge > T(0) ? hinge : T(0));
    }
  }
  // ---- cohesion (§5): w' on kept keys, c_i = Σ w' z / Σ w', Var_i, γ_coh, raw = -f |z_j - c_i|² ---------------------
  if (p.use_coh) {
    const T inv_tau = static_cast<T>(1 / p.tau_coh[h]);
    T W = 0;
    for (int64_t j = tid; j < n; j += nt)
      if (keep[j] != T(0)) W += rows::dexp(-d2[j] * inv_tau);
    W = fmax(block_sum(W, red), T(1e-30));
    for (int64_t c = tid; c < dz; c += nt) {
      T s = 0;
      for (int64_t j = 0; j < n; ++j)
        if (keep[j] != T(0)) s += rows::dexp(-d2[j] * inv_tau) * Z[j * dz + c];
      cv[c] = s / W;
    }
    __syncthreads();
    T var = 0;
    for (int64_t j = tid; j < n; j += nt) {
      T dc = 0;
      for (int64_t c = 0; c < dz; ++c) {
        const T t = Z[j * dz + c] - cv[c];
        dc += t * t;
      }
      rc[j] = dc;
      if (keep[j] != T(0)) var += rows::dexp(-d2[j] * inv_tau) * dc;
    }
    var = block_sum(var, red) / W;
    lc = scal(kLambdaC) * sigmoid(static_cast<T>(-p.alpha_coh[h]) * var);
    const T f = after ? T(1) : lc * inv_tau;
    for (int64_t j = tid; j < n; j += nt) rc[j] = -f * rc[j];
  }
  __syncthreads();
  // ---- row statistics of the three raw biases; S = S_base + Σ ω' β̃ + bias; A = softmax(S / τ_score); y = A V ----
  T mu_a = 0, sc_a = 0, mu_s = 0, sc_s = 0, mu_c = 0, sc_c = 0;
  if (p.use_align) row_stats(ra, keep, n, p.norm_eps, red, mu_a, sc_a);
  if (p.use_sep) row_stats(rs, keep, n, p.norm_eps, red, mu_s, sc_s);
  if (p.use_coh) row_stats(rc, keep, n, p.norm_eps, red, mu_c, sc_c);
  const T om = static_cast<T>(p.omega_scale);
  const T wa = p.use_align ? scal(kOmegaA) * om * (after ? la : T(1)) * sc_a : T(0);
  const T ws = p.use_sep ? scal(kOmegaS) * om * (after ? ls : T(1)) * sc_s : T(0);
  const T wc = p.use_coh ? scal(kOmegaC) * om * (after ? lc : T(1)) * sc_c : T(0);
  const T* bp = p.bias ? static_cast<const T*>(p.bias) + b * p.bias_stride[0] + h * p.bias_stride[1] +
                             i * p.bias_stride[2]
                       : nullptr;
  const T inv_tau = T(1) / scal(kTauScore);
  T mx = ninf;
  for (int64_t j = tid; j < n; j += nt) {
    T S = s0[j];
    if (p.use_align) S += wa * (ra[j] - mu_a);
    if (p.use_sep) S += ws * (rs[j] - mu_s);
    if (p.use_coh) S += wc * (rc[j] - mu_c);
    if (bp) S += bp[j * p.bias_stride[3]];
    s0[j] = S;
    if (keep[j] != T(0)) mx = fmax(mx, S * inv_tau);
  }
  mx = block_max(mx, red);
  T* y = static_cast<T*>(p.y) + (bh * n + i) * d;
  if (mx == ninf) {  // no kept key: a zero row (uniform over the block, so no barrier is skipped by part of it)
    for (int64_t c = tid; c < d; c += nt) y[c] = T(0);
    return;
  }
  T z = 0;
  for (int64_t j = tid; j < n; j += nt) {
    const T e = keep[j] != T(0) ? rows::dexp(s0[j] * inv_tau - mx) : T(0);
    aff[j] = e;  // the unnormalised probabilities, in place of the affinities
    z += e;
  }
  z = block_sum(z, red);  // its barrier also publishes every aff[j]
  for (int64_t c = tid; c < d; c += nt) {
    T s = 0;
    for (int64_t j = 0; j < n; ++j) s += aff[j] * V[j * d + c];
    y[c] = s / z;
  }
}

}  // namespace

namespace ascender_launch {

cudaError_t forward(FloatElem t, const Params& p, cudaStream_t stream) {
  if (p.B * p.H == 0 || p.T == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(p.T), static_cast<unsigned>(p.B * p.H), 1), block(kThreads, 1, 1);
  cudaError_t err = cudaErrorInvalidValue;
  if (t == FloatElem::F32) err = launch_kernel(ascender_forward_kernel<float>, grid, block, stream, p);
  else if (t == FloatElem::F64) err = launch_kernel(ascender_forward_kernel<double>, grid, block, stream, p);
  return err != cudaSuccess ? err : cudaGetLastError();
}

}  // namespace ascender_launch
}  // namespace asc::cuda
