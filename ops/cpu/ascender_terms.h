#pragma once
// The terms of fused ASCender attention on the CPU (ops/cpu/ascender.cpp), each step's forward beside its backward:
// the row standardisation every bias term goes through, the base scores and the keep mask, alignment (top-k
// neighbourhoods, headings, gate), the scores and their softmax, the output. Separation and cohesion, which share
// the latent distances, are in ops/cpu/ascender_latent_terms.h.
//
// forward_block / backward_block (ops/cpu/ascender.cpp) call these in order, on one block of query rows (Block). Each
// function they call is forced inline (ASC_ALWAYS_INLINE): the drivers run through ASC_CPU_DISPATCH, and a function
// compiled apart would run the baseline instructions at every level. The backward of a per-row step (*_backward_row)
// runs inside the backward's row loop; the one of a step whose gradient combines rows (the GEMMs) runs after it.
// Derivations are written beside each backward.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "ops/ascender_scalars.h"
#include "ops/cpu/ascender_block.h"
#include "ops/cpu/compact.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/scratch.h"
#include "ops/kernel_types.h"
#include "ops/math.h"

#include "ops/cpu/vec_region_fma_begin.h"  // the row loops' region, closed by vec_region_end.h at the end

#include "ops/cpu/small_gemm.h"
#include "ops/cpu/vec_math.h"

namespace asc::cpu {
namespace {

using math::sigmoid;  // ops/math.h: the stable logistic both backends use

// ==== row standardisation (docs: row_standardize) ===================================================================

// The first pass of a term's statistics over a row of x: the sum, count and largest |x| over kept j. Producers fold it
// into the loop that writes x (the separation and cohesion passes); row_sums is the stand-alone pass.
template <class T>
struct RowSums {
  T sum = 0, count = 0, big = 0;
};
template <class T>
ASC_ALWAYS_INLINE RowSums<T> row_sums(const T* x, const T* keep, int64_t n) {
  // In 64-byte vectors whose sums stay in registers and fold in log2 L shuffles at the end (small_gemm.h: row_sum):
  // an `omp simd` reduction of three variables kept them in memory and ended with three scalar chains of L - 1.
  typedef T V __attribute__((vector_size(64)));
  constexpr int64_t L = 64 / sizeof(T);
  const V zero{};
  V vs{}, vc{}, vb{}, xv, kv;
  int64_t j = 0;
  for (; j + L <= n; j += L) {
    std::memcpy(&xv, x + j, sizeof(V)), std::memcpy(&kv, keep + j, sizeof(V));
    const V kx = kv != zero ? xv : zero;
    vs += kx, vc += kv;
    const V ax = kx < zero ? -kx : kx;
    vb = vb > ax ? vb : ax;
  }
  fold_sum<V, L, L / 2>(vs), fold_sum<V, L, L / 2>(vc), fold_max<V, L, L / 2>(vb);
  T sum = vs[0], count = vc[0], big = vb[0];
  for (; j < n; ++j) {
    const T xj = x[j];  // loaded unconditionally: a load under the select would keep the loop scalar
    const T kx = keep[j] != T(0) ? xj : T(0);
    sum += kx;
    count += keep[j];                   // 0 or 1
    const T ax = kx < T(0) ? -kx : kx;  // no std::abs / std::max here: they would not inline into this region
    big = big > ax ? big : ax;
  }
  return {sum, count, big};
}

// The statistics of raw = f x from the first pass's sums and a second pass for the variance (two passes, so a
// constant row is recognised exactly): μ = f μ_x, σ = |f| σ_x (population), constant when σ_x <= 1e-5 max|x| (docs
// §12.3) or f = 0.
template <class T>
ASC_ALWAYS_INLINE NormStats term_stats(const T* x, const T* keep, int64_t n, RowSums<T> sums, double f, double eps) {
  NormStats st;
  st.count = sums.count;
  if (st.count == 0) return st;
  const double mu_x = double(sums.sum) / st.count;
  const T mu = static_cast<T>(mu_x);
  typedef T V __attribute__((vector_size(64)));  // as row_sums: the sum in a register, folded at the end
  constexpr int64_t L = 64 / sizeof(T);
  const V zero{}, muv = zero + mu;
  V vv{}, xv, kv;
  int64_t j = 0;
  for (; j + L <= n; j += L) {
    std::memcpy(&xv, x + j, sizeof(V)), std::memcpy(&kv, keep + j, sizeof(V));
    const V dv = kv != zero ? xv - muv : zero;
    vv += dv * dv;
  }
  fold_sum<V, L, L / 2>(vv);
  T var = vv[0];
  for (; j < n; ++j) {
    const T xj = x[j];
    const T dv = keep[j] != T(0) ? xj - mu : T(0);
    var += dv * dv;
  }
  const double sd_x = std::sqrt(double(var) / st.count);
  st.mu = f * mu_x;
  st.sd = std::abs(f) * sd_x;
  st.s = st.sd + eps;
  // A NaN in x (its sums) or in f is never a constant row: the NaN must reach β̃ (docs §13).
  const bool nan = mu_x != mu_x || sd_x != sd_x || f != f;
  st.constant = !nan && (f == 0 || sd_x <= kConstantRow * double(sums.big));
  return st;
}

// β̃_j = scale (f x_j - μ), or 0 on a constant row (kept j; what masked j get does not matter: their scores are masked
// and their dS is 0).
struct Normalised {
  double scale, mu;
};
inline Normalised normalised(const NormStats& st) { return {st.constant ? 0.0 : 1 / st.s, st.mu}; }

// Backward of the standardisation of raw = f x (docs: row_standardize). With g = o dS the gradient reaching β̃
// (o = ω' times the after_norm gate; dS = 0 on masked keys):
//   d raw_j = (g_j - mean(g) - rc_j mean(g rc) / (σ s)) / s on kept j, rc = f x - μ; 0 elsewhere and on constant rows
//           = keep_j (p dS_j - a - q rc_j),
// so a row needs only Σ dS and Σ dS rc (standardise_backward's one pass) and each term's loop forms d raw_j where it
// reads it: d raw is never stored.
template <class T>
struct RawGrad {
  T p = 0, a = 0, q = 0, f = 0, mu = 0;  // all 0 on a constant row: d raw = 0
  ASC_ALWAYS_INLINE T at(T dS, T x, T keep) const {
    const T v = p * dS - a - q * (f * x - mu);
    return keep != T(0) ? v : T(0);
  }
};
// RawGrad a vector at a time, for the row loops that keep their sums in 64-byte vector registers (row_sums): the
// coefficients broadcast once per row; `at` writes through `out` (a vector returned by value changes the ABI between
// the levels).
template <class T>
struct RawGradLanes {
  typedef T V __attribute__((vector_size(64)));
  V p, a, q, f, mu;
  ASC_ALWAYS_INLINE explicit RawGradLanes(const RawGrad<T>& g)
      : p(V{} + g.p), a(V{} + g.a), q(V{} + g.q), f(V{} + g.f), mu(V{} + g.mu) {}
  ASC_ALWAYS_INLINE void at(const V& dS, const V& x, const V& keep, V& out) const {
    const V v = p * dS - a - q * (f * x - mu), zero{};
    out = keep != zero ? v : zero;
  }
};

// The row sums a bias term's backward needs, gathered by the softmax's backward pass (softmax_backward_row), which
// writes dS: Σ_j dS_ij (every term's) and, per term, Σ_j dS_ij (x_ij - x̄_i) with x̄_i = μ / f_x its tile's row mean
// (centred, as the forward's variance pass is). dS = 0 on masked keys, so both sums run over the kept ones.
struct TermSums {
  double s1 = 0;             // Σ dS
  double sx[3] = {0, 0, 0};  // Σ dS (x - x̄) for alignment r, separation φ, cohesion dc
};
// x̄ = μ / f_x, the mean of the term's tile row over kept keys (0 when f_x = 0: a constant row, whose sums are unused).
inline double tile_mean(const NormStats& st, double fx) { return fx != 0 ? st.mu / fx : 0.0; }

// One bias term's row (raw = fx x: its tile row x and row factor fx), from dβ̃ = ω' dS back to d(raw), from the row's
// sums (TermSums: s1 = Σ dS, sx = Σ dS (x - x̄), so Σ dS rc = fx sx). β̃_ij = f nr_j (f = the term's gate factor
// after_norm, else 1), nr_j = (fx x_j - μ) / s:  dω += Σ dS β̃ (into d_omega);  d(factor) = ω Σ dS nr after_norm (into
// d_factor, else 0). gx: Σ_j d raw_j x_j, which the gates' gradients before_norm need. With d raw = keep (p dS - a -
// q rc) and the sums above it is p sx (1 - σ/s) = p sx ε / s exactly (Σ d raw = 0, and Σ d raw rc = fx sx p ε / s):
// no pass over the row, and none of the cancellation a pass summing d raw_j x_j would carry.
template <class T>
ASC_ALWAYS_INLINE RawGrad<T> standardise_backward(double s1, double sx, bool after, double omega_scale, double omega,
                                                  double factor, double fx, const NormStats& st, double& d_omega,
                                                  double& d_factor, double& gx) {
  const double s2 = fx * sx;                                               // Σ dS rc
  const double f = after ? factor : 1.0, dsn = s2 * normalised(st).scale;  // Σ dS nr
  d_omega += dsn * f * omega_scale;
  d_factor = after ? omega * dsn : 0.0;
  gx = 0;
  RawGrad<T> rg;
  if (st.constant || st.count == 0) return rg;
  const double o = omega * f, mean_g = o * s1 / st.count, mean_grc = o * s2 / st.count;
  const double q = st.sd > 0 ? mean_grc / (st.sd * st.s) : 0.0;
  rg.p = static_cast<T>(o / st.s), rg.a = static_cast<T>(mean_g / st.s), rg.q = static_cast<T>(q / st.s);
  rg.f = static_cast<T>(fx), rg.mu = static_cast<T>(st.mu);
  gx = o / st.s * sx * (st.s - st.sd) / st.s;
  return rg;
}

// ==== base scores, products and the keep mask =======================================================================

// Base scores s0 = (q / √d) k_rotᵀ (a GEMM) and the products over the latent widths (gemm_narrow) for the block's
// rows. (Affinities a = ê_i · ê_j are read by the separation hinge and, unless selecting by scores, the top-k;
// z_i · z_j by the separation and cohesion kernels, which form |z_i - z_j|² from it in their own pass. Their
// backwards: affinity_backward and distances_backward, ops/cpu/ascender_latent_terms.h.)
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE void products_forward(const HeadData<T>& h, const Keys<T>& kt, const AscenderConfig& cfg, int64_t t0,
                                        int64_t R, Block<T>& b) {
  const int64_t n = kt.m, d = h.d, dz = h.dz, da = h.da;
  gemm<T>(R, n, d, h.qs.data() + t0 * d, d, 1, kt.kr, 1, d, b.s0.data(), n);
  const bool sep = cfg.use_sep, coh = cfg.use_coh;
  if (sep || (cfg.use_align && !cfg.select_by_scores))
    gemm_narrow<T, kIsa>(R, n, da, h.ehat.data() + t0 * da, da, kt.ehatT, n, b.aff.data(), n);
  if (sep || coh) gemm_narrow<T, kIsa>(R, n, dz, h.z + t0 * dz, dz, kt.zT, n, b.zdot.data(), n);  // z_i · z_j
}

// S0 = (Q / √d) Krᵀ:  dQ = dS Kr / √d;  dKr += dSᵀ (Q / √d)
template <class T>
ASC_ALWAYS_INLINE void base_scores_backward(const HeadData<T>& h, const Keys<T>& keys, int64_t t0, int64_t R,
                                            const T* dS, T* dq, T* dkr_k) {
  const int64_t d = h.d, n = keys.m;
  const double inv_sqrt_d = 1 / std::sqrt(double(d));
  gemm<T>(R, d, n, dS, n, 1, keys.kr, d, 1, dq + t0 * d, d);
  for (int64_t x = 0; x < R * d; ++x) dq[t0 * d + x] = static_cast<T>(dq[t0 * d + x] * inv_sqrt_d);
  gemm<T>(n, d, R, dS, 1, n, h.qs.data() + t0 * d, d, 1, dkr_k, d, true);
}

// The keep mask of the block's rows (the mask, the window, the global tokens; or all_kept: no tile), the number of
// kept keys per row and the column of each row's own key. No gradient.
template <class T>
ASC_ALWAYS_INLINE void keep_mask(const HeadData<T>& h, const Keys<T>& kt, const AscenderConfig& cfg, int64_t t0,
                                 int64_t R, Block<T>& b) {
  const int64_t n = kt.m;
  const int64_t w = cfg.window, g = cfg.global_tokens;
  b.all_kept = w <= 0 && !h.mask;
  if (b.all_kept)
    b.ones.assign(n, T(1));
  else
    b.keep.resize(R * n);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t i = t0 + r;
    const int64_t* cols = kt.cols.data();
    const bool* m = h.mask ? h.mask + i * h.mask_t : nullptr;
    if (b.all_kept) {
      b.kept[r] = static_cast<double>(n);
    } else {
      T* keep = b.keep.data() + r * n;
      if (w <= 0 && r > 0 && h.mask_t == 0) {  // a mask that is the same for every query (key padding): row 0's
        std::copy_n(b.keep.data(), n, keep);
        b.kept[r] = b.kept[0];
      } else {
        if (w <= 0 && !kt.gathered && h.mask_s == 1) {  // every key, the mask row's flags consecutive
          const auto* flags = reinterpret_cast<const unsigned char*>(m);
          for (int64_t j = 0; j < n; ++j) keep[j] = flags[j] != 0 ? T(1) : T(0);
        } else if (w <= 0) {
          for (int64_t j = 0; j < n; ++j) keep[j] = m[cols[j] * h.mask_s] ? T(1) : T(0);
        } else {
          for (int64_t j = 0; j < n; ++j) {
            const int64_t col = cols[j];
            const bool in_window = (i > col ? i - col : col - i) < w || i < g || col < g;
            keep[j] = in_window && (!m || m[col * h.mask_s]) ? T(1) : T(0);
          }
        }
        T kept = 0;
        ASC_SIMD_REDUCE(+, kept)
        for (int64_t j = 0; j < n; ++j) kept += keep[j];
        b.kept[r] = kept;
      }
    }
    const auto at = std::lower_bound(kt.cols.begin(), kt.cols.end(), i);
    b.self[r] = at != kt.cols.end() && *at == i ? at - kt.cols.begin() : -1;
  }
}

// ==== alignment (§3): neighbourhoods, headings, gates, r = u_i · k̂_j ==============================================

// out (d) = Σ_x rows[idx[x]] (rows of width d), a vector of columns at a time with its sum in a register; each column
// sums in x's order, as a plain loop would.
template <class T>
ASC_ALWAYS_INLINE void gather_sum(const T* rows, int64_t d, const int64_t* idx, int64_t cnt, T* out) {
  typedef T V __attribute__((vector_size(64)));
  constexpr int64_t L = 64 / sizeof(T);
  int64_t c = 0;
  for (; c + L <= d; c += L) {
    V acc{}, v;
    for (int64_t x = 0; x < cnt; ++x) std::memcpy(&v, rows + idx[x] * d + c, sizeof(V)), acc += v;
    std::memcpy(out + c, &acc, sizeof(V));
  }
  for (; c < d; ++c) {
    T acc = 0;
    for (int64_t x = 0; x < cnt; ++x) acc += rows[idx[x] * d + c];
    out[c] = acc;
  }
}

// N(i) per row (the forward only: the backward loads it), from the row's entries x_j = (by_j on selectable keys, else
// -inf):
//  1. group maxima over j mod G (G = 2k rounded up to 8): vertical maxima, no horizontal reductions;
//  2. a lower bound lo: the k-th largest group max (a rank count over the G maxima) — k groups reach it, so k
//     entries do, and every entry of N(i) is >= lo (on random rows about 1.3 k entries pass);
//  3. the entries >= lo, gathered in index order by a branch-free pass, are ranked all at once (a larger value, or
//     an equal one at a lower index, ranks first, as topk) and the first k kept; past 32 of them (rows of ties) they
//     go into a sorted list of k instead, where an entry enters only if it beats the current k-th.
// A selection has no gradient: the backward reaches the keys through s_i = Σ_{l∈N(i)} k̂_l only.
template <class T>
ASC_ALWAYS_INLINE void neighbourhoods(const HeadData<T>& h, const AscenderConfig& cfg, int64_t n, int64_t R,
                                      Block<T>& b) {
  const int64_t K = h.k, G = (2 * K + 7) / 8 * 8;
  // Plain arrays through raw pointers in the row loop: std:: members do not inline in this region.
  typedef T V __attribute__((vector_size(64)));
  constexpr int64_t L = 64 / sizeof(T);
  const int64_t Gp = (G + L - 1) / L * L;  // the group maxima padded to whole vectors with -inf
  std::vector<T> topv(K);
  Scratch<T> cand(n), gmax_v(Gp, -std::numeric_limits<T>::infinity()), gnan_v(Gp);  // aligned, read as vectors
  std::vector<int64_t> topi(K), cidx_v(n + 1);
  const T ninf = -std::numeric_limits<T>::infinity();
  T *cd = cand.data(), *gmax = gmax_v.data(), *gnan = gnan_v.data(), *tv = topv.data();
  constexpr int64_t kRanked = 32;  // up to this many candidates, ranked all at once; beyond (ties), inserted
  alignas(64) T rv[kRanked], rk[kRanked], rpos[kRanked];
  int64_t order[kRanked];
  for (int64_t c = 0; c < kRanked; ++c) rpos[c] = static_cast<T>(c);
  int64_t *ti = topi.data(), *cidx = cidx_v.data();
  for (int64_t r = 0; r < R; ++r) {
    const T* by = (cfg.select_by_scores ? b.s0.data() : b.aff.data()) + r * n;
    const T* keep = b.keep_row(r, n);
    ASC_SIMD
    for (int64_t j = 0; j < n; ++j) {
      const T x = by[j];
      cd[j] = keep[j] != T(0) ? x : ninf;
    }
    if (!cfg.include_self && b.self[r] >= 0) cd[b.self[r]] = ninf;
    // Group maxima, and the NaN candidates per group (the comparisons below would pass them over silently), both
    // vertical: no horizontal reduction in the pass over the row.
    for (int64_t g = 0; g < G; ++g) gmax[g] = ninf, gnan[g] = 0;
    int64_t jv = 0;    // the entries before jv are in the maxima
    if (G % L == 0) {  // whole vectors of groups (k = 8, 16, 24, ...): no loop remainders per block of G entries
      for (; jv + G <= n; jv += G)
        for (int64_t g0 = 0; g0 < G; g0 += L) {
          V x, m, c;
          std::memcpy(&x, cd + jv + g0, sizeof(V)), std::memcpy(&m, gmax + g0, sizeof(V));
          std::memcpy(&c, gnan + g0, sizeof(V));
          m = m > x ? m : x;
          c += x != x ? V{} + T(1) : V{};
          std::memcpy(gmax + g0, &m, sizeof(V)), std::memcpy(gnan + g0, &c, sizeof(V));
        }
    }
    for (int64_t j0 = jv; j0 < n; j0 += G) {
      const T* x = cd + j0;
      const int64_t len = n - j0 < G ? n - j0 : G;
      ASC_SIMD
      for (int64_t g = 0; g < len; ++g) {
        gmax[g] = gmax[g] > x[g] ? gmax[g] : x[g];  // a NaN entry can only lower it
        gnan[g] += x[g] != x[g] ? T(1) : T(0);
      }
    }
    T nans = 0;
    for (int64_t g = 0; g < G; ++g) nans += gnan[g];
    if (nans > T(0)) {  // N(i) is undefined: u_i becomes NaN below (docs §13)
      b.nbr[r].clear();
      b.nan_nbr[r] = 1;
      continue;
    }
    // lo: the largest group max that K groups reach. A vector of L maxima at a time, with the number of groups
    // whose max is >= each counted in a register (a broadcast compare per group); the padding's -inf lanes are
    // reached by every group and change no max.
    const V kv = V{} + static_cast<T>(K), one = V{} + T(1), zero{}, ninfv = V{} + ninf;
    V lov = ninfv;
    for (int64_t g0 = 0; g0 < Gp; g0 += L) {
      V gm, reach{};
      std::memcpy(&gm, gmax + g0, sizeof(V));
      for (int64_t q = 0; q < G; ++q) reach += gmax[q] >= gm ? one : zero;
      const V v = reach >= kv ? gm : ninfv;
      lov = lov > v ? lov : v;
    }
    fold_max<V, L, L / 2>(lov);
    const T lo = lov[0];
    T thr = lo == ninf ? ninf : std::nextafter(lo, ninf);  // x > thr: x >= lo, and never an unselectable -inf
    const int64_t nc = compact_greater(cd, n, thr, cidx);  // ops/cpu/compact.h: a vector at a time at x86-64-v4
    if (nc <= kRanked) {
      // Few candidates (the usual case): every candidate's rank at once, a lane each — the number that beat it, a
      // larger value or an equal one at a lower index (earlier in cidx), as topk orders them — then each goes to its
      // place. Branch-free: inserting them one by one mispredicted about every other candidate.
      for (int64_t c = 0; c < kRanked; ++c) rv[c] = c < nc ? cd[cidx[c]] : ninf, rk[c] = 0;  // padding: never counted
      for (int64_t e = 0; e < nc; ++e) {
        const T xe = rv[e], eT = static_cast<T>(e);
        ASC_SIMD
        for (int64_t c = 0; c < kRanked; ++c) rk[c] += ((xe > rv[c]) | ((xe == rv[c]) & (eT < rpos[c]))) ? T(1) : T(0);
      }
      for (int64_t c = 0; c < nc; ++c) order[static_cast<int64_t>(rk[c])] = cidx[c];  // the ranks: a permutation
      b.nbr[r].assign(order, order + (nc < K ? nc : K));
      continue;
    }
    int64_t m = 0;
    for (int64_t c = 0; c < nc; ++c) {
      const int64_t j = cidx[c];
      const T x = cd[j];
      if (!(x > thr)) continue;
      int64_t p = m < K ? m++ : m - 1;
      for (; p > 0 && tv[p - 1] < x; --p) tv[p] = tv[p - 1], ti[p] = ti[p - 1];
      tv[p] = x, ti[p] = j;
      if (m == K) thr = tv[m - 1];
    }
    b.nbr[r].assign(ti, ti + m);
  }
}

// The headings u_i = s_i / |s_i| of the neighbourhoods, the gate γ = σ(-α Var) with Var = 1 - |k̄|², the tile
// r_ij = u_i · k̂_j and (forward only) its statistics.
template <class T>
ASC_ALWAYS_INLINE void alignment_forward(const HeadData<T>& h, const Keys<T>& kt, const AscenderConfig& cfg, int64_t R,
                                         Block<T>& b, bool replay) {
  const int64_t n = kt.m, d = h.d;
  const bool after = cfg.after_norm();
  for (int64_t r = 0; r < R; ++r) {
    // s_i = Σ_{l∈N(i)} k̂_l, summed in T in u's row (k unit vectors: float loses nothing that matters here)
    double* s = b.s.data() + r * d;
    T* ur = b.u.data() + r * d;
    const int64_t* nb = b.nbr[r].data();
    const int64_t cnt = static_cast<int64_t>(b.nbr[r].size());
    gather_sum(kt.khat, d, nb, cnt, ur);
    if (b.nan_nbr[r])
      for (int64_t c = 0; c < d; ++c) ur[c] = std::numeric_limits<T>::quiet_NaN();
    double s2 = 0;
    ASC_SIMD_REDUCE(+, s2)
    for (int64_t c = 0; c < d; ++c) s[c] = ur[c], s2 += s[c] * s[c];
    b.snorm[r] = std::sqrt(s2);
    b.cnt[r] = static_cast<double>(cnt);
    const double cdiv = std::max(b.cnt[r], 1.0);
    b.kbar2[r] = s2 / (cdiv * cdiv);
    // u = s / |s|, and 0 where the headings cancel (|s| <= kConstantRow |N(i)|, an empty N(i) included): there
    // |s| is the rounding of the sum and its direction noise (docs §3). A NaN |s| fails the test and stays.
    const double inv = b.snorm[r] <= kConstantRow * b.cnt[r] ? 0.0 : 1 / b.snorm[r];
    for (int64_t c = 0; c < d; ++c) ur[c] = static_cast<T>(s[c] * inv);
    // Var = 1 - |k̄|², and 0 over an empty neighbourhood (SPEC §1.16): γ = σ(0) = 1/2 there
    b.gamma_a[r] = sigmoid(-h.alpha_a * (cnt > 0 || b.nan_nbr[r] ? 1 - b.kbar2[r] : 0.0));
    b.la[r] = h.sc[kLambdaA] * b.gamma_a[r];
    b.fa[r] = after ? 1.0 : b.la[r];  // raw = λγ r (before_norm) or r
  }
  gemm<T>(R, n, d, b.u.data(), d, 1, kt.khat, 1, d, b.r.data(), n);  // r_ij = u_i · k̂_j
  if (!replay)
    for (int64_t r = 0; r < R; ++r) {
      const T* rr = b.r.data() + r * n;
      const T* keep = b.keep_row(r, n);
      b.st_a[r] = term_stats(rr, keep, n, row_sums(rr, keep, n), b.fa[r], cfg.norm_eps);  // its own first pass
    }
}

// Row r of alignment, from dS down to dr and the heading sums' ds_i (into w.dsv), with the row's sums (TermSums).
// raw = λγ r (before_norm) or r:  dr = (λγ or 1) draw;  d(λγ) += Σ_j draw r (before_norm)
// λγ:  dλ += d(λγ) γ;  γ = σ(-α var):  dvar = d(λγ) λ γ (1 - γ) (-α);  var = 1 - |s / cnt|²:  ds = -2 s / cnt² dvar
template <class T>
ASC_ALWAYS_INLINE void alignment_backward_row(const HeadData<T>& h, const AscenderConfig& cfg, BackwardWork<T>& w,
                                              int64_t r, const TermSums& sums, double* ds) {
  const Block<T>& b = w.b;
  const int64_t n = w.keys.m, d = h.d;
  const bool after = cfg.after_norm();
  const double wa = h.sc[kOmegaA] * cfg.omega_scale;
  const T* dSr = w.dS.data() + r * n;
  const T* keep = b.keep_row(r, n);
  const T* rr = b.r.data() + r * n;
  double dla = 0, gr = 0;  // gr = Σ_j d raw_j r_j
  const RawGrad<T> rg = standardise_backward<T>(sums.s1, sums.sx[0], after, cfg.omega_scale, wa, b.la[r], b.fa[r],
                                                b.st_a[r], ds[kOmegaA], dla, gr);
  const T fac = static_cast<T>(after ? 1.0 : b.la[r]);
  T* drr = w.dr.data() + r * n;
  typedef T V __attribute__((vector_size(64)));  // d raw = RawGrad::at a vector at a time
  constexpr int64_t L = 64 / sizeof(T);
  const RawGradLanes<T> rgv(rg);
  const V facv = V{} + fac;
  V dv, xv, kv, gj;
  int64_t j = 0;
  for (; j + L <= n; j += L) {
    std::memcpy(&dv, dSr + j, sizeof(V)), std::memcpy(&xv, rr + j, sizeof(V)), std::memcpy(&kv, keep + j, sizeof(V));
    rgv.at(dv, xv, kv, gj);
    const V out = facv * gj;
    std::memcpy(drr + j, &out, sizeof(V));
  }
  for (; j < n; ++j) drr[j] = fac * rg.at(dSr[j], rr[j], keep[j]);
  if (!after) dla += gr;
  ds[kLambdaA] += dla * b.gamma_a[r];
  const double dvar = dla * h.sc[kLambdaA] * b.gamma_a[r] * (1 - b.gamma_a[r]) * (-h.alpha_a);
  const double cdiv = std::max(b.cnt[r], 1.0);
  const double* sr = b.s.data() + r * d;
  double* dsr = w.dsv.data() + r * d;
  for (int64_t c = 0; c < d; ++c) dsr[c] = -2 * sr[c] / (cdiv * cdiv) * dvar;
}

// The block's alignment GEMMs and headings, after the row loop.
// r_ij = u_i · k̂_j:  dK̂ += drᵀ U;  dU = dr K̂
// u = s / |s|:  ds += (du - u (u·du)) / |s|; nothing where the headings cancel (u = 0 there, a constant)
// s_i = Σ_{l∈N(i)} k̂_l:  dk̂_l += ds_i (into kg.dks)
template <class T>
ASC_ALWAYS_INLINE void alignment_backward(const HeadData<T>& h, int64_t R, BackwardWork<T>& w, const KeyGrads<T>& kg) {
  const Block<T>& b = w.b;
  const int64_t n = w.keys.m, d = h.d;
  w.du.assign(R * d, T(0));
  gemm<T>(n, d, R, w.dr.data(), 1, n, b.u.data(), d, 1, kg.dkhat, d, true);
  gemm<T>(R, d, n, w.dr.data(), n, 1, w.keys.khat, d, 1, w.du.data(), d);
  for (int64_t r = 0; r < R; ++r) {
    double* dsr = w.dsv.data() + r * d;
    const T* ur = b.u.data() + r * d;
    const T* dur = w.du.data() + r * d;
    if (!(b.snorm[r] <= kConstantRow * b.cnt[r])) {
      double dot = 0;
      ASC_SIMD_REDUCE(+, dot)
      for (int64_t c = 0; c < d; ++c) dot += double(ur[c]) * dur[c];
      const double inv_norm = 1 / b.snorm[r];
      for (int64_t c = 0; c < d; ++c) dsr[c] += (dur[c] - ur[c] * dot) * inv_norm;
    }
    // dk̂_l += ds_i over l ∈ N(i), through raw pointers (a range-for's iterators are calls in this region)
    const int64_t* nb = b.nbr[r].data();
    const int64_t cnt = static_cast<int64_t>(b.nbr[r].size());
    for (int64_t x = 0; x < cnt; ++x) {
      double* dk = kg.dks + nb[x] * d;
      ASC_SIMD
      for (int64_t c = 0; c < d; ++c) dk[c] += dsr[c];
    }
  }
}

// ==== scores and softmax (§6) =======================================================================================

// S = s0 (+ β^other) + Σ_⋆ ω'_⋆ β̃_⋆ and the softmax numerators e = exp(S/τ - max) over kept keys (A), with the row
// max and 1 / Σ e (forward; replay reads them from RowState).
template <class T>
ASC_ALWAYS_INLINE void scores_forward(const HeadData<T>& h, const Keys<T>& kt, const AscenderConfig& cfg, int64_t t0,
                                      int64_t R, Block<T>& b, bool replay) {
  const int64_t n = kt.m;
  const bool after = cfg.after_norm(), sep = cfg.use_sep, coh = cfg.use_coh;
  const double wa = h.sc[kOmegaA] * cfg.omega_scale, wsep = h.sc[kOmegaS] * cfg.omega_scale;
  const double wcoh = h.sc[kOmegaC] * cfg.omega_scale, tau = h.sc[kTauScore];
  const T inv_tau = static_cast<T>(1 / tau), ninf = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < R; ++r) {
    const int64_t i = t0 + r;
    const T* keep = b.keep_row(r, n);
    T* S = b.S.data() + r * n;
    T* A = b.A.data() + r * n;
    // S = s0 + Σ_⋆ ω'_⋆ β̃_⋆ with β̃ = scale (f x - μ): per term a coefficient on its tile and a row constant (ω' = ω,
    // times the gate after_norm). A term that is off has coefficient 0 and reads the s0 row (any finite row).
    T coef[3] = {0, 0, 0};
    const T* x[3] = {b.s0.data() + r * n, b.s0.data() + r * n, b.s0.data() + r * n};
    double c0 = 0;
    auto term = [&](int t, bool on, const Scratch<T>& tile, const NormStats& st, double f, double omega, double gate) {
      if (!on) return;
      const Normalised nz = normalised(st);
      const double wt = omega * (after ? gate : 1.0) * nz.scale;
      coef[t] = static_cast<T>(wt * f), c0 -= wt * nz.mu, x[t] = tile.data() + r * n;
    };
    term(0, cfg.use_align, b.r, b.st_a[r], b.fa[r], wa, b.la[r]);
    term(1, sep, b.phi, b.st_s[r], b.fs[r], wsep, b.ls[r]);
    term(2, coh, b.dc, b.st_c[r], b.fc[r], wcoh, b.lc[r]);
    const T* s0 = b.s0.data() + r * n;
    const T *xa = x[0], *xs = x[1], *xc = x[2];
    const T ca = coef[0], cs = coef[1], cc = coef[2], cst = static_cast<T>(c0);
    const T* brow = h.bias ? h.bias + i * h.bias_t : nullptr;
    const T* base = s0;  // s0, plus β^other when given
    if (brow && kt.gathered)
      for (int64_t j = 0; j < n; ++j) S[j] = s0[j] + brow[kt.cols[j] * h.bias_s];
    else if (brow)
      for (int64_t j = 0; j < n; ++j) S[j] = s0[j] + brow[j * h.bias_s];
    if (brow) base = S;
    if (!replay) {
      T m = ninf;
      ASC_SIMD_REDUCE(max, m)
      for (int64_t j = 0; j < n; ++j) {
        const T sj = base[j] + ca * xa[j] + cs * xs[j] + cc * xc[j] + cst;
        S[j] = sj;
        const T xk = keep[j] != T(0) ? sj * inv_tau : ninf;
        m = m > xk ? m : xk;
      }
      if (m == ninf) {
        // No kept key: a zero row. Or only seemingly: the max above passes a NaN over when a later entry is
        // compared with it (NaN > x is false), so look for one (rare rows only); a NaN row stays NaN (docs §13).
        bool nan = false;
        for (int64_t j = 0; j < n; ++j) nan = nan || (keep[j] != T(0) && !(S[j] * inv_tau == S[j] * inv_tau));
        if (!nan) {
          b.smax[r] = m;
          for (int64_t j = 0; j < n; ++j) A[j] = T(0);
          b.inv_z[r] = 0;
          continue;
        }
        m = std::numeric_limits<T>::quiet_NaN();
      }
      b.smax[r] = m;
      T z = 0;
      ASC_SIMD_REDUCE(+, z)
      for (int64_t j = 0; j < n; ++j) {
        const T sj = S[j];
        const T e = exp_nonpos(keep[j] != T(0) ? sj * inv_tau - m : ninf);  // 0 on masked keys
        A[j] = e;
        z += e;
      }
      b.inv_z[r] = 1 / double(z);
    } else {
      const T m = static_cast<T>(b.smax[r]);  // -inf on a row with no kept key: every e is then exp(-inf) = 0
      ASC_SIMD
      for (int64_t j = 0; j < n; ++j) {
        const T sj = base[j] + ca * xa[j] + cs * xs[j] + cc * xc[j] + cst;
        S[j] = sj;
        A[j] = exp_nonpos(keep[j] != T(0) ? sj * inv_tau - m : ninf);
      }
    }
  }
}

// Row r of A = softmax(S / τ) over kept keys, from dA' (w.dA: output_backward) to dS (w.dS):
// g = A (dA - Σ A dA) = e (dA' - D / z) with D = Σ e dA';  dS = g / τ;  dτ += Σ g · (-S / τ²)
// The pass that writes dS also gathers the bias terms' row sums (TermSums): the terms' backwards need no pass of
// their own to sum over the row before their one pass that writes.
template <class T>
ASC_ALWAYS_INLINE TermSums softmax_backward_row(const HeadData<T>& h, const AscenderConfig& cfg, BackwardWork<T>& w,
                                                int64_t r, double* ds) {
  const Block<T>& b = w.b;
  const int64_t n = w.keys.m;
  const double tau = h.sc[kTauScore];
  const T* e = b.A.data() + r * n;
  const T* S = b.S.data() + r * n;
  const T* dAr = w.dA.data() + r * n;
  T* dSr = w.dS.data() + r * n;
  typedef T V __attribute__((vector_size(64)));  // D in a register, as row_sums' sums
  constexpr int64_t L = 64 / sizeof(T);
  V vd{}, ev, av;
  int64_t j = 0;
  for (; j + L <= n; j += L) std::memcpy(&ev, e + j, sizeof(V)), std::memcpy(&av, dAr + j, sizeof(V)), vd += ev * av;
  fold_sum<V, L, L / 2>(vd);
  T D = vd[0];
  for (; j < n; ++j) D += e[j] * dAr[j];
  const T inv_tau = static_cast<T>(1 / tau), Dz = static_cast<T>(D * b.inv_z[r]);
  // The terms' tile rows and means (a term that is off reads the S row, and its sum is unused)
  const T* xa = cfg.use_align ? b.r.data() + r * n : S;
  const T* xs = cfg.use_sep ? b.phi.data() + r * n : S;
  const T* xc = cfg.use_coh ? b.dc.data() + r * n : S;
  const T ma = static_cast<T>(cfg.use_align ? tile_mean(b.st_a[r], b.fa[r]) : 0.0);
  const T ms = static_cast<T>(cfg.use_sep ? tile_mean(b.st_s[r], b.fs[r]) : 0.0);
  const T mc = static_cast<T>(cfg.use_coh ? tile_mean(b.st_c[r], b.fc[r]) : 0.0);
  // Σ g S, Σ dS and Σ dS (x - x̄) per term (masked keys have e = 0, so g = 0), likewise in registers
  const V Dzv = V{} + Dz, itv = V{} + inv_tau, mav = V{} + ma, msv = V{} + ms, mcv = V{} + mc;
  V vg{}, v1{}, va{}, vs{}, vc{}, sv, x;
  int64_t j1 = 0;
  for (; j1 + L <= n; j1 += L) {
    std::memcpy(&ev, e + j1, sizeof(V)), std::memcpy(&av, dAr + j1, sizeof(V)), std::memcpy(&sv, S + j1, sizeof(V));
    const V gg = ev * (av - Dzv), ds_v = gg * itv;
    std::memcpy(dSr + j1, &ds_v, sizeof(V));
    vg += gg * sv;
    v1 += ds_v;
    std::memcpy(&x, xa + j1, sizeof(V)), va += ds_v * (x - mav);
    std::memcpy(&x, xs + j1, sizeof(V)), vs += ds_v * (x - msv);
    std::memcpy(&x, xc + j1, sizeof(V)), vc += ds_v * (x - mcv);
  }
  fold_sum<V, L, L / 2>(vg), fold_sum<V, L, L / 2>(v1);
  fold_sum<V, L, L / 2>(va), fold_sum<V, L, L / 2>(vs), fold_sum<V, L, L / 2>(vc);
  T gs = vg[0], s1 = v1[0], sa = va[0], ss = vs[0], sc = vc[0];
  for (; j1 < n; ++j1) {
    const T gg = e[j1] * (dAr[j1] - Dz), dsj = gg * inv_tau;
    dSr[j1] = dsj;
    gs += gg * S[j1];
    s1 += dsj, sa += dsj * (xa[j1] - ma), ss += dsj * (xs[j1] - ms), sc += dsj * (xc[j1] - mc);
  }
  ds[kTauScore] += -double(gs) / (tau * tau);
  return {double(s1), {double(sa), double(ss), double(sc)}};
}

// ==== the output ====================================================================================================

// y = e V for the block's rows (a GEMM into y's rows yb), then each row times 1 / Σ e.
template <class T>
ASC_ALWAYS_INLINE void output_forward(const Keys<T>& kt, int64_t R, int64_t d, const Block<T>& b, T* yb) {
  gemm<T>(R, d, kt.m, b.A.data(), kt.m, 1, kt.v, d, 1, yb, d);
  for (int64_t r = 0; r < R; ++r) {
    const double iz = b.inv_z[r];
    for (int64_t c = 0; c < d; ++c) yb[r * d + c] = static_cast<T>(yb[r * d + c] * iz);
  }
}

// y_i = (e_i V) / z_i with A_ij = e_ij / z_i (b.A holds e, b.inv_z 1 / z). With dy'_i = dy_i / z_i (w.gys):
// dV += eᵀ dy' (= Aᵀ dy);  dA' = dy' Vᵀ (w.dA; per row A_ij dA_ij = e_ij dA'_ij, which softmax_backward_row reads)
template <class T>
ASC_ALWAYS_INLINE void output_backward(int64_t R, int64_t d, const T* gy0, BackwardWork<T>& w, T* dv_k) {
  const Block<T>& b = w.b;
  const int64_t n = w.keys.m;
  w.gys.resize(R * d);
  T* gys = w.gys.data();
  for (int64_t r = 0; r < R; ++r) {
    const double iz = b.inv_z[r];
    for (int64_t c = 0; c < d; ++c) gys[r * d + c] = static_cast<T>(gy0[r * d + c] * iz);
  }
  gemm<T>(R, n, d, gys, d, 1, w.keys.v, 1, d, w.dA.data(), n);
  gemm<T>(n, d, R, b.A.data(), 1, n, gys, d, 1, dv_k, d, true);
}

}  // namespace
}  // namespace asc::cpu

#include "ops/cpu/vec_region_end.h"
