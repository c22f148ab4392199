// CPU kernels of fused ASCender attention (ops/ascender.h, docs/ascender.md). Per (batch, head) and block of
// query rows, every (rows, keys) quantity of the reference — base scores, affinities, distances, neighbourhoods,
// kernels, the three raw biases, scores and probabilities — lives in a tile of this thread's workspace; the large
// products are GEMMs (ops/cpu/gemm.h); those with a short side — the (rows, keys) products over the latent widths
// d_z, d_a and the (rows, d_z) ones over the keys — run in a register-blocked kernel (ops/cpu/small_gemm.h). Nothing
// of size (B, H, T, T) is ever allocated. The keys of a block are all T keys, or in windowed mode only the block's
// window, gathered (Keys, below): O(T·w) per head. The normalised terms β̃ are never stored: each row keeps its μ
// and σ, and β̃ is formed where it is read.
//
// The backward rebuilds each block's tiles from the per-row state the forward kept (RowState: neighbourhoods, the
// terms' means and stds, the centroid, the softmax max and sum) and then runs the chain rule back through them, in
// the reverse order of the forward (the derivation is written beside each step). Gradients of a key j
// collect contributions from every query row, so one task owns one (batch, head) and walks its row blocks in turn;
// gradients of the per-head scalars are summed per task and reduced after the parallel loop.
//
// Loops over a row are written to vectorise: the keep-mask is a float tile, selects read both operands first, and
// nothing from std:: is called inside the no-trapping-math region (such calls do not inline there).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/format.h"
#include "ops/ascender_scalars.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/scratch.h"
#include "ops/kernels.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
// see ops/cpu/vec_math.h: no-trapping-math lets the masked row loops vectorise; fp-contract lets the x86-64-v3 clones
// fuse a * b + c into one FMA (one rounding instead of two; the tests' tolerances hold either way)
#pragma GCC optimize("no-trapping-math", "fp-contract=fast")
#endif

#include "ops/cpu/small_gemm.h"
#include "ops/cpu/vec_math.h"

namespace asc::cpu {
namespace {

// Query rows per block when the config leaves it to the kernel: about 64K elements per (rows, keys) tile (256 KiB in
// float32), between 16 and 128 rows. Larger blocks make the GEMMs more efficient until the block's tiles spill from
// the cache. Measured on the 2-core CI machine (float32, forward + backward): at n = 512, 128 rows beat 64 by ~4% and
// 256 by ~12%; at n = 2048, 32 rows beat 128 by ~25%. In windowed mode a block's keys number about R + 2w + g whatever
// n is, so every extra row widens every row's band: at most 64 rows there.
int64_t row_block(const AscenderKernelConfig& cfg, int64_t n) {
  if (cfg.row_block > 0) return cfg.row_block;
  const int64_t keys = cfg.window > 0 ? std::min(n, 2 * cfg.window + cfg.global_tokens) : n;
  return std::clamp<int64_t>(65536 / std::max<int64_t>(keys, 1), 16, cfg.window > 0 ? 64 : 128);
}
using namespace ascender;  // Scalar rows of the (9, H) scalars, kConstantRow (ops/ascender_scalars.h)

using math::sigmoid;  // ops/math.h: the stable logistic both backends use

// Everything one (batch, head) reads: contiguous (T, ·) rows of the heads, derived per-key quantities, scalars.
template <class T>
struct HeadData {
  int64_t T_, d, dz, da;
  const T *q, *kr, *v, *z;
  std::vector<T> qs;              // q / √d (T, d): the base scores' GEMM reads it
  std::vector<T> khat, ehat, zz;  // k̂ (T, d), ê (T, da), |z_j|² (T)
  std::vector<T> zT, ehatT;       // z (dz, T) and ê (da, T) transposed: the B operands of the d_z / d_a products
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
const T* transposed(const T* x, int64_t rows, int64_t cols, std::vector<T>& out) {
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
  const T *zT = nullptr, *ehatT = nullptr;  // (dz, m) and (da, m): row stride m
  std::vector<T> kr_, khat_, ehat_, z_, zz_, v_, zT_, ehatT_;

  void select(const HeadData<T>& h, const AscenderKernelConfig& cfg, int64_t t0, int64_t R) {
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
    auto gather = [&](const T* src, int64_t width, std::vector<T>& dst) {
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

template <class T>
void unit_rows(const T* x, int64_t rows, int64_t cols, double eps, std::vector<T>& out, std::vector<double>& norm) {
  out.resize(rows * cols);
  norm.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t c = 0; c < cols; ++c) s += double(x[r * cols + c]) * x[r * cols + c];
    norm[r] = std::sqrt(s);
    const double inv = 1 / std::max(norm[r], eps);
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = static_cast<T>(x[r * cols + c] * inv);
  }
}

// normalize_rows backward: y = x / max(|x|, eps) -> dx = (dy - y (y·dy)) / |x|, or dy / eps below eps.
template <class T>
void unit_rows_backward(const std::vector<T>& y, const std::vector<double>& norm, const std::vector<double>& dy,
                        int64_t rows, int64_t cols, double eps, T* dx) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* yr = y.data() + r * cols;
    const double* g = dy.data() + r * cols;
    if (norm[r] < eps) {
      for (int64_t c = 0; c < cols; ++c) dx[r * cols + c] = static_cast<T>(g[c] / eps);
      continue;
    }
    double dot = 0;
    for (int64_t c = 0; c < cols; ++c) dot += yr[c] * g[c];
    for (int64_t c = 0; c < cols; ++c) dx[r * cols + c] = static_cast<T>((g[c] - yr[c] * dot) / norm[r]);
  }
}

// Row statistics of one normalised term. A raw term is a tile x times a per-row factor f (raw = f x: the gates,
// λ's and signs that multiply a row), so the tile is stored once and the statistics are those of f x:
// β̃_j = (f x_j - μ) / s on kept j, 0 on constant rows.
struct NormStats {
  double mu = 0, sd = 0, s = 1, count = 0;
  bool constant = true;
};

// |a - b|² = |a|² + |b|² - 2 a·b from the two squared norms and the dot product (a GEMM's output), with the rounding
// that can take it below 0 clamped: the separation / cohesion kernels' distances and the cohesion term dc.
template <class T>
ASC_ALWAYS_INLINE T sq_dist(T a2, T b2, T ab) {
  const T v = a2 + b2 - 2 * ab;
  return v < T(0) ? T(0) : v;  // written so that a NaN stays NaN (NaN < 0 is false)
}

// The first pass of a term's statistics over a row of x: the sum, count and largest |x| over kept j. Producers fold it
// into the loop that writes x (the separation and cohesion passes); row_sums is the stand-alone pass.
template <class T>
struct RowSums {
  T sum = 0, count = 0, big = 0;
};
template <class T>
ASC_ALWAYS_INLINE RowSums<T> row_sums(const T* x, const T* keep, int64_t n) {
  T big = 0, sum = 0, count = 0;
  ASC_SIMD_REDUCE3(+, sum, count, max, big)
  for (int64_t j = 0; j < n; ++j) {
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
  T var = 0;
  ASC_SIMD_REDUCE(+, var)
  for (int64_t j = 0; j < n; ++j) {
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
// so a row needs only Σ dS and Σ dS rc (term_backward's one pass) and each term's loop forms d raw_j where it reads
// it: d raw is never stored.
template <class T>
struct RawGrad {
  T p = 0, a = 0, q = 0, f = 0, mu = 0;  // all 0 on a constant row: d raw = 0
  ASC_ALWAYS_INLINE T at(T dS, T x, T keep) const {
    const T v = p * dS - a - q * (f * x - mu);
    return keep != T(0) ? v : T(0);
  }
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
  bool all_kept = false;
  std::vector<std::vector<int64_t>> nbr;  // N(i) as column positions
  std::vector<char> nan_nbr;              // a NaN among row i's candidates: N(i) is undefined, u_i is NaN
  std::vector<int64_t> self;              // the column position of key i (-1: not among the columns)
  std::vector<double> snorm, cnt, kbar2, gamma_a, rho, eta, W, var_c, gamma_c, la, ls, lc;  // la = λγ_a etc.
  std::vector<double> fa, fs, fc;   // the raw terms' row factors
  std::vector<double> kept;         // the number of kept keys of each row
  std::vector<double> smax, inv_z;  // the softmax's row max (of S/τ) and 1 / Σ e (0: no kept key)
  std::vector<NormStats> st_a, st_s, st_c;
  std::vector<double> s;  // Σ_{l∈N(i)} k̂_l (R, d)

  // Row r of the keep mask (n keys).
  ASC_ALWAYS_INLINE const T* keep_row(int64_t r, int64_t n) const {
    return all_kept ? ones.data() : keep.data() + r * n;
  }

  void resize(int64_t rows, int64_t keys, int64_t d, int64_t dz) {
    const int64_t R = rows, n = keys;
    // Every tile is written in full before it is read (GEMM outputs, row loops over all columns): no zero fill.
    for (auto* t : {&s0, &aff, &zdot, &r, &ws, &wc, &phi, &dc, &S, &A}) t->resize(R * n);  // keep: forward_block
    u.resize(R * d);
    c.resize(R * dz);
    s.resize(R * d);  // written by forward_block
    nbr.resize(R);
    nan_nbr.assign(R, 0);
    self.assign(R, -1);
    for (auto* v : {&snorm, &cnt, &kbar2, &gamma_a, &rho, &eta, &W, &var_c, &gamma_c, &la, &ls, &lc, &fa, &fs, &fc,
                    &kept, &smax, &inv_z})
      v->assign(R, 0.0);
    st_a.assign(R, {}), st_s.assign(R, {}), st_c.assign(R, {});
  }
};

// What the forward keeps per query row for the backward, flash-attention style: the values that need passes of their
// own — N(i), each term's μ and σ, the cohesion centroid c_i, the softmax max and 1 / sum — O(T (k + d_z)) per head
// instead of the O(T²) tiles. With them the backward rebuilds a block's tiles without the top-k, the variance passes,
// the centroid product or the softmax reductions. Layout: rows (B, H, T, kFields + d_z) float64, nbr (B, H, T, k_max)
// int64 (column index, -1 past |N(i)|; kNanNbr in the first slot: a NaN among the row's candidates).
struct RowState {
  static constexpr int64_t kFields = 14;  // 3 × (μ, σ, count, constant), smax, inv_z; then c_i
  static constexpr int64_t kNanNbr = -2;
  static void put(const NormStats& st, double* p) { p[0] = st.mu, p[1] = st.sd, p[2] = st.count, p[3] = st.constant; }
  static NormStats get(const double* p, double eps) { return {p[0], p[1], p[1] + eps, p[2], p[3] != 0}; }
  template <class T>
  static void save(const Block<T>& b, int64_t R, int64_t dz, int64_t kmax, double* rows, int64_t* nbr) {
    for (int64_t r = 0; r < R; ++r) {
      double* p = rows + r * (kFields + dz);
      put(b.st_a[r], p), put(b.st_s[r], p + 4), put(b.st_c[r], p + 8);
      p[12] = b.smax[r], p[13] = b.inv_z[r];
      for (int64_t c = 0; c < dz; ++c) p[kFields + c] = b.c[r * dz + c];
      int64_t* q = nbr + r * kmax;
      std::fill(q, q + kmax, -1);
      for (size_t l = 0; l < b.nbr[r].size(); ++l) q[l] = b.nbr[r][l];
      if (b.nan_nbr[r]) q[0] = kNanNbr;
    }
  }
  template <class T>
  static void load(Block<T>& b, int64_t R, int64_t dz, int64_t kmax, const double* rows, const int64_t* nbr,
                   double eps) {
    for (int64_t r = 0; r < R; ++r) {
      const double* p = rows + r * (kFields + dz);
      b.st_a[r] = get(p, eps), b.st_s[r] = get(p + 4, eps), b.st_c[r] = get(p + 8, eps);
      b.smax[r] = p[12], b.inv_z[r] = p[13];
      for (int64_t c = 0; c < dz; ++c) b.c[r * dz + c] = static_cast<T>(p[kFields + c]);
      const int64_t* q = nbr + r * kmax;
      b.nbr[r].clear();
      b.nan_nbr[r] = q[0] == kNanNbr;
      for (int64_t l = 0; l < kmax && q[l] >= 0; ++l) b.nbr[r].push_back(q[l]);
    }
  }
};

// The forward of rows [t0, t0 + R) of one head into `b` (sized by the caller). replay = false: the forward proper,
// computing every row statistic. replay = true: the backward rebuilding the block's tiles, with the values of
// RowState already loaded into `b`; the passes that write tiles still run, and recompute their by-products (ρ, W,
// Var) exactly as the forward did.
template <class T>
ASC_CPU_CLONES void forward_block(const HeadData<T>& h, const Keys<T>& kt, const AscenderKernelConfig& cfg, int64_t t0,
                                  int64_t R, Block<T>& b, bool replay) {
  const int64_t n = kt.m, d = h.d, dz = h.dz, da = h.da;  // n: the block's key columns
  const bool after = cfg.after_norm;
  // Base scores (q pre-scaled by 1/√d; a GEMM), affinities and latent products (gemm_narrow) over the block's rows.
  // (Affinities are read by the separation hinge and, unless selecting by scores, the top-k; z_i · z_j by the
  // separation and cohesion kernels, which form |z_i - z_j|² from it in their own pass.)
  gemm<T>(R, n, d, h.qs.data() + t0 * d, d, 1, kt.kr, 1, d, b.s0.data(), n);
  const bool sep = cfg.use_sep, coh = cfg.use_coh;
  if (sep || (cfg.use_align && !cfg.select_by_scores))
    gemm_narrow<T>(R, n, da, h.ehat.data() + t0 * da, da, kt.ehatT, n, b.aff.data(), n);
  if (sep || coh) gemm_narrow<T>(R, n, dz, h.z + t0 * dz, dz, kt.zT, n, b.zdot.data(), n);  // z_i · z_j
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
      if (w <= 0) {
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
    const auto at = std::lower_bound(kt.cols.begin(), kt.cols.end(), i);
    b.self[r] = at != kt.cols.end() && *at == i ? at - kt.cols.begin() : -1;
  }
  // ---- alignment (§3): neighbourhoods, headings, gates, r = u_i · k̂_j --------------------------------------------
  if (cfg.use_align) {
    if (!replay) {
      // N(i) per row, from the row's entries x_j = (by_j on selectable keys, else -inf):
      //  1. group maxima over j mod G (G = 2k rounded up to 8): vertical maxima, no horizontal reductions;
      //  2. a lower bound lo: the k-th largest group max (a rank count over the G maxima) — k groups reach it, so k
      //     entries do, and every entry of N(i) is >= lo (on random rows about 1.3 k entries pass);
      //  3. the entries >= lo, gathered in index order by a branch-free pass, go into a sorted list of k: an entry
      //     enters only if it beats the current k-th (ties keep the lower index, as topk).
      const int64_t K = h.k, G = (2 * K + 7) / 8 * 8;
      // Plain arrays through raw pointers in the row loop: std:: members do not inline in this region.
      std::vector<T> topv(K), cand(n), gmax_v(G), reach_v(G);
      std::vector<int64_t> topi(K), cidx_v(n + 1);
      const T ninf = -std::numeric_limits<T>::infinity();
      T *cd = cand.data(), *gmax = gmax_v.data(), *reach = reach_v.data(), *tv = topv.data();
      int64_t *ti = topi.data(), *cidx = cidx_v.data();
      for (int64_t r = 0; r < R; ++r) {
        const T* by = (cfg.select_by_scores ? b.s0.data() : b.aff.data()) + r * n;
        const T* keep = b.keep_row(r, n);
        T nans = 0;  // NaN candidates: the comparisons below would pass them over silently
        ASC_SIMD_REDUCE(+, nans)
        for (int64_t j = 0; j < n; ++j) {
          const T x = by[j];
          const T c = keep[j] != T(0) ? x : ninf;
          cd[j] = c;
          nans += c != c ? T(1) : T(0);
        }
        if (!cfg.include_self && b.self[r] >= 0) {
          if (cd[b.self[r]] != cd[b.self[r]]) nans -= T(1);
          cd[b.self[r]] = ninf;
        }
        if (nans > T(0)) {  // N(i) is undefined: u_i becomes NaN below (docs §13)
          b.nbr[r].clear();
          b.nan_nbr[r] = 1;
          continue;
        }
        for (int64_t g = 0; g < G; ++g) gmax[g] = ninf;
        for (int64_t j0 = 0; j0 < n; j0 += G) {
          const T* x = cd + j0;
          const int64_t len = n - j0 < G ? n - j0 : G;
          ASC_SIMD
          for (int64_t g = 0; g < len; ++g) gmax[g] = gmax[g] > x[g] ? gmax[g] : x[g];  // a NaN entry can only lower it
        }
        // reach[g]: the number of groups whose max is >= gmax[g] (accumulated down the columns: no reductions)
        for (int64_t g = 0; g < G; ++g) reach[g] = 0;
        for (int64_t q = 0; q < G; ++q) {
          const T u = gmax[q];
          ASC_SIMD
          for (int64_t g = 0; g < G; ++g) reach[g] += u >= gmax[g] ? T(1) : T(0);
        }
        T lo = ninf;
        const T kT = static_cast<T>(K);
        ASC_SIMD_REDUCE(max, lo)
        for (int64_t g = 0; g < G; ++g) {
          const T v = reach[g] >= kT ? gmax[g] : ninf;
          lo = lo > v ? lo : v;
        }
        T thr = lo == ninf ? ninf : std::nextafter(lo, ninf);  // x > thr: x >= lo, and never an unselectable -inf
        int64_t nc = 0;
        for (int64_t j = 0; j < n; ++j) cidx[nc] = j, nc += cd[j] > thr ? 1 : 0;
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
    for (int64_t r = 0; r < R; ++r) {
      // s_i = Σ_{l∈N(i)} k̂_l, summed in T in u's row (k unit vectors: float loses nothing that matters here)
      double* s = b.s.data() + r * d;
      T* ur = b.u.data() + r * d;
      const int64_t* nb = b.nbr[r].data();
      const int64_t cnt = static_cast<int64_t>(b.nbr[r].size());
      for (int64_t c = 0; c < d; ++c) ur[c] = T(0);
      for (int64_t x = 0; x < cnt; ++x) {
        const T* kl = kt.khat + nb[x] * d;
        for (int64_t c = 0; c < d; ++c) ur[c] += kl[c];
      }
      if (b.nan_nbr[r])
        for (int64_t c = 0; c < d; ++c) ur[c] = std::numeric_limits<T>::quiet_NaN();
      double s2 = 0;
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
  // ---- separation (§4) and the cohesion kernel (§5), one pass over d² = |z_i|² + |z_j|² - 2 z_i·z_j (rounding below
  // 0 clamped): w = exp(-d²/τ_sep), ρ, φ = w [a - δ]_+; w' = exp(-d²/τ_coh) on kept keys, W = Σ w'
  // ---------------------
  if (sep || coh) {
    const T inv_ts = static_cast<T>(1 / h.tau_sep), inv_tc = static_cast<T>(1 / h.tau_coh);
    const T delta = static_cast<T>(h.sc[kDelta]), ninf = -std::numeric_limits<T>::infinity();
    const T* zzk = kt.zz;
    for (int64_t r = 0; r < R; ++r) {
      const T* zij = b.zdot.data() + r * n;
      const T zi = h.zz[t0 + r];
      const T* aff = b.aff.data() + r * n;
      const T* keep = b.keep_row(r, n);
      T *ws = b.ws.data() + r * n, *phi = b.phi.data() + r * n, *wc = b.wc.data() + r * n;
      // One pass over key columns [j0, j1), adding to the row's sums. ρ_i sums over l ≠ i: the self column gets a pass
      // of its own whose ρ is dropped, rather than subtracting w_ii = 1 from the total afterwards — for an isolated
      // token (ρ_i << 1) that difference would keep no relative precision.
      auto pass = [&](int64_t j0, int64_t j1, T & rho_o, T & W_o, T & psum_o, T & pbig_o)
          __attribute__((always_inline)) {
        T rho = 0, W = 0, psum = 0, pbig = 0;  // φ's first statistics pass rides along (φ >= 0: |φ| = φ)
        if (sep && coh) {
          ASC_SIMD_SUMS_MAX(pbig, rho, W, psum)
          for (int64_t j = j0; j < j1; ++j) {
            const T dj = sq_dist(zi, zzk[j], zij[j]), kj = keep[j], hinge = aff[j] - delta;
            const T w = exp_nonpos(-dj * inv_ts);
            ws[j] = w;
            const T ph = w * (hinge <= T(0) ? T(0) : hinge);  // [a - δ]_+, a NaN stays NaN
            phi[j] = ph;
            const T kph = kj != T(0) ? ph : T(0);
            rho += kj != T(0) ? w : T(0);
            psum += kph;
            pbig = pbig > kph ? pbig : kph;
            const T wcj = exp_nonpos(kj != T(0) ? -dj * inv_tc : ninf);  // 0 on masked keys
            wc[j] = wcj;
            W += wcj;
          }
        } else if (sep) {
          ASC_SIMD_SUMS_MAX(pbig, rho, psum)
          for (int64_t j = j0; j < j1; ++j) {
            const T dj = sq_dist(zi, zzk[j], zij[j]), kj = keep[j], hinge = aff[j] - delta;
            const T w = exp_nonpos(-dj * inv_ts);
            ws[j] = w;
            const T ph = w * (hinge <= T(0) ? T(0) : hinge);
            phi[j] = ph;
            const T kph = kj != T(0) ? ph : T(0);
            rho += kj != T(0) ? w : T(0);
            psum += kph;
            pbig = pbig > kph ? pbig : kph;
          }
        } else {
          ASC_SIMD_REDUCE(+, W)
          for (int64_t j = j0; j < j1; ++j) {
            const T wcj = exp_nonpos(keep[j] != T(0) ? -sq_dist(zi, zzk[j], zij[j]) * inv_tc : ninf);
            wc[j] = wcj;
            W += wcj;
          }
        }
        rho_o += rho, W_o += W, psum_o += psum;
        pbig_o = pbig_o > pbig ? pbig_o : pbig;
      };
      T rho = 0, W = 0, psum = 0, pbig = 0;
      const int64_t self = b.self[r];
      if (sep && self >= 0 && keep[self] != T(0)) {
        T self_rho = 0;  // w_ii: not part of ρ_i
        pass(0, self, rho, W, psum, pbig);
        pass(self, self + 1, self_rho, W, psum, pbig);
        pass(self + 1, n, rho, W, psum, pbig);
      } else {
        pass(0, n, rho, W, psum, pbig);
      }
      if (sep) {
        b.rho[r] = rho;
        const double ratio = b.rho[r] / h.sc[kKappa];
        b.eta[r] = ratio >= 1 ? 1.0 : ratio;  // min(1, ρ/κ), a NaN stays NaN (std::min would return 1)
        b.ls[r] = h.sc[kLambdaS] * b.eta[r];
        b.fs[r] = after ? -1.0 : -b.ls[r];  // raw = -λη φ (before_norm) or -φ
        if (!replay)
          b.st_s[r] =
              term_stats(phi, keep, n, RowSums<T>{psum, static_cast<T>(b.kept[r]), pbig}, b.fs[r], cfg.norm_eps);
      }
      if (coh) b.W[r] = std::max(double(W), 1e-30);
    }
  }
  // ---- cohesion (§5): centroid c_i, dc = |z_j - c_i|², variance, gate ----------------------------------------------
  if (coh) {
    if (!replay) {
      gemm_narrow<T>(R, dz, n, b.wc.data(), n, kt.z, dz, b.c.data(), dz);  // Σ_l w'_il z_l
      for (int64_t r = 0; r < R; ++r) {
        T* cr = b.c.data() + r * dz;
        const double W = b.W[r];
        for (int64_t c = 0; c < dz; ++c) cr[c] = static_cast<T>(cr[c] / W);
      }
    }
    gemm_narrow<T>(R, n, dz, b.c.data(), dz, kt.zT, n, b.dc.data(), n);  // c_i · z_j
    for (int64_t r = 0; r < R; ++r) {
      double cc = 0;
      const T* cr = b.c.data() + r * dz;
      for (int64_t c = 0; c < dz; ++c) cc += double(cr[c]) * cr[c];
      T* dc = b.dc.data() + r * n;
      const T* wc = b.wc.data() + r * n;
      const T* keep = b.keep_row(r, n);
      const T ccT = static_cast<T>(cc);
      const T* zz = kt.zz;
      T var = 0, sum = 0, big = 0;  // dc's first statistics pass rides along (dc >= 0: |dc| = dc)
      ASC_SIMD_REDUCE3(+, var, sum, max, big)
      for (int64_t j = 0; j < n; ++j) {
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
  // ---- scores and softmax numerators (§6) --------------------------------------------------------------------------
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

// Builds a head's data for (b, h) from the op's contiguous inputs.
template <class T>
HeadData<T> head_data(const AscenderKernelInputs& in, const AscenderKernelConfig& cfg, int64_t b, int64_t hh) {
  HeadData<T> h;
  const int64_t H = in.q.size(1), Tn = in.q.size(2);
  h.T_ = Tn, h.d = in.q.size(3), h.dz = in.z.size(3), h.da = in.e.size(3);
  const int64_t bh = b * H + hh;
  h.q = in.q.data_ptr<T>() + bh * Tn * h.d;
  h.qs.resize(Tn * h.d);
  const T inv_sqrt_d = static_cast<T>(1 / std::sqrt(double(h.d)));
  for (int64_t x = 0; x < Tn * h.d; ++x) h.qs[x] = h.q[x] * inv_sqrt_d;
  h.kr = in.k_rot.data_ptr<T>() + bh * Tn * h.d;
  h.v = in.v.data_ptr<T>() + bh * Tn * h.d;
  h.z = in.z.data_ptr<T>() + bh * Tn * h.dz;
  unit_rows(in.k.data_ptr<T>() + bh * Tn * h.d, Tn, h.d, 1e-12, h.khat, h.knorm);
  unit_rows(in.e.data_ptr<T>() + bh * Tn * h.da, Tn, h.da, 1e-8, h.ehat, h.enorm);
  transposed(h.z, Tn, h.dz, h.zT), transposed(h.ehat.data(), Tn, h.da, h.ehatT);
  h.zz.resize(Tn);
  for (int64_t j = 0; j < Tn; ++j) {
    double s = 0;
    for (int64_t c = 0; c < h.dz; ++c) s += double(h.z[j * h.dz + c]) * h.z[j * h.dz + c];
    h.zz[j] = static_cast<T>(s);
  }
  if (in.keep.defined()) {
    h.mask = in.keep.data_ptr<bool>() + b * in.keep.stride(0) + hh * in.keep.stride(1);
    h.mask_t = in.keep.stride(2), h.mask_s = in.keep.stride(3);
  }
  if (in.bias.defined()) {
    h.bias = in.bias.data_ptr<T>() + b * in.bias.stride(0) + hh * in.bias.stride(1);
    h.bias_t = in.bias.stride(2), h.bias_s = in.bias.stride(3);
  }
  const T* sc = in.scalars.data_ptr<T>();
  for (int s = 0; s < kNumScalars; ++s) h.sc[s] = sc[s * H + hh];
  h.k = cfg.k[hh], h.tau_sep = cfg.tau_sep[hh], h.tau_coh = cfg.tau_coh[hh];
  h.alpha_a = cfg.alpha_align[hh], h.alpha_c = cfg.alpha_coh[hh];
  return h;
}

int64_t max_k(const AscenderKernelConfig& cfg) {
  int64_t k = 1;
  for (int64_t x : cfg.k) k = std::max(k, x);
  return k;
}

template <class T>
void forward_impl(const AscenderKernelInputs& in, const AscenderKernelConfig& cfg, Tensor& y,
                  AscenderKernelState* state) {
  const int64_t B = in.q.size(0), H = in.q.size(1), Tn = in.q.size(2), d = in.q.size(3), dz = in.z.size(3);
  y = Tensor::empty({B, H, Tn, d}, in.q.options());
  T* yp = y.data_ptr<T>();
  const int64_t kmax = max_k(cfg);
  double* rows_p = nullptr;
  int64_t* nbr_p = nullptr;
  if (state) {
    state->rows = Tensor::empty({B, H, Tn, RowState::kFields + dz}, {kFloat64, in.q.device(), false});
    state->nbr = Tensor::empty({B, H, Tn, kmax}, {kInt64, in.q.device(), false});
    rows_p = state->rows.data_ptr<double>(), nbr_p = state->nbr.data_ptr<int64_t>();
  }
  const int64_t rows = row_block(cfg, Tn);
  const int64_t blocks = (Tn + rows - 1) / rows;
  parallel_for(B * H, Tn * Tn * (d + dz) * 8, [&](int64_t i0, int64_t i1) {
    Block<T> blk;
    Keys<T> keys;
    for (int64_t bh = i0; bh < i1; ++bh) {
      const HeadData<T> h = head_data<T>(in, cfg, bh / H, bh % H);
      for (int64_t bi = 0; bi < blocks; ++bi) {
        const int64_t t0 = bi * rows, R = std::min(rows, Tn - t0);
        keys.select(h, cfg, t0, R);
        blk.resize(R, keys.m, d, dz);
        forward_block(h, keys, cfg, t0, R, blk, false);
        T* yb = yp + (bh * Tn + t0) * d;
        gemm<T>(R, d, keys.m, blk.A.data(), keys.m, 1, keys.v, d, 1, yb, d);  // y = e V, then rows / Σ e
        for (int64_t r = 0; r < R; ++r) {
          const double iz = blk.inv_z[r];
          for (int64_t c = 0; c < d; ++c) yb[r * d + c] = static_cast<T>(yb[r * d + c] * iz);
        }
        if (state)
          RowState::save(blk, R, dz, kmax, rows_p + (bh * Tn + t0) * (RowState::kFields + dz),
                         nbr_p + (bh * Tn + t0) * kmax);
      }
    }
  });
}

// One thread's scratch for the backward, and the per-key accumulators of the head it is working on.
template <class T>
struct BackwardWork {
  Block<T> b;
  Keys<T> keys;
  Scratch<T> dA, dS, dr, dwc, ddc, dd2, daff, tile, du, dC, tmp_rz, tmp_nz;
  std::vector<T> colsum;
  std::vector<T> dv_l, dkr_l, dkhat_l, dehat_l, dz_l;  // a gathered block's key gradients, (m, ·)
  std::vector<double> dks_l, zcol_l;
  Scratch<T> gys;  // the block's rows of dy / Σ e (R, d)
  std::vector<double> dW, dsv;
  // The head's per-key accumulators: k̂ and ê gradients (GEMM-accumulated, plus the neighbour scatter), and the
  // coefficient of z_j in dz_j (from every |·|² term).
  std::vector<T> dkhat, dehat;
  std::vector<double> dkhat_scatter, zcol;
};

// Where one head's gradients go: dy (T, d) in, dq / dk_rot / dv (T, d) and dz (T, d_z) accumulated, the scalars' in ds.
template <class T>
struct HeadGrads {
  const T* gy;
  T *dq, *dkr, *dv, *dz;
  double* ds;
};

// The backward of rows [t0, t0 + R) of one head: rebuilds the block's tiles (forward_block's replay, from the rows'
// saved state: kFields + d_z doubles per row at `rows`, k_max neighbours at `nbr`), then runs the chain rule.
template <class T>
ASC_CPU_CLONES void backward_block(const HeadData<T>& h, const AscenderKernelConfig& cfg, int64_t t0, int64_t R,
                                   const double* rows, const int64_t* nbr, int64_t kmax, BackwardWork<T>& work,
                                   const HeadGrads<T>& out) {
  const int64_t d = h.d, dz = h.dz, da = h.da;
  const bool after = cfg.after_norm;
  const double inv_sqrt_d = 1 / std::sqrt(double(d));
  const double tau = h.sc[kTauScore];
  const double wa = h.sc[kOmegaA] * cfg.omega_scale, wsep = h.sc[kOmegaS] * cfg.omega_scale;
  const double wcoh = h.sc[kOmegaC] * cfg.omega_scale;
  Block<T>& b = work.b;
  Keys<T>& keys = work.keys;
  auto &dA = work.dA, &dS = work.dS, &dr = work.dr, &dwc = work.dwc, &ddc = work.ddc;
  auto &dd2 = work.dd2, &daff = work.daff, &tile = work.tile, &du = work.du, &dC = work.dC;
  auto& colsum = work.colsum;
  auto &tmp_rz = work.tmp_rz, &tmp_nz = work.tmp_nz;
  auto &dv_l = work.dv_l, &dkr_l = work.dkr_l, &dkhat_l = work.dkhat_l, &dehat_l = work.dehat_l, &dz_l = work.dz_l;
  auto &dks_l = work.dks_l, &zcol_l = work.zcol_l, &dW = work.dW, &dsv = work.dsv;
  auto &dkhat = work.dkhat, &dehat = work.dehat, &dkhat_scatter = work.dkhat_scatter, &zcol = work.zcol;
  const T* gyp = out.gy;
  T *dqp = out.dq, *dkrp = out.dkr, *dvp = out.dv, *dzp = out.dz;
  double* ds = out.ds;

  keys.select(h, cfg, t0, R);
  b.resize(R, keys.m, d, dz);
  RowState::load(b, R, dz, kmax, rows, nbr, cfg.norm_eps);
  forward_block(h, keys, cfg, t0, R, b, true);
  const int64_t n = keys.m;  // the block's key columns
  // Gradients of the block's keys: in place for full attention, else into (m, ·) buffers scattered below.
  T *dv_k = dvp, *dkr_k = dkrp, *dkhat_k = dkhat.data(), *dehat_k = dehat.data(), *dz_k = dzp;
  double *dks_k = dkhat_scatter.data(), *zcol_k = zcol.data();
  if (keys.gathered) {
    for (auto [buf, width] : {std::pair{&dv_l, d}, {&dkr_l, d}, {&dkhat_l, d}, {&dehat_l, da}, {&dz_l, dz}})
      buf->assign(n * width, T(0));
    dks_l.assign(n * d, 0.0), zcol_l.assign(n, 0.0);
    dv_k = dv_l.data(), dkr_k = dkr_l.data(), dkhat_k = dkhat_l.data(), dehat_k = dehat_l.data();
    dz_k = dz_l.data(), dks_k = dks_l.data(), zcol_k = zcol_l.data();
  }
  const T* gy0 = gyp + t0 * d;
  for (auto* t : {&dA, &dS, &dr, &dwc, &ddc, &daff, &tile, &dd2}) t->resize(R * n);  // written before read
  // y_i = (e_i V) / z_i with A_ij = e_ij / z_i (b.A holds e, b.inv_z 1 / z). With dy'_i = dy_i / z_i:
  // dV += eᵀ dy' (= Aᵀ dy);  dA' = dy' Vᵀ (= dA / z... per row: A_ij dA_ij = e_ij dA'_ij)
  work.gys.resize(R * d);
  T* gys = work.gys.data();
  for (int64_t r = 0; r < R; ++r) {
    const double iz = b.inv_z[r];
    for (int64_t c = 0; c < d; ++c) gys[r * d + c] = static_cast<T>(gy0[r * d + c] * iz);
  }
  gemm<T>(R, n, d, gys, d, 1, keys.v, 1, d, dA.data(), n);
  gemm<T>(n, d, R, b.A.data(), 1, n, gys, d, 1, dv_k, d, true);
  // One bias term (raw = fx x: its tile x and row factor fx), from dβ̃ = ω' dS back to d(raw): one pass over the row
  // for the scalars' gradients and d raw's coefficients (RawGrad); d(factor_i) of after_norm goes to `dfactor`.
  auto term_backward = [&](int64_t r, double omega, double factor, const Scratch<T>& tile, double fx,
                           const NormStats& st, int scalar, double& dfactor) __attribute__((always_inline))
                           ->RawGrad<T> {
    // β̃_ij = f nr_j (f = factor after_norm, else 1), nr_j = (fx x_j - μ) / s:  dω += Σ dS β̃;  df = ω Σ dS nr
    const T* x = tile.data() + r * n;
    const T* dSr = dS.data() + r * n;
    const T mu = static_cast<T>(st.mu), fxT = static_cast<T>(fx);
    T s1 = 0, s2 = 0;  // Σ dS_ij, Σ dS_ij rc_ij (dS = 0 on masked keys)
    ASC_SIMD_REDUCE2(+, s1, s2)
    for (int64_t j = 0; j < n; ++j) {
      const T dSj = dSr[j];
      s1 += dSj;
      s2 += dSj * (fxT * x[j] - mu);
    }
    const double f = after ? factor : 1.0, dsn = double(s2) * normalised(st).scale;  // Σ dS nr
    ds[scalar] += dsn * f * cfg.omega_scale;
    dfactor = after ? omega * dsn : 0.0;
    RawGrad<T> rg;
    if (st.constant || st.count == 0) return rg;
    const double o = omega * f, mean_g = o * double(s1) / st.count, mean_grc = o * double(s2) / st.count;
    const double q = st.sd > 0 ? mean_grc / (st.sd * st.s) : 0.0;
    rg.p = static_cast<T>(o / st.s), rg.a = static_cast<T>(mean_g / st.s), rg.q = static_cast<T>(q / st.s);
    rg.f = fxT, rg.mu = mu;
    return rg;
  };
  // The chain rule runs row by row through everything that needs no GEMM between its steps — the softmax, then each
  // term from its normalisation down to its tile — so a row's slices of the ~12 tiles stay in the L1/L2 cache
  // instead of each step streaming the whole block again; the GEMMs that combine rows run between these passes.
  if (cfg.use_align) dsv.assign(R * d, 0.0);
  if (cfg.use_coh) dW.assign(R, 0.0), dC.assign(R * dz, T(0));
  T* dCp = dC.data();
  colsum.assign(n, T(0));  // Σ_i (ddc_ij + dd²_ij): the |z_j|² coefficient of dz_j, summed over the block's rows
  const T delta = static_cast<T>(h.sc[kDelta]);
  for (int64_t r = 0; r < R; ++r) {
    // ---- A = softmax(S / τ) over kept keys:  g = A (dA - Σ A dA) = e (dA' - D / z) with D = Σ e dA';  dS = g / τ;
    // dτ += Σ g · (-S / τ²)
    {
      const T* e = b.A.data() + r * n;
      const T* S = b.S.data() + r * n;
      const T* dAr = dA.data() + r * n;
      T* dSr = dS.data() + r * n;
      T D = 0;
      ASC_SIMD_REDUCE(+, D)
      for (int64_t j = 0; j < n; ++j) D += e[j] * dAr[j];
      const T inv_tau = static_cast<T>(1 / tau), Dz = static_cast<T>(D * b.inv_z[r]);
      T gs = 0;  // Σ g S (masked keys have e = 0, so g = 0)
      ASC_SIMD_REDUCE(+, gs)
      for (int64_t j = 0; j < n; ++j) {
        const T gg = e[j] * (dAr[j] - Dz);
        dSr[j] = gg * inv_tau;
        gs += gg * S[j];
      }
      ds[kTauScore] += -double(gs) / (tau * tau);
    }
    // Raw pointers in the row loops: a clone does not inline std:: members (their options differ), and a call per
    // element would stop the loops vectorising.
    const T* dSr = dS.data() + r * n;
    const T* keep = b.keep_row(r, n);
    // ---- alignment: raw = λγ r (before_norm) or r:  dr = (λγ or 1) draw;  d(λγ) += Σ_j draw r (before_norm)
    if (cfg.use_align) {
      double dla = 0;
      const RawGrad<T> rg = term_backward(r, wa, b.la[r], b.r, b.fa[r], b.st_a[r], kOmegaA, dla);
      const T* rr = b.r.data() + r * n;
      const T fac = static_cast<T>(after ? 1.0 : b.la[r]);
      T* drr = dr.data() + r * n;
      T gr = 0;
      ASC_SIMD_REDUCE(+, gr)
      for (int64_t j = 0; j < n; ++j) {
        const T gj = rg.at(dSr[j], rr[j], keep[j]);  // d raw
        gr += gj * rr[j];
        drr[j] = fac * gj;
      }
      if (!after) dla += gr;
      // λγ:  dλ += d(λγ) γ;  γ = σ(-α var):  dvar = d(λγ) λ γ (1 - γ) (-α);  var = 1 - |s / cnt|²
      ds[kLambdaA] += dla * b.gamma_a[r];
      const double dvar = dla * h.sc[kLambdaA] * b.gamma_a[r] * (1 - b.gamma_a[r]) * (-h.alpha_a);
      const double cdiv = std::max(b.cnt[r], 1.0);
      const double* sr = b.s.data() + r * d;
      double* dsr = dsv.data() + r * d;
      for (int64_t c = 0; c < d; ++c) dsr[c] = -2 * sr[c] / (cdiv * cdiv) * dvar;
    }
    // ---- separation: raw = -(λη or 1) φ,  φ = w [a - δ]_+:  dw = dφ [a - δ]_+;  da = dφ w 1[a > δ];
    // dδ = -Σ dφ w 1[a > δ];  then ρ = Σ_{kept l ≠ i} w_il and w = exp(-d² / τ_sep):  dd² = -(dw + dρ) w / τ_sep
    if (cfg.use_sep) {
      double dls = 0;
      const RawGrad<T> rg = term_backward(r, wsep, b.ls[r], b.phi, b.fs[r], b.st_s[r], kOmegaS, dls);
      const T* ws = b.ws.data() + r * n;
      const T* phi = b.phi.data() + r * n;
      const T* aff = b.aff.data() + r * n;
      T* daffr = daff.data() + r * n;
      const T fac = static_cast<T>(after ? 1.0 : b.ls[r]);
      T gphi = 0, dhinge = 0;  // Σ g φ, Σ dφ w 1[a > δ]
      ASC_SIMD_REDUCE2(+, gphi, dhinge)
      for (int64_t j = 0; j < n; ++j) {
        const T hinge = aff[j] - delta, gj = rg.at(dSr[j], phi[j], keep[j]);  // d raw
        gphi += gj * phi[j];
        const T dphi = -fac * gj;
        const T da_j = hinge > T(0) ? dphi * ws[j] : T(0);
        daffr[j] = da_j;
        dhinge += da_j;
      }
      if (!after) dls -= gphi;
      ds[kDelta] -= dhinge;
      // λη:  dλ += d(λη) η;  η = min(1, ρ / κ):  dρ = dη / κ, dκ = -dη ρ / κ² while ρ / κ < 1
      ds[kLambdaS] += dls * b.eta[r];
      const double deta = dls * h.sc[kLambdaS];
      double drho = 0;
      if (b.rho[r] / h.sc[kKappa] < 1) {
        drho = deta / h.sc[kKappa];
        ds[kKappa] += -deta * b.rho[r] / (h.sc[kKappa] * h.sc[kKappa]);
      }
      const T drhoT = static_cast<T>(drho), inv_tau = static_cast<T>(1 / h.tau_sep);
      T* dd2r = dd2.data() + r * n;
      for (int64_t j = 0; j < n; ++j) {
        const T hinge = aff[j] - delta;
        const T dw = -fac * rg.at(dSr[j], phi[j], keep[j]) * (hinge <= T(0) ? T(0) : hinge);
        dd2r[j] = -(dw + (keep[j] != T(0) ? drhoT : T(0))) * ws[j] * inv_tau;
      }
      const int64_t self = b.self[r];
      if (self >= 0 && keep[self]) {  // ρ_i leaves out l = i: the self entry, recomputed without dρ (not dρ added back)
        const T hinge = aff[self] - delta;
        const T dw = -fac * rg.at(dSr[self], phi[self], keep[self]) * (hinge <= T(0) ? T(0) : hinge);
        dd2r[self] = -dw * ws[self] * inv_tau;
      }
    } else if (cfg.use_coh) {
      T* dd2r = dd2.data() + r * n;
      for (int64_t j = 0; j < n; ++j) dd2r[j] = T(0);
    }
    // ---- cohesion, up to its centroid: raw = -(λγ / τ_coh or 1) dc:  ddc = -(..) draw;  d(λγ) += -Σ draw dc / τ_coh
    // (before_norm);  var = Σ w' dc / W:  dw' = dvar dc / W;  ddc += dvar w' / W;  dW = -dvar var / W
    if (cfg.use_coh) {
      double dlc = 0;
      const RawGrad<T> rg = term_backward(r, wcoh, b.lc[r], b.dc, b.fc[r], b.st_c[r], kOmegaC, dlc);
      const T* dc = b.dc.data() + r * n;
      const T* wc = b.wc.data() + r * n;
      T* ddcr = ddc.data() + r * n;
      const T fac = static_cast<T>(after ? 1.0 : b.lc[r] / h.tau_coh);
      T gdc = 0;
      ASC_SIMD_REDUCE(+, gdc)
      for (int64_t j = 0; j < n; ++j) gdc += rg.at(dSr[j], dc[j], keep[j]) * dc[j];
      if (!after) dlc -= double(gdc) / h.tau_coh;
      ds[kLambdaC] += dlc * b.gamma_c[r];
      const double dvar = dlc * h.sc[kLambdaC] * b.gamma_c[r] * (1 - b.gamma_c[r]) * (-h.alpha_c);
      dW[r] = -dvar * b.var_c[r] / b.W[r];
      const T dvw = static_cast<T>(dvar / b.W[r]);
      T* dwcr = dwc.data() + r * n;
      T rowsum = 0;
      ASC_SIMD_REDUCE(+, rowsum)
      for (int64_t j = 0; j < n; ++j) {
        dwcr[j] = dvw * dc[j];
        const T x = -fac * rg.at(dSr[j], dc[j], keep[j]) + dvw * wc[j];
        ddcr[j] = x;
        rowsum += x;
      }
      // dc = |c|² + |z_j|² - 2 c·z_j:  dz_j += 2 z_j Σ_i ddc_ij (colsum) - 2 Σ_i ddc_ij c_i;  dc_i = 2 c_i Σ_j ddc_ij -
      // ...
      const T* cr = b.c.data() + r * dz;
      T* dCr = dC.data() + r * dz;
      for (int64_t c = 0; c < dz; ++c) dCr[c] = static_cast<T>(2 * cr[c] * rowsum);
    }
  }
  // ---- the GEMMs of the rows' results: S0 = (Q / √d) Krᵀ:  dQ = dS Kr / √d;  dKr += dSᵀ (Q / √d) ------------------
  gemm<T>(R, d, n, dS.data(), n, 1, keys.kr, d, 1, dqp + t0 * d, d);
  for (int64_t x = 0; x < R * d; ++x) dqp[t0 * d + x] = static_cast<T>(dqp[t0 * d + x] * inv_sqrt_d);
  gemm<T>(n, d, R, dS.data(), 1, n, h.qs.data() + t0 * d, d, 1, dkr_k, d, true);
  // alignment, r_ij = u_i · k̂_j:  dK̂ += drᵀ U;  dU = dr K̂
  if (cfg.use_align) {
    du.assign(R * d, T(0));
    gemm<T>(n, d, R, dr.data(), 1, n, b.u.data(), d, 1, dkhat_k, d, true);
    gemm<T>(R, d, n, dr.data(), n, 1, keys.khat, d, 1, du.data(), d);
    for (int64_t r = 0; r < R; ++r) {
      // u = s / |s|:  ds += (du - u (u·du)) / |s|; nothing where the headings cancel (u = 0 there, a constant)
      double* dsr = dsv.data() + r * d;
      const T* ur = b.u.data() + r * d;
      const T* dur = du.data() + r * d;
      if (!(b.snorm[r] <= kConstantRow * b.cnt[r])) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += double(ur[c]) * dur[c];
        const double inv_norm = 1 / b.snorm[r];
        for (int64_t c = 0; c < d; ++c) dsr[c] += (dur[c] - ur[c] * dot) * inv_norm;
      }
      // s_i = Σ_{l∈N(i)} k̂_l:  dk̂_l += ds_i
      for (int64_t l : b.nbr[r])
        for (int64_t c = 0; c < d; ++c) dks_k[l * d + c] += dsr[c];
    }
  }
  // cohesion: dz_j -= 2 Σ_i ddc_ij c_i;  dc_i -= 2 Σ_j ddc_ij z_j; then through c_i = Σ_l w'_il z_l / W_i:
  // dz_l += Σ_i (w'_il / W_i) dc_i;  dw'_il += dc_i·z_l / W_i;  dW_i -= dc_i·c_i / W_i
  if (cfg.use_coh) {
    tmp_nz.assign(n * dz, T(0));
    T* tnz = tmp_nz.data();
    gemm<T>(n, dz, R, ddc.data(), 1, n, b.c.data(), dz, 1, tmp_nz.data(), dz);
    for (int64_t x = 0; x < n * dz; ++x) dz_k[x] = static_cast<T>(dz_k[x] - 2 * tnz[x]);
    tmp_rz.resize(R * dz);
    T* trz = tmp_rz.data();
    gemm_narrow<T>(R, dz, n, ddc.data(), n, keys.z, dz, trz, dz);
    for (int64_t x = 0; x < R * dz; ++x) dCp[x] = static_cast<T>(dCp[x] - 2 * trz[x]);
    for (int64_t r = 0; r < R; ++r) {
      double dcc = 0;
      const T* cr = b.c.data() + r * dz;
      const T* dCr = dC.data() + r * dz;
      for (int64_t c = 0; c < dz; ++c) dcc += double(dCr[c]) * cr[c];
      dW[r] += -dcc / b.W[r];
    }
    for (int64_t r = 0; r < R; ++r) {
      const T inv_w = static_cast<T>(1 / b.W[r]);
      for (int64_t c = 0; c < dz; ++c) trz[r * dz + c] = dCp[r * dz + c] * inv_w;  // dc_i / W_i
    }
    gemm<T>(n, dz, R, b.wc.data(), 1, n, tmp_rz.data(), dz, 1, dz_k, dz, true);
    gemm_narrow<T>(R, n, dz, tmp_rz.data(), dz, keys.zT, n, tile.data(), n);  // dc_i · z_l / W_i
  }
  // ---- rows again: the cohesion kernel's dd² (W_i = Σ_kept w'_il:  dw'_il += dW_i;  w' = exp(-d² / τ_coh) on kept
  // keys:  dd² += -dw' w' / τ_coh; w' = 0 on masked keys, so they get nothing), and d² = |z_i|² + |z_j|² - 2 z_i·z_j:
  // dz_i += 2 z_i Σ_j dd²_ij, dz_j += 2 z_j Σ_i dd²_ij (the GEMM halves below)
  if (cfg.use_sep || cfg.use_coh) {
    const T inv_tc = static_cast<T>(1 / h.tau_coh);
    T* cs = colsum.data();
    for (int64_t r = 0; r < R; ++r) {
      T* dd2r = dd2.data() + r * n;
      T rowsum = 0;
      if (cfg.use_coh) {
        const T* wc = b.wc.data() + r * n;
        const T* dwcr = dwc.data() + r * n;
        const T* tr = tile.data() + r * n;
        const T* ddcr = ddc.data() + r * n;
        const T dWr = static_cast<T>(dW[r]);
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
      zcol[t0 + r] += 2.0 * double(rowsum);
    }
    for (int64_t j = 0; j < n; ++j) zcol_k[j] += 2.0 * double(cs[j]);
    // dz_i -= 2 Σ_j dd²_ij z_j;  dz_j -= 2 Σ_i dd²_ij z_i
    tmp_rz.resize(R * dz);
    T* trz = tmp_rz.data();
    gemm_narrow<T>(R, dz, n, dd2.data(), n, keys.z, dz, trz, dz);
    for (int64_t x = 0; x < R * dz; ++x) dzp[t0 * dz + x] = static_cast<T>(dzp[t0 * dz + x] - 2 * trz[x]);
    tmp_nz.assign(n * dz, T(0));
    T* tnz = tmp_nz.data();
    gemm<T>(n, dz, R, dd2.data(), 1, n, h.z + t0 * dz, dz, 1, tmp_nz.data(), dz);
    for (int64_t x = 0; x < n * dz; ++x) dz_k[x] = static_cast<T>(dz_k[x] - 2 * tnz[x]);
  }
  // ---- a_ij = ê_i · ê_j:  dÊ_i += (da Ê)_i;  dÊ_j += (daᵀ Ê_blk)_j -----------------------------------------
  if (cfg.use_sep) {
    gemm_narrow<T>(R, da, n, daff.data(), n, keys.ehat, da, dehat.data() + t0 * da, da, true);
    gemm<T>(n, da, R, daff.data(), 1, n, h.ehat.data() + t0 * da, da, 1, dehat_k, da, true);
  }
  if (keys.gathered) {
    keys.scatter_add(dv_k, d, dvp), keys.scatter_add(dkr_k, d, dkrp), keys.scatter_add(dkhat_k, d, dkhat.data());
    keys.scatter_add(dehat_k, da, dehat.data()), keys.scatter_add(dz_k, dz, dzp);
    keys.scatter_add(dks_k, d, dkhat_scatter.data()), keys.scatter_add(zcol_k, 1, zcol.data());
  }
}

template <class T>
void backward_impl(const AscenderKernelInputs& in, const AscenderKernelConfig& cfg, const AscenderKernelState& state,
                   const Tensor& gy_in, TensorList& grads) {
  const int64_t B = in.q.size(0), H = in.q.size(1), Tn = in.q.size(2), d = in.q.size(3);
  const int64_t dz = in.z.size(3), da = in.e.size(3);
  const Tensor gy = gy_in.contiguous();
  Tensor dq = zeros(in.q.shape(), in.q.options()), dkr = zeros(in.q.shape(), in.q.options());
  Tensor dk = zeros(in.k.shape(), in.k.options()), dv = zeros(in.v.shape(), in.v.options());
  Tensor dz_t = zeros(in.z.shape(), in.z.options()), de = zeros(in.e.shape(), in.e.options());
  std::vector<double> dsc(static_cast<size_t>(B * H * kNumScalars), 0.0);  // per task, reduced below
  const int64_t rows = row_block(cfg, Tn);
  const int64_t blocks = (Tn + rows - 1) / rows;
  const int64_t kmax = max_k(cfg), fields = RowState::kFields + dz;
  ASC_CHECK(state.rows.defined() && state.nbr.defined() && state.rows.numel() == B * H * Tn * fields &&
                state.nbr.numel() == B * H * Tn * kmax,
            "ascender_attention backward: the forward's row state is missing or does not match q {}", in.q.shape());
  const double* rows_p = state.rows.data_ptr<double>();
  const int64_t* nbr_p = state.nbr.data_ptr<int64_t>();
  parallel_for(B * H, Tn * Tn * (d + dz) * 16, [&](int64_t i0, int64_t i1) {
    BackwardWork<T> work;
    for (int64_t bh = i0; bh < i1; ++bh) {
      const HeadData<T> h = head_data<T>(in, cfg, bh / H, bh % H);
      const HeadGrads<T> out{gy.data_ptr<T>() + bh * Tn * d,    dq.data_ptr<T>() + bh * Tn * d,
                             dkr.data_ptr<T>() + bh * Tn * d,   dv.data_ptr<T>() + bh * Tn * d,
                             dz_t.data_ptr<T>() + bh * Tn * dz, dsc.data() + bh * kNumScalars};
      T* dzp = out.dz;
      auto &dkhat = work.dkhat, &dehat = work.dehat, &dkhat_scatter = work.dkhat_scatter, &zcol = work.zcol;
      dkhat.assign(Tn * d, T(0)), dehat.assign(Tn * da, T(0));
      dkhat_scatter.assign(Tn * d, 0.0), zcol.assign(Tn, 0.0);
      for (int64_t bi = 0; bi < blocks; ++bi) {
        const int64_t t0 = bi * rows, R = std::min(rows, Tn - t0);
        backward_block(h, cfg, t0, R, rows_p + (bh * Tn + t0) * fields, nbr_p + (bh * Tn + t0) * kmax, kmax, work, out);
      }
      // ---- per-key finishing: |z|² coefficients, the unit-vector backwards ------------------------------------
      for (int64_t j = 0; j < Tn; ++j)
        for (int64_t c = 0; c < dz; ++c) dzp[j * dz + c] = static_cast<T>(dzp[j * dz + c] + zcol[j] * h.z[j * dz + c]);
      std::vector<double> gk(Tn * d), ge(Tn * da);
      for (int64_t x = 0; x < Tn * d; ++x) gk[x] = double(dkhat[x]) + dkhat_scatter[x];
      for (int64_t x = 0; x < Tn * da; ++x) ge[x] = dehat[x];
      unit_rows_backward(h.khat, h.knorm, gk, Tn, d, 1e-12, dk.data_ptr<T>() + bh * Tn * d);
      unit_rows_backward(h.ehat, h.enorm, ge, Tn, da, 1e-8, de.data_ptr<T>() + bh * Tn * da);
    }
  });
  Tensor dscalars = zeros({kNumScalars, H}, in.scalars.options());
  T* dsp = dscalars.data_ptr<T>();
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int s = 0; s < kNumScalars; ++s)
      dsp[s * H + bh % H] = static_cast<T>(dsp[s * H + bh % H] + dsc[bh * kNumScalars + s]);
  grads = {dq, dkr, dk, dv, dz_t, de, dscalars};
}

}  // namespace

void ascender_unsupported(const AscenderKernelInputs& in, const AscenderKernelConfig& cfg, std::string& why) {
  why.clear();
  if (in.q.dtype() != kFloat32 && in.q.dtype() != kFloat64)
    why = fmt::format("dtype {} (the CPU kernel computes in float32 / float64)", in.q.dtype());
}

void ascender_forward(const AscenderKernelInputs& in, const AscenderKernelConfig& cfg, Tensor& y,
                      AscenderKernelState* state) {
  ASC_DISPATCH_FLOAT(in.q.dtype(), "ascender_attention", [&] { forward_impl<scalar_t>(in, cfg, y, state); });
}

void ascender_backward(const AscenderKernelInputs& in, const AscenderKernelConfig& cfg,
                       const AscenderKernelState& state, const Tensor& gy, TensorList& grads) {
  ASC_DISPATCH_FLOAT(in.q.dtype(), "ascender_attention backward",
                     [&] { backward_impl<scalar_t>(in, cfg, state, gy, grads); });
}

}  // namespace asc::cpu

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
