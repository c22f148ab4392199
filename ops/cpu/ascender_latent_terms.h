#pragma once
// Separation (§4) and cohesion (§5) of fused ASCender attention on the CPU (ops/cpu/ascender.cpp), each step's forward
// beside its backward. Both read the latent distances d²_ij = |z_i - z_j|²: one pass forms them and both terms'
// kernels (latent_kernels_forward), and one backward takes their gradient to z (distances_backward). The row
// standardisation, the other terms and the conventions (forced inline, *_backward_row) are in
// ops/cpu/ascender_terms.h.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "ops/ascender_scalars.h"
#include "ops/cpu/ascender_block.h"
#include "ops/cpu/ascender_terms.h"
#include "ops/cpu/gemm.h"
#include "ops/kernel_types.h"

#include "ops/cpu/vec_region_fma_begin.h"  // the row loops' region, closed by vec_region_end.h at the end

#include "ops/cpu/small_gemm.h"
#include "ops/cpu/vec_math.h"

namespace asc::cpu {
namespace {

// |a - b|² = |a|² + |b|² - 2 a·b from the two squared norms and the dot product (a GEMM's output), with the rounding
// that can take it below 0 clamped: the separation / cohesion kernels' distances and the cohesion term dc.
template <class T>
ASC_ALWAYS_INLINE T sq_dist(T a2, T b2, T ab) {
  const T v = a2 + b2 - 2 * ab;
  return v < T(0) ? T(0) : v;  // written so that a NaN stays NaN (NaN < 0 is false)
}

// ==== the kernels: one pass over d² = |z_i|² + |z_j|² - 2 z_i·z_j (rounding below 0 clamped) ======================

// How latent_kernels_forward's separation pass forms the cohesion kernel w' beside w: not at all (cohesion off), as w
// on kept keys (one temperature, the default: one exponential per key instead of two, the same bits), or with its own
// exponential.
enum class CohesionKernel { kNone, kShared, kOwn };

// One row of the separation pass (latent_kernels_forward): w, φ and, per kCoh, w' over the row's n keys, with the sums
// ρ (kept l ≠ i), Σ w' and φ's first statistics pass (the sum and max over kept keys; φ >= 0: |φ| = φ). ρ_i sums over
// l ≠ i: the self column is left out of its sum by its position, rather than subtracting w_ii = 1 from the total
// afterwards — for an isolated token (ρ_i << 1) that difference would keep no relative precision — and not by
// splitting the row around it, whose two scalar remainders (two exponentials per key each) cost more than the rest of
// the row at a few hundred keys. col holds the positions as T, so the test runs in the row's own vectors (as an int64
// index it took two vectors of indices per vector of keys, spilled to the stack).
template <CohesionKernel kCoh, class T>
ASC_ALWAYS_INLINE void separation_row(int64_t n, T zi, const T* zzk, const T* zij, const T* aff, const T* keep,
                                      const T* col, T self, T inv_ts, T inv_tc, T delta, T* ws, T* phi, T* wc,
                                      T& rho_out, T& W_out, T& psum_out, T& pbig_out) {
  const T ninf = -std::numeric_limits<T>::infinity();
  T rho = 0, W = 0, psum = 0, pbig = 0;
  ASC_SIMD_SUMS_MAX(pbig, rho, W, psum)
  for (int64_t j = 0; j < n; ++j) {
    const T dj = sq_dist(zi, zzk[j], zij[j]), kj = keep[j], hinge = aff[j] - delta;
    const T w = exp_nonpos(-dj * inv_ts);
    ws[j] = w;
    const T ph = w * (hinge <= T(0) ? T(0) : hinge);  // [a - δ]_+, a NaN stays NaN
    phi[j] = ph;
    const T kph = kj != T(0) ? ph : T(0);
    const T kr = col[j] == self ? T(0) : kj;  // a select: with `&&` the loop stayed scalar (4x slower)
    rho += kr != T(0) ? w : T(0);
    psum += kph;
    pbig = pbig > kph ? pbig : kph;
    if constexpr (kCoh != CohesionKernel::kNone) {
      const T wcj = kCoh == CohesionKernel::kShared ? (kj != T(0) ? w : T(0))
                                                    : exp_nonpos(kj != T(0) ? -dj * inv_tc : ninf);  // 0 if masked
      wc[j] = wcj;
      W += wcj;
    }
  }
  rho_out = rho, W_out = W, psum_out = psum, pbig_out = pbig;
}

// Separation: w = exp(-d²/τ_sep), ρ_i = Σ_{kept l ≠ i} w_il, η = min(1, ρ/κ), φ = w [a - δ]_+ and (forward only) φ's
// statistics; the cohesion kernel: w' = exp(-d²/τ_coh) on kept keys, W = Σ w'.
template <class T>
ASC_ALWAYS_INLINE void latent_kernels_forward(const HeadData<T>& h, const Keys<T>& kt, const AscenderConfig& cfg,
                                              int64_t t0, int64_t R, Block<T>& b, bool replay) {
  const int64_t n = kt.m;
  const bool after = cfg.after_norm(), sep = cfg.use_sep, coh = cfg.use_coh;
  const T inv_ts = static_cast<T>(1 / h.tau_sep), inv_tc = static_cast<T>(1 / h.tau_coh);
  const T delta = static_cast<T>(h.sc[kDelta]), ninf = -std::numeric_limits<T>::infinity();
  const T* zzk = kt.zz;
  b.col.resize(n);  // the column positions as T (exact below 2^24 keys), for separation_row's self test
  T* col = b.col.data();
  for (int64_t j = 0; j < n; ++j) col[j] = static_cast<T>(j);
  for (int64_t r = 0; r < R; ++r) {
    const T* zij = b.zdot.data() + r * n;
    const T zi = h.zz[t0 + r];
    const T* aff = b.aff.data() + r * n;
    const T* keep = b.keep_row(r, n);
    T *ws = b.ws.data() + r * n, *phi = b.phi.data() + r * n, *wc = b.wc.data() + r * n;
    const T self = static_cast<T>(b.self[r]);  // -1 when key i is not among the columns
    T rho = 0, W = 0, psum = 0, pbig = 0;      // one pass over the row forms them (separation_row)
    if (sep && coh && inv_ts == inv_tc)
      separation_row<CohesionKernel::kShared>(n, zi, zzk, zij, aff, keep, col, self, inv_ts, inv_tc, delta, ws, phi, wc,
                                              rho, W, psum, pbig);
    else if (sep && coh)
      separation_row<CohesionKernel::kOwn>(n, zi, zzk, zij, aff, keep, col, self, inv_ts, inv_tc, delta, ws, phi, wc,
                                           rho, W, psum, pbig);
    else if (sep)
      separation_row<CohesionKernel::kNone>(n, zi, zzk, zij, aff, keep, col, self, inv_ts, inv_tc, delta, ws, phi, wc,
                                            rho, W, psum, pbig);
    else {  // cohesion alone
      ASC_SIMD_REDUCE(+, W)
      for (int64_t j = 0; j < n; ++j) {
        const T wcj = exp_nonpos(keep[j] != T(0) ? -sq_dist(zi, zzk[j], zij[j]) * inv_tc : ninf);
        wc[j] = wcj;
        W += wcj;
      }
    }
    if (sep) {
      b.rho[r] = rho;
      const double ratio = b.rho[r] / h.sc[kKappa];
      b.eta[r] = ratio >= 1 ? 1.0 : ratio;  // min(1, ρ/κ), a NaN stays NaN (std::min would return 1)
      b.ls[r] = h.sc[kLambdaS] * b.eta[r];
      b.fs[r] = after ? -1.0 : -b.ls[r];  // raw = -λη φ (before_norm) or -φ
      if (!replay)
        b.st_s[r] = term_stats(phi, keep, n, RowSums<T>{psum, static_cast<T>(b.kept[r]), pbig}, b.fs[r], cfg.norm_eps);
    }
    if (coh) b.W[r] = std::max(double(W), 1e-30);
  }
}

// ==== separation ====================================================================================================

// Row r of separation, from dS down to the affinities' da (w.daff) and the distances' dd² (w.dd2), with the row's sums
// (TermSums), in one pass over the row.
// raw = -(λη or 1) φ,  φ = w [a - δ]_+:  dw = dφ [a - δ]_+;  da = dφ w 1[a > δ];  dδ = -Σ dφ w 1[a > δ]
// λη:  dλ += d(λη) η;  η = min(1, ρ / κ):  dρ = dη / κ, dκ = -dη ρ / κ² while ρ / κ < 1
// ρ = Σ_{kept l ≠ i} w_il and w = exp(-d² / τ_sep):  dd² = -(dw + dρ) w / τ_sep (the self entry without dρ)
template <class T>
ASC_ALWAYS_INLINE void separation_backward_row(const HeadData<T>& h, const AscenderConfig& cfg, BackwardWork<T>& w,
                                               int64_t r, const TermSums& sums, double* ds) {
  const Block<T>& b = w.b;
  const int64_t n = w.keys.m;
  const bool after = cfg.after_norm();
  const double wsep = h.sc[kOmegaS] * cfg.omega_scale;
  const T delta = static_cast<T>(h.sc[kDelta]);
  const T* dSr = w.dS.data() + r * n;
  const T* keep = b.keep_row(r, n);
  const T* phi = b.phi.data() + r * n;
  double dls = 0, gphi = 0;  // gphi = Σ_j d raw_j φ_j
  const RawGrad<T> rg = standardise_backward<T>(sums.s1, sums.sx[1], after, cfg.omega_scale, wsep, b.ls[r], b.fs[r],
                                                b.st_s[r], ds[kOmegaS], dls, gphi);
  if (!after) dls -= gphi;
  ds[kLambdaS] += dls * b.eta[r];
  const double deta = dls * h.sc[kLambdaS];
  double drho = 0;
  if (b.rho[r] / h.sc[kKappa] < 1) {
    drho = deta / h.sc[kKappa];
    ds[kKappa] += -deta * b.rho[r] / (h.sc[kKappa] * h.sc[kKappa]);
  }
  const T* ws = b.ws.data() + r * n;
  const T* aff = b.aff.data() + r * n;
  const T* col = b.col.data();  // the self column leaves dρ out: ρ_i sums over l ≠ i (latent_kernels_forward)
  const T self = static_cast<T>(b.self[r]);
  T* daffr = w.daff.data() + r * n;
  T* dd2r = w.dd2.data() + r * n;
  const T fac = static_cast<T>(after ? 1.0 : b.ls[r]), drhoT = static_cast<T>(drho);
  const T inv_tau = static_cast<T>(1 / h.tau_sep);
  // Σ dφ w 1[a > δ] in a register a vector at a time (ascender_terms.h: row_sums), then the last n % L keys
  typedef T V __attribute__((vector_size(64)));
  constexpr int64_t L = 64 / sizeof(T);
  const RawGradLanes<T> rgv(rg);
  const V zero{}, nfac = zero - fac, deltav = zero + delta, drhov = zero + drhoT, ninv = zero - inv_tau;
  const V selfv = zero + self;
  V vdh{}, dv, xv, kv, affv, wsv, cv, gj;
  int64_t j0 = 0;
  for (; j0 + L <= n; j0 += L) {
    std::memcpy(&dv, dSr + j0, sizeof(V)), std::memcpy(&xv, phi + j0, sizeof(V));
    std::memcpy(&kv, keep + j0, sizeof(V)), std::memcpy(&affv, aff + j0, sizeof(V));
    std::memcpy(&wsv, ws + j0, sizeof(V)), std::memcpy(&cv, col + j0, sizeof(V));
    rgv.at(dv, xv, kv, gj);  // d raw
    const V hinge = affv - deltav, dphi = nfac * gj;
    const V da_j = hinge > zero ? dphi * wsv : zero;
    std::memcpy(daffr + j0, &da_j, sizeof(V));
    vdh += da_j;
    const V dw = dphi * (hinge <= zero ? zero : hinge), kr = cv == selfv ? zero : kv;
    const V dd2 = (dw + (kr != zero ? drhov : zero)) * wsv * ninv;
    std::memcpy(dd2r + j0, &dd2, sizeof(V));
  }
  fold_sum<V, L, L / 2>(vdh);
  T dhinge = vdh[0];
  for (int64_t j = j0; j < n; ++j) {
    const T hinge = aff[j] - delta, dphi = -fac * rg.at(dSr[j], phi[j], keep[j]);
    const T da_j = hinge > T(0) ? dphi * ws[j] : T(0);
    daffr[j] = da_j;
    dhinge += da_j;
    const T dw = dphi * (hinge <= T(0) ? T(0) : hinge), kr = col[j] == self ? T(0) : keep[j];
    dd2r[j] = -(dw + (kr != T(0) ? drhoT : T(0))) * ws[j] * inv_tau;
  }
  ds[kDelta] -= dhinge;
}

// a_ij = ê_i · ê_j:  dÊ_i += (da Ê)_i;  dÊ_j += (daᵀ Ê_blk)_j (the block's rows of dÊ into w.dehat, its keys' into
// kg.dehat)
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE void affinity_backward(const HeadData<T>& h, int64_t t0, int64_t R, BackwardWork<T>& w,
                                         const KeyGrads<T>& kg) {
  const int64_t n = w.keys.m, da = h.da;
  gemm_dots<T, kIsa>(R, da, n, w.daff.data(), n, w.keys.ehatT, n, w.dehat.data() + t0 * da, da, true);
  gemm<T>(n, da, R, w.daff.data(), 1, n, h.ehat.data() + t0 * da, da, 1, kg.dehat, da, true);
}

// ==== cohesion ======================================================================================================

// The centroid c_i = Σ_l w'_il z_l / W_i (forward only: replay loads it), dc_ij = |z_j - c_i|², its weighted
// variance Var_i = Σ_j w'_ij dc_ij / W_i, the gate γ = σ(-α Var) and (forward only) dc's statistics.
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE void cohesion_forward(const HeadData<T>& h, const Keys<T>& kt, const AscenderConfig& cfg, int64_t R,
                                        Block<T>& b, bool replay) {
  const int64_t n = kt.m, dz = h.dz;
  const bool after = cfg.after_norm();
  if (!replay) {
    gemm_dots<T, kIsa>(R, dz, n, b.wc.data(), n, kt.zT, n, b.c.data(), dz);  // Σ_l w'_il z_l
    for (int64_t r = 0; r < R; ++r) {
      T* cr = b.c.data() + r * dz;
      const double W = b.W[r];
      for (int64_t c = 0; c < dz; ++c) cr[c] = static_cast<T>(cr[c] / W);
    }
  }
  gemm_narrow<T, kIsa>(R, n, dz, b.c.data(), dz, kt.zT, n, b.dc.data(), n);  // c_i · z_j
  for (int64_t r = 0; r < R; ++r) {
    double cc = 0;
    const T* cr = b.c.data() + r * dz;
    for (int64_t c = 0; c < dz; ++c) cc += double(cr[c]) * cr[c];
    T* dc = b.dc.data() + r * n;
    const T* wc = b.wc.data() + r * n;
    const T* keep = b.keep_row(r, n);
    const T ccT = static_cast<T>(cc);
    const T* zz = kt.zz;
    // dc's first statistics pass rides along (dc >= 0: |dc| = dc). In 64-byte vectors whose sums stay in registers
    // (ascender_terms.h: row_sums), then the last n % L keys.
    typedef T V __attribute__((vector_size(64)));
    constexpr int64_t L = 64 / sizeof(T);
    const V zero{}, ccv = zero + ccT;
    V vvar{}, vsum{}, vbig{}, zv, dv, wv, kv;
    int64_t j0 = 0;
    for (; j0 + L <= n; j0 += L) {
      std::memcpy(&zv, zz + j0, sizeof(V)), std::memcpy(&dv, dc + j0, sizeof(V));
      std::memcpy(&wv, wc + j0, sizeof(V)), std::memcpy(&kv, keep + j0, sizeof(V));
      V x = ccv + zv - T(2) * dv;
      x = x < zero ? zero : x;  // sq_dist: a NaN stays NaN
      std::memcpy(dc + j0, &x, sizeof(V));
      vvar += wv * x;
      const V kx = kv != zero ? x : zero;
      vsum += kx;
      vbig = vbig > kx ? vbig : kx;
    }
    fold_sum<V, L, L / 2>(vvar), fold_sum<V, L, L / 2>(vsum), fold_max<V, L, L / 2>(vbig);
    T var = vvar[0], sum = vsum[0], big = vbig[0];
    for (int64_t j = j0; j < n; ++j) {
      const T x = sq_dist(ccT, zz[j], dc[j]);
      dc[j] = x;
      var += wc[j] * x;
      const T kx = keep[j] != T(0) ? x : T(0);
      sum += kx;
      big = big > kx ? big : kx;
    }
    b.var_c[r] = var / b.W[r];
    b.gamma_c[r] = sigmoid(-h.alpha_c * b.var_c[r]);
    b.lc[r] = h.sc[kLambdaC] * b.gamma_c[r];
    b.fc[r] = after ? -1.0 : -b.lc[r] / h.tau_coh;  // raw = -λγ dc / τ_coh (before_norm) or -dc
    if (!replay)
      b.st_c[r] = term_stats(dc, keep, n, RowSums<T>{sum, static_cast<T>(b.kept[r]), big}, b.fc[r], cfg.norm_eps);
  }
}

// Row r of cohesion up to its centroid, from dS to ddc (w.ddc), dw' (w.dwc), dW (w.dW) and the centroid's dC (w.dC),
// with the row's sums (TermSums), in one pass over the row.
// raw = -(λγ / τ_coh or 1) dc:  ddc = -(..) draw;  d(λγ) += -Σ draw dc / τ_coh (before_norm)
// λγ:  dλ += d(λγ) γ;  γ = σ(-α var):  dvar = d(λγ) λ γ (1 - γ) (-α)
// var = Σ w' dc / W:  dw' = dvar dc / W;  ddc += dvar w' / W;  dW = -dvar var / W
// dc = |c|² + |z_j|² - 2 c·z_j:  dc_i = 2 c_i Σ_j ddc_ij (here) - 2 Σ_j ddc_ij z_j (centroid_backward); dz_j: there
template <class T>
ASC_ALWAYS_INLINE void cohesion_backward_row(const HeadData<T>& h, const AscenderConfig& cfg, BackwardWork<T>& w,
                                             int64_t r, const TermSums& sums, double* ds) {
  const Block<T>& b = w.b;
  const int64_t n = w.keys.m, dz = h.dz;
  const bool after = cfg.after_norm();
  const double wcoh = h.sc[kOmegaC] * cfg.omega_scale;
  const T* dSr = w.dS.data() + r * n;
  const T* keep = b.keep_row(r, n);
  const T* dc = b.dc.data() + r * n;
  double dlc = 0, gdc = 0;  // gdc = Σ_j d raw_j dc_j
  const RawGrad<T> rg = standardise_backward<T>(sums.s1, sums.sx[2], after, cfg.omega_scale, wcoh, b.lc[r], b.fc[r],
                                                b.st_c[r], ds[kOmegaC], dlc, gdc);
  const T* wc = b.wc.data() + r * n;
  T* ddcr = w.ddc.data() + r * n;
  const T fac = static_cast<T>(after ? 1.0 : b.lc[r] / h.tau_coh);
  typedef T V __attribute__((vector_size(64)));  // Σ ddc in a register (ascender_terms.h: row_sums)
  constexpr int64_t L = 64 / sizeof(T);
  const RawGradLanes<T> rgv(rg);
  V dv, xv, kv, gj;
  if (!after) dlc -= gdc / h.tau_coh;
  ds[kLambdaC] += dlc * b.gamma_c[r];
  const double dvar = dlc * h.sc[kLambdaC] * b.gamma_c[r] * (1 - b.gamma_c[r]) * (-h.alpha_c);
  w.dW[r] = -dvar * b.var_c[r] / b.W[r];
  const T dvw = static_cast<T>(dvar / b.W[r]);
  T* dwcr = w.dwc.data() + r * n;
  const V dvwv = V{} + dvw, nfac = V{} - fac;
  V vr{}, wv;
  int64_t j1 = 0;
  for (; j1 + L <= n; j1 += L) {
    std::memcpy(&dv, dSr + j1, sizeof(V)), std::memcpy(&xv, dc + j1, sizeof(V));
    std::memcpy(&kv, keep + j1, sizeof(V)), std::memcpy(&wv, wc + j1, sizeof(V));
    rgv.at(dv, xv, kv, gj);
    const V dw = dvwv * xv, x = nfac * gj + dvwv * wv;
    std::memcpy(dwcr + j1, &dw, sizeof(V)), std::memcpy(ddcr + j1, &x, sizeof(V));
    vr += x;
  }
  fold_sum<V, L, L / 2>(vr);
  T rowsum = vr[0];
  for (int64_t j = j1; j < n; ++j) {
    dwcr[j] = dvw * dc[j];
    const T x = -fac * rg.at(dSr[j], dc[j], keep[j]) + dvw * wc[j];
    ddcr[j] = x;
    rowsum += x;
  }
  const T* cr = b.c.data() + r * dz;
  T* dCr = w.dC.data() + r * dz;
  for (int64_t c = 0; c < dz; ++c) dCr[c] = static_cast<T>(2 * cr[c] * rowsum);
}

// The block's cohesion GEMMs, after the row loop: dz_j -= 2 Σ_i ddc_ij c_i;  dc_i -= 2 Σ_j ddc_ij z_j; then through
// c_i = Σ_l w'_il z_l / W_i:  dz_l += Σ_i (w'_il / W_i) dc_i;  dw'_il += dc_i·z_l / W_i (w.tile, which
// distances_backward adds);  dW_i -= dc_i·c_i / W_i
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE void centroid_backward(const HeadData<T>& h, int64_t R, BackwardWork<T>& w, const KeyGrads<T>& kg) {
  const Block<T>& b = w.b;
  const int64_t n = w.keys.m, dz = h.dz;
  T* dCp = w.dC.data();
  w.tmp_nz.assign(n * dz, T(0));
  T* tnz = w.tmp_nz.data();
  gemm<T>(n, dz, R, w.ddc.data(), 1, n, b.c.data(), dz, 1, w.tmp_nz.data(), dz);
  for (int64_t x = 0; x < n * dz; ++x) kg.dz[x] = static_cast<T>(kg.dz[x] - 2 * tnz[x]);
  w.tmp_rz.resize(R * dz);
  T* trz = w.tmp_rz.data();
  gemm_dots<T, kIsa>(R, dz, n, w.ddc.data(), n, w.keys.zT, n, trz, dz);
  for (int64_t x = 0; x < R * dz; ++x) dCp[x] = static_cast<T>(dCp[x] - 2 * trz[x]);
  for (int64_t r = 0; r < R; ++r) {
    double dcc = 0;
    const T* cr = b.c.data() + r * dz;
    const T* dCr = w.dC.data() + r * dz;
    for (int64_t c = 0; c < dz; ++c) dcc += double(dCr[c]) * cr[c];
    w.dW[r] += -dcc / b.W[r];
  }
  for (int64_t r = 0; r < R; ++r) {
    const T inv_w = static_cast<T>(1 / b.W[r]);
    for (int64_t c = 0; c < dz; ++c) trz[r * dz + c] = dCp[r * dz + c] * inv_w;  // dc_i / W_i
  }
  gemm<T>(n, dz, R, b.wc.data(), 1, n, w.tmp_rz.data(), dz, 1, kg.dz, dz, true);
  gemm_narrow<T, kIsa>(R, n, dz, w.tmp_rz.data(), dz, w.keys.zT, n, w.tile.data(), n);  // dc_i · z_l / W_i
}

// ==== the distances' backward =======================================================================================

// The cohesion kernel's dd² (W_i = Σ_kept w'_il:  dw'_il += dW_i;  w' = exp(-d² / τ_coh) on kept keys:
// dd² += -dw' w' / τ_coh; w' = 0 on masked keys, so they get nothing), added to separation's, and d² = |z_i|² + |z_j|²
// - 2 z_i·z_j:  dz_i += 2 z_i Σ_j dd²_ij, dz_j += 2 z_j Σ_i dd²_ij (with cohesion's ddc: the |z|² coefficients zcol,
// applied per key after the head's blocks);  dz_i -= 2 Σ_j dd²_ij z_j;  dz_j -= 2 Σ_i dd²_ij z_i (GEMMs)
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE void distances_backward(const HeadData<T>& h, const AscenderConfig& cfg, int64_t t0, int64_t R,
                                          BackwardWork<T>& w, const KeyGrads<T>& kg, T* dzp) {
  const Block<T>& b = w.b;
  const int64_t n = w.keys.m, dz = h.dz;
  const T inv_tc = static_cast<T>(1 / h.tau_coh);
  T* cs = w.colsum.data();  // Σ_i (ddc_ij + dd²_ij): the |z_j|² coefficient of dz_j, summed over the block's rows
  for (int64_t r = 0; r < R; ++r) {
    T* dd2r = w.dd2.data() + r * n;
    T rowsum = 0;
    if (cfg.use_coh) {
      const T* wc = b.wc.data() + r * n;
      const T* dwcr = w.dwc.data() + r * n;
      const T* tr = w.tile.data() + r * n;
      const T* ddcr = w.ddc.data() + r * n;
      const T dWr = static_cast<T>(w.dW[r]);
      ASC_SIMD_REDUCE(+, rowsum)
      for (int64_t j = 0; j < n; ++j) {
        const T x = dd2r[j] - (dwcr[j] + tr[j] + dWr) * wc[j] * inv_tc;
        dd2r[j] = x;
        rowsum += x;
        cs[j] += x + ddcr[j];
      }
    } else {
      ASC_SIMD_REDUCE(+, rowsum)
      for (int64_t j = 0; j < n; ++j) {
        rowsum += dd2r[j];
        cs[j] += dd2r[j];
      }
    }
    w.zcol[t0 + r] += 2.0 * double(rowsum);
  }
  for (int64_t j = 0; j < n; ++j) kg.zcol[j] += 2.0 * double(cs[j]);
  w.tmp_rz.resize(R * dz);
  T* trz = w.tmp_rz.data();
  gemm_dots<T, kIsa>(R, dz, n, w.dd2.data(), n, w.keys.zT, n, trz, dz);
  for (int64_t x = 0; x < R * dz; ++x) dzp[t0 * dz + x] = static_cast<T>(dzp[t0 * dz + x] - 2 * trz[x]);
  w.tmp_nz.assign(n * dz, T(0));
  T* tnz = w.tmp_nz.data();
  gemm<T>(n, dz, R, w.dd2.data(), 1, n, h.z + t0 * dz, dz, 1, w.tmp_nz.data(), dz);
  for (int64_t x = 0; x < n * dz; ++x) kg.dz[x] = static_cast<T>(kg.dz[x] - 2 * tnz[x]);
}

}  // namespace
}  // namespace asc::cpu

#include "ops/cpu/vec_region_end.h"
