#pragma once
// The data of the CPU kernels of fused ASCender attention (ops/cpu/ascender.cpp): what one (batch, head) reads
// (HeadData), the key columns a block of query rows sees (Keys), the tiles and per-row values of one block (Block),
// one thread's backward scratch (BackwardWork) and where a block's gradients go (HeadGrads, KeyGrads). The per-term
// functions that fill and read them are in ops/cpu/ascender_terms.h and ops/cpu/ascender_latent_terms.h.
//
// Included by ops/cpu/ascender.cpp alone: everything is in an unnamed namespace, so it keeps the internal linkage (and
// the inlining) it had when it lay in that file, and inside the same no-trapping-math / fp-contract region.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "ops/ascender_scalars.h"
#include "ops/cpu/scratch.h"
#include "ops/kernel_types.h"

#include "ops/cpu/vec_region_fma_begin.h"  // the row loops' region, closed by vec_region_end.h at the end

#include "ops/cpu/vec_math.h"

namespace asc::cpu {
namespace {

using namespace ascender;  // Scalar rows of the (9, H) scalars, kConstantRow (ops/ascender_scalars.h)

// Everything one (batch, head) reads: contiguous (T, ·) rows of the heads, derived per-key quantities, scalars.
template <class T>
struct HeadData {
  int64_t T_, d, dz, da;
  const T *q, *kr, *v, *z;
  // Scratch (ops/cpu/scratch.h), as the blocks' tiles: cache-line aligned, so the 64-byte vectors of the row loops and
  // the latent products load whole lines (from std::vector's 16-byte alignment every load spanned two: the latent
  // products took twice their time)
  Scratch<T> qs;              // q / √d (T, d): the base scores' GEMM reads it
  Scratch<T> khat, ehat, zz;  // k̂ (T, d), ê (T, da), |z_j|² (T)
  Scratch<T> zT, ehatT;       // z (dz, T) and ê (da, T) transposed: the B operands of the d_z / d_a products
  std::vector<double> knorm, enorm;
  const bool* mask = nullptr;  // row i of the keep-mask at mask + i * mask_t, stride mask_s
  int64_t mask_t = 0, mask_s = 0;
  const T* bias = nullptr;
  int64_t bias_t = 0, bias_s = 0;
  double sc[kNumScalars];  // this head's ω, λ, δ, κ, τ_score
  int64_t k;               // k_h
  double tau_sep, tau_coh, alpha_a, alpha_c;
};

// x (rows, cols) -> out (cols, rows)
template <class T>
const T* transposed(const T* x, int64_t rows, int64_t cols, Scratch<T>& out) {
  out.resize(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = x[r * cols + c];
  return out.data();
}

// The key columns a block of query rows sees, with their rows of the per-key data. Full attention: every key, read
// in place. A window (cfg.window = w > 0, g global tokens): the block's band [t0 - w + 1, t0 + R - 1 + w) and the keys
// below g, gathered into contiguous rows, so every tile of the block is (R, m) with m <= R + 2w - 2 + g instead of
// (R, n) and a head costs O(n (w + g)); a block that holds a global row (t0 < g) sees every key.
template <class T>
struct Keys {
  int64_t m = 0;
  std::vector<int64_t> cols;  // key j at column position jj is cols[jj], ascending
  bool gathered = false;
  const T *kr = nullptr, *khat = nullptr, *ehat = nullptr, *z = nullptr, *zz = nullptr, *v = nullptr;
  const T *zT = nullptr, *ehatT = nullptr;                 // (dz, m) and (da, m): row stride m
  Scratch<T> kr_, khat_, ehat_, z_, zz_, v_, zT_, ehatT_;  // the gathered rows, aligned as HeadData's

  void select(const HeadData<T>& h, const AscenderConfig& cfg, int64_t t0, int64_t R) {
    const int64_t n = h.T_, w = cfg.window, g = std::min(cfg.global_tokens, n);
    cols.clear();
    if (w > 0 && t0 >= g) {
      const int64_t lo = std::max<int64_t>(0, t0 - w + 1), hi = std::min<int64_t>(n, t0 + R - 1 + w);
      for (int64_t j = 0; j < std::min(g, lo); ++j) cols.push_back(j);
      for (int64_t j = lo; j < hi; ++j) cols.push_back(j);
    }
    gathered = !cols.empty() && static_cast<int64_t>(cols.size()) < n;
    if (!gathered) {
      cols.resize(n);
      std::iota(cols.begin(), cols.end(), int64_t(0));
      m = n, kr = h.kr, khat = h.khat.data(), ehat = h.ehat.data(), z = h.z, zz = h.zz.data(), v = h.v;
      zT = h.zT.data(), ehatT = h.ehatT.data();
      return;
    }
    m = static_cast<int64_t>(cols.size());
    auto gather = [&](const T* src, int64_t width, Scratch<T>& dst) {
      dst.resize(m * width);
      for (int64_t jj = 0; jj < m; ++jj) std::copy_n(src + cols[jj] * width, width, dst.data() + jj * width);
      return dst.data();
    };
    kr = gather(h.kr, h.d, kr_), khat = gather(h.khat.data(), h.d, khat_), v = gather(h.v, h.d, v_);
    ehat = gather(h.ehat.data(), h.da, ehat_), z = gather(h.z, h.dz, z_), zz = gather(h.zz.data(), 1, zz_);
    zT = transposed(z, m, h.dz, zT_), ehatT = transposed(ehat, m, h.da, ehatT_);
  }
  // Adds a (m, width) gradient of the gathered rows into the head's (n, width) one (nothing to do when in place).
  template <class G>
  void scatter_add(const G* local, int64_t width, G* global) const {
    for (int64_t jj = 0; jj < m; ++jj)
      for (int64_t c = 0; c < width; ++c) global[cols[jj] * width + c] += local[jj * width + c];
  }
};

// Row statistics of one normalised term. A raw term is a tile x times a per-row factor f (raw = f x: the gates,
// λ's and signs that multiply a row), so the tile is stored once and the statistics are those of f x:
// β̃_j = (f x_j - μ) / s on kept j, 0 on constant rows.
struct NormStats {
  double mu = 0, sd = 0, s = 1, count = 0;
  bool constant = true;
};

// The (rows, keys) tiles and per-row values of one block of query rows; the backward reads them. The raw terms are
// kept as tiles without their row factors: alignment r (raw = f_a r), separation φ = w [a - δ]_+ (raw = f_s φ),
// cohesion dc = |z_j - c_i|² (raw = f_c dc); A holds the softmax numerators e = exp(S/τ - max), normalised by inv_z
// where they are used (the rows of y = e V, and the backward).
template <class T>
struct Block {
  Scratch<T> s0, aff, zdot, r, ws, wc, phi, dc, S, A, u, c;
  Scratch<T> keep;  // 1 where row i attends to key column j, else 0: a float mask, so the masked passes vectorise
  Scratch<T> ones;  // without a mask or a window every row of the mask is this row of ones (no tile is written)
  Scratch<T> col;   // the key column positions 0, 1, ..., as T (latent_kernels_forward's self test)
  bool all_kept = false;
  std::vector<std::vector<int64_t>> nbr;  // N(i) as column positions
  std::vector<char> nan_nbr;              // a NaN among row i's candidates: N(i) is undefined, u_i is NaN
  std::vector<int64_t> self;              // the column position of key i (-1: not among the columns)
  std::vector<double> snorm, cnt, kbar2, gamma_a, rho, eta, W, var_c, gamma_c, la, ls, lc;  // la = λγ_a etc.
  std::vector<double> fa, fs, fc;   // the raw terms' row factors
  std::vector<double> kept;         // the number of kept keys of each row
  std::vector<double> smax, inv_z;  // the softmax's row max (of S/τ) and 1 / Σ e (0: no kept key)
  std::vector<NormStats> st_a, st_s, st_c;
  Scratch<double> s;  // Σ_{l∈N(i)} k̂_l (R, d)

  // Row r of the keep mask (n keys).
  ASC_ALWAYS_INLINE const T* keep_row(int64_t r, int64_t n) const {
    return all_kept ? ones.data() : keep.data() + r * n;
  }

  void resize(int64_t rows, int64_t keys, int64_t d, int64_t dz) {
    const int64_t R = rows, n = keys;
    // Every tile is written in full before it is read (GEMM outputs, row loops over all columns): no zero fill.
    for (auto* t : {&s0, &aff, &zdot, &r, &ws, &wc, &phi, &dc, &S, &A}) t->resize(R * n);  // keep: keep_masks
    u.resize(R * d);
    c.resize(R * dz);
    s.resize(R * d);  // written by alignment_forward
    nbr.resize(R);
    nan_nbr.assign(R, 0);
    self.assign(R, -1);
    for (auto* v : {&snorm, &cnt, &kbar2, &gamma_a, &rho, &eta, &W, &var_c, &gamma_c, &la, &ls, &lc, &fa, &fs, &fc,
                    &kept, &smax, &inv_z})
      v->assign(R, 0.0);
    st_a.assign(R, {}), st_s.assign(R, {}), st_c.assign(R, {});
  }
};

// Where one head's gradients go: dy (T, d) in, dq / dk_rot / dv (T, d) and dz (T, d_z) accumulated, the scalars' in ds.
template <class T>
struct HeadGrads {
  const T* gy;
  T *dq, *dkr, *dv, *dz;
  double* ds;
};

// Where a block's key gradients go: the head's rows themselves for full attention, else (m, ·) buffers that
// BackwardWork::scatter adds into the head's after the block. dks: the neighbour sums' part of dk̂ (float64);
// zcol: the coefficient of z_j in dz_j (from every |·|² term).
template <class T>
struct KeyGrads {
  T *dv, *dkr, *dkhat, *dehat, *dz;
  double *dks, *zcol;
};

// One thread's scratch for the backward, and the per-key accumulators of the head it is working on.
template <class T>
struct BackwardWork {
  Block<T> b;
  Keys<T> keys;
  Scratch<T> dA, dS, dr, dwc, ddc, dd2, daff, tile, du, dC, tmp_rz, tmp_nz;
  Scratch<T> colsum;
  Scratch<T> dv_l, dkr_l, dkhat_l, dehat_l, dz_l;  // a gathered block's key gradients, (m, ·)
  Scratch<double> dks_l, zcol_l;
  Scratch<T> gys;  // the block's rows of dy / Σ e (R, d)
  Scratch<double> dW, dsv;
  // The head's per-key accumulators: k̂ and ê gradients (GEMM-accumulated, plus the neighbour scatter), and the
  // coefficient of z_j in dz_j (from every |·|² term).
  Scratch<T> dkhat, dehat;
  Scratch<double> dkhat_scatter, zcol;

  // The key gradients of the block whose keys are `keys`: in place, or zeroed (m, ·) buffers when gathered.
  ASC_ALWAYS_INLINE KeyGrads<T> key_grads(const HeadGrads<T>& out, int64_t d, int64_t da, int64_t dz) {
    if (!keys.gathered) return {out.dv, out.dkr, dkhat.data(), dehat.data(), out.dz, dkhat_scatter.data(), zcol.data()};
    const int64_t n = keys.m;
    for (auto [buf, width] : {std::pair{&dv_l, d}, {&dkr_l, d}, {&dkhat_l, d}, {&dehat_l, da}, {&dz_l, dz}})
      buf->assign(n * width, T(0));
    dks_l.assign(n * d, 0.0), zcol_l.assign(n, 0.0);
    return {dv_l.data(), dkr_l.data(), dkhat_l.data(), dehat_l.data(), dz_l.data(), dks_l.data(), zcol_l.data()};
  }
  // Adds a gathered block's key gradients into the head's.
  ASC_ALWAYS_INLINE void scatter(const KeyGrads<T>& kg, const HeadGrads<T>& out, int64_t d, int64_t da, int64_t dz) {
    if (!keys.gathered) return;
    keys.scatter_add(kg.dv, d, out.dv), keys.scatter_add(kg.dkr, d, out.dkr);
    keys.scatter_add(kg.dkhat, d, dkhat.data()), keys.scatter_add(kg.dehat, da, dehat.data());
    keys.scatter_add(kg.dz, dz, out.dz);
    keys.scatter_add(kg.dks, d, dkhat_scatter.data()), keys.scatter_add(kg.zcol, 1, zcol.data());
  }
};

}  // namespace
}  // namespace asc::cpu

#include "ops/cpu/vec_region_end.h"
