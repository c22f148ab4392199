// The forward of fused ASCender attention on tensor cores (cuda/ascender_launch.h: mma_takes, mma_forward): the
// formulas of docs/ascender.md and the semantics of cuda/ascender.cu's row kernel (keep mask, window and global
// tokens, NaN rows, constant rows, the neighbourhood's ties), with every (rows, keys) product on tensor cores through
// cuda/mma.cuh and float32 statistics.
//
// A block has 4 warps (blockDim (32, 4)) and 64 query rows of one (batch, head); a warp owns 16 rows and holds their
// operands as A fragments (cuda/mma_tiles.cuh). The block walks the keys it sees in tiles of 32 — every key, or in
// windowed mode the tiles of its window and of the global tokens, so a head costs O(n (w + g)) — three times, each
// pass recomputing the products it needs rather than storing (rows, keys) arrays:
//   pass 1  a_ij = ê_i · ê_j (or S_base, AscenderMode::Reuse) into each row's top-k list (shared memory, ties to the
//           lower index); d²_ij = |z_i|² + |z_j|² - 2 z_i · z_j; ρ_i = Σ_{kept l≠i} w^sep_il; W_i = Σ_kept w^coh and
//           the centroid's numerator Σ_kept w^coh_ij z_j (a product of the weights with the z tile).
//   then    per row: u_i from its neighbours' unit keys, γ_align, η, c_i = numerator / W; u_i and c_i become A
//           fragments.
//   pass 2  the raw rows r_ij = u_i · k̂_j, φ_ij = w^sep_ij [a_ij - δ]_+, dc_ij = |z_j - c_i|²: their statistics over
//           the kept keys (running count, mean and M2, merged across tiles and lanes as Chan et al.), and
//           Var^coh_i = Σ_kept w^coh dc / W.
//   pass 3  S_ij = S_base_ij + ω' β̃ terms + bias_ij, the online softmax of S / τ and y_i = Σ_j A_ij v_j (as the flash
//           forward, cuda/flash_mma.cu).
// It also writes N(i) (the state's nbr, as the CPU kernel's), which the backward (cuda/ascender.cu) then uses, so
// the gradients are those of the neighbourhoods the forward chose. Inputs: bfloat16 / float16, or float32 as TF32
// when allowed; d ≤ 64, d_z, d_a ≤ 32, k ≤ 32 (kMax*); others run cuda/ascender.cu's forward.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda/ascender_launch.h"
#include "cuda/ascender_mma_common.cuh"
#include "cuda/launch_kernel.cuh"
#include "cuda/mma.cuh"
#include "cuda/mma_tiles.cuh"
#include "cuda/row_kernels.cuh"
#include "ops/ascender_scalars.h"
#include "ops/math.h"

namespace asc::cuda {
namespace {

using namespace ascender_launch;
using namespace ascender_mma;  // the limits, staging, tiles visited, moments, Rec
using namespace ascender;      // kOmegaA ... (ops/ascender_scalars.h), kConstantRow
using mma::FragC;
using mma::Kind;
using mma_tiles::col_of;
using mma_tiles::group_max;
using mma_tiles::group_sum;
using mma_tiles::kNt;
using mma_tiles::kRows;
using mma_tiles::kTile;
using mma_tiles::padded;
using mma_tiles::row_of;
using rows::dexp;
using rows::from_acc;
using rows::to_acc;
using tiles::nan_max;
using tiles::neg_inf;

constexpr int kWarps = 4;
constexpr int kBlockRows = kWarps * kRows;  // 64 query rows per block

// Shared memory: region A holds the key tiles of a pass (of the inputs' element type S, and the keys' |z_j|² and
// inverse norms in float32), kSets<S> sets of them (for_tiles_pipelined), and during pass 1 and the row step also
// the warps' top-k lists (its first kListBytes; pass 1's sets follow them); before pass 1, the block's rows are
// staged after the lists. Region B is TF32's P scratch. u_i and c_i go through global memory (the workspace), read
// back as A fragments per tile.
constexpr int kListBytes = kWarps * kRows * kMaxNbr * 2 * 4;  // values (float) and indices (int)
constexpr int kFieldBytes = kTile * 4;                        // one float per key of a tile
template <class S>
constexpr int kPass1Set = tile_bytes<S>(kMaxD) + 2 * tile_bytes<S>(kMaxL) + 2 * kFieldBytes;  // k_rot e z; fields
template <class S>
constexpr int kPass23Set = 3 * tile_bytes<S>(kMaxD) + 2 * tile_bytes<S>(kMaxL) + 3 * kFieldBytes;  // k_rot k v e z
template <class S>
constexpr int region_a_bytes() {
  const int rows = kListBytes + tile_bytes<S>(kMaxL, kBlockRows);
  const int pass1 = kListBytes + kSets<S> * kPass1Set<S>, pass23 = kSets<S> * kPass23Set<S>;
  return rows > pass1 ? (rows > pass23 ? rows : pass23) : (pass1 > pass23 ? pass1 : pass23);
}
template <class S>
constexpr int kRegionB = mma::kind_of<S>() == Kind::TF32 ? kWarps* kRows* mma_tiles::kPld : 1;

template <class S>
__global__ void __launch_bounds__(32 * kWarps, 1)
    ascender_mma_forward_kernel(Params p, MmaWorkspace ws, int64_t* __restrict__ nbr_out, int64_t nbr_k, bool records) {
  constexpr Kind K = mma::kind_of<S>();
  constexpr int LdD = ld_of<S>(kMaxD), LdL = ld_of<S>(kMaxL);  // the staged tiles' strides
  float* const u_rows = ws.u;                                  // (rows, d)
  float* const c_rows = ws.c;                                  // (rows, d_z)
  float* const rec = records ? ws.rec : nullptr;               // (rows, kRec)
  __shared__ Bytes16 A_words[region_a_bytes<S>() / 16];        // 16-byte aligned
  unsigned char* const A_ = reinterpret_cast<unsigned char*>(A_words);
  __shared__ float B_[kRegionB<S>];
  __shared__ int list_m[kWarps][kRows];
  const int warp = threadIdx.y, lane = threadIdx.x, g = mma::lane_g(), tt = mma::lane_t();
  float* const scratch = B_ + (K == Kind::TF32 ? warp * kRows * mma_tiles::kPld : 0);  // this warp's P (TF32)
  const int64_t n = p.T, d = p.d, dz = p.dz, da = p.da, H = p.H;
  const int64_t bh = blockIdx.y, b = bh / H, h = bh % H, t0 = int64_t(blockIdx.x) * kBlockRows;
  const int64_t tw = t0 + warp * kRows;  // the warp's first row
  const int64_t dp = padded<K>(d), dzp = padded<K>(dz), dap = padded<K>(da);
  const Head<S> hd{static_cast<const S*>(p.q) + bh * n * d,
                   static_cast<const S*>(p.k_rot) + bh * n * d,
                   static_cast<const S*>(p.k) + bh * n * d,
                   static_cast<const S*>(p.v) + bh * n * d,
                   static_cast<const S*>(p.z) + bh * n * dz,
                   static_cast<const S*>(p.e) + bh * n * da,
                   static_cast<const S*>(p.scalars),
                   ws.kinv + bh * n,
                   ws.einv + bh * n,
                   ws.zsq + bh * n,
                   b,
                   h,
                   bh};
  const float inv_sqrt_d = 1.0f / sqrtf(float(d)), inv_tau = 1.0f / hd.scalar(kTauScore, H);
  const float inv_tau_s = static_cast<float>(1 / p.tau_sep[h]), inv_tau_c = static_cast<float>(1 / p.tau_coh[h]);
  const int K_nbr = static_cast<int>(p.k_nbr[h]);
  const bool after = p.after_norm != 0;
  const float om = static_cast<float>(p.omega_scale);
  const Visit vis = visit_of(p, t0, kBlockRows);

  // ---- the block's own rows: e, z as A fragments, 1 / max(|e_i|, 1e-8) and |z_i|² ----------------------------
  mma_tiles::RowsA<K, kMaxL> ea, za;
  float zz[2], cc[2] = {0.0f, 0.0f}, einv[2];
  int64_t row[2];  // this lane's rows: g and g + 8 of the warp's
  row[0] = tw + g, row[1] = tw + g + 8;
#pragma unroll
  for (int r = 0; r < 2; ++r) einv[r] = row[r] < n ? hd.einv[row[r]] : 0.0f, zz[r] = row[r] < n ? hd.zsq[row[r]] : 0.0f;
  {
    S* const rows = reinterpret_cast<S*>(A_ + kListBytes);  // 64 rows of stride LdL
    stage(rows, LdL, hd.e, t0, kBlockRows, n, da, dap);
    staged();
    mma_tiles::load_rows(ea, rows + warp * kRows * LdL, LdL, dap);
    __syncthreads();
    stage(rows, LdL, hd.z, t0, kBlockRows, n, dz, dzp);
    staged();
    mma_tiles::load_rows(za, rows + warp * kRows * LdL, LdL, dzp);
    __syncthreads();
  }

  // ---- pass 1: neighbourhoods, ρ, W and the centroids' numerators -------------------------------------------------
  float* const tv = reinterpret_cast<float*>(A_) + warp * kRows * kMaxNbr * 2;  // this warp's lists: values (16,
                                                                                // kMaxNbr), then indices
  int* const ti = reinterpret_cast<int*>(tv + kRows * kMaxNbr);
  if (lane < kRows) list_m[warp][lane] = 0;
  float rho[2] = {0.0f, 0.0f}, W[2] = {0.0f, 0.0f}, nan_sel[2] = {0.0f, 0.0f};
  FragC cnum[kMaxL / 8] = {};
  {
    S *KRs, *Es, *Zs;
    float *ZZs, *EN;  // |z_j|², 1 / max(|e_j|, 1e-8)
    auto use = [&](int set) {
      Carve cv{A_ + kListBytes + set * kPass1Set<S>};
      KRs = cv.tile<S>(kMaxD), Es = cv.tile<S>(kMaxL), Zs = cv.tile<S>(kMaxL);
      ZZs = cv.take<float>(kTile), EN = cv.take<float>(kTile);
    };
    auto stage1 = [&](int64_t s0, int set) {
      use(set);
      if (p.use_align && p.select_by_scores) stage(KRs, LdD, hd.kr, s0, kTile, n, d, dp);
      if (p.use_align && !p.select_by_scores) stage(Es, LdL, hd.e, s0, kTile, n, da, dap), fields(EN, hd.einv, s0, n);
      if (p.use_sep || p.use_coh) stage(Zs, LdL, hd.z, s0, kTile, n, dz, dzp), fields(ZZs, hd.zsq, s0, n);
    };
    for_tiles_pipelined<kSets<S>>(vis, stage1, [&](int64_t s0, int set) {
      use(set);
      FragC sel[kNt], zd[kNt], wgt[kNt];
      if (p.use_align) {
        if (p.select_by_scores) {
          mma_tiles::RowsA<K, kMaxD> qa;
          load_global(qa, hd.q, tw, n, d, dp);
          mma_tiles::products(sel, qa, KRs, LdD, dp);
        } else
          mma_tiles::products(sel, ea, Es, LdL, dap);
      }
      if (p.use_sep || p.use_coh) mma_tiles::products(zd, za, Zs, LdL, dzp);
#pragma unroll
      for (int j = 0; j < kNt; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          const int64_t i = row[r], key = s0 + col_of(j, e);
          const bool kp = kept(p, b, h, i, key);
          wgt[j].x[e] = 0.0f;
          if (p.use_sep || p.use_coh) {
            const float d2 = dist2(zz[r], ZZs[col_of(j, e)], zd[j].x[e]);
            if (p.use_sep && kp && key != i) rho[r] += dexp(-d2 * inv_tau_s);
            if (p.use_coh && kp) {
              wgt[j].x[e] = as_operand<K>(dexp(-d2 * inv_tau_c));  // as the product Σ w z reads it: c_i is convex
              W[r] += wgt[j].x[e];
            }
          }
          if (p.use_align) {
            const bool cand = kp && (p.include_self || key != i);
            const float x = sel[j].x[e] * (p.select_by_scores ? inv_sqrt_d : einv[r] * EN[col_of(j, e)]);
            if (cand && x != x) nan_sel[r] = 1.0f;
            sel[j].x[e] = cand && x == x ? x : neg_inf<float>();  // not a candidate (or NaN): never inserted
          }
        }
      if (p.use_coh) mma_tiles::times_tile<K, kMaxL>(cnum, wgt, Zs, LdL, dzp, scratch);
      if (p.use_align) {
        // The 4 lanes of a group hold different candidates of the same two rows: they insert in turn.
        for (int turn = 0; turn < 4; ++turn) {
          if (tt == turn)
#pragma unroll
            for (int j = 0; j < kNt; ++j)
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const float x = sel[j].x[e];
                if (x == neg_inf<float>()) continue;
                const int rr = row_of(e), key = static_cast<int>(s0 + col_of(j, e));
                float* const vals = tv + rr * kMaxNbr;
                int* const idx = ti + rr * kMaxNbr;
                int m = list_m[warp][rr];
                if (m == K_nbr && (m == 0 || !better(x, key, vals[m - 1], idx[m - 1]))) continue;
                int q = m < K_nbr ? m++ : m - 1;
                for (; q > 0 && better(x, key, vals[q - 1], idx[q - 1]); --q)
                  vals[q] = vals[q - 1], idx[q] = idx[q - 1];
                vals[q] = x, idx[q] = key;
                list_m[warp][rr] = m;
              }
          __syncwarp();
        }
      }
    });
  }
  __syncthreads();  // pass 1's tiles are read no more: region A's tail takes u_i

  // ---- the rows' alignment, separation and cohesion factors; u_i and c_i as A fragments ---------------------------
  float fa[2] = {1.0f, 1.0f}, la[2] = {0.0f, 0.0f}, ls[2] = {0.0f, 0.0f}, eta[2] = {0.0f, 0.0f};
  float Wc[2] = {1.0f, 1.0f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    rho[r] = group_sum(rho[r]), W[r] = group_sum(W[r]), nan_sel[r] = group_max(nan_sel[r]);
    const float ratio = rho[r] / hd.scalar(kKappa, H);
    eta[r] = ratio >= 1.0f ? 1.0f : ratio;  // min(1, ρ/κ); fmin would turn a NaN into 1
    ls[r] = hd.scalar(kLambdaS, H) * eta[r];
    Wc[r] = W[r] < 1e-30f ? 1e-30f : W[r];  // fmax would turn a NaN into 1e-30
  }
  float* const U = u_rows + bh * n * d;  // this head's u_i (n, d), read back by load_global
  if (p.use_align) {
    // Warp-wide per row: s = Σ_{l∈N(i)} k̂_l (lanes over the columns), |s|, γ_align, u = s / |s|.
    const float alpha = static_cast<float>(-p.alpha_align[h]), lam = hd.scalar(kLambdaA, H);
    for (int rr = 0; rr < kRows; ++rr) {
      const int64_t i = tw + rr;
      const bool nan_nbr = __shfl_sync(0xffffffffu, rr < 8 ? nan_sel[0] : nan_sel[1], 4 * (rr & 7)) != 0.0f;
      const int m = nan_nbr ? 0 : list_m[warp][rr];
      float s[2] = {0.0f, 0.0f};
      for (int t = 0; t < m; ++t) {
        const int64_t l = ti[rr * kMaxNbr + t];
        const float kinv = hd.kinv[l];
#pragma unroll
        for (int u = 0; u < 2; ++u)
          if (lane + 32 * u < d) s[u] += to_acc(hd.k[l * d + lane + 32 * u]) * kinv;
      }
      const float s2 = tiles::warp_sum(s[0] * s[0] + s[1] * s[1]), snorm = sqrtf(s2);
      const float cdiv = m > 0 ? float(m) : 1.0f;
      const float var = m > 0 || nan_nbr ? 1.0f - s2 / (cdiv * cdiv) : 0.0f;
      const float gamma = math::sigmoid(alpha * var);
      const float uinv = snorm <= static_cast<float>(kConstantRow) * float(m) ? 0.0f : 1.0f / snorm;
#pragma unroll
      for (int u = 0; u < 2; ++u)
        if (i < n && lane + 32 * u < d) U[i * d + lane + 32 * u] = nan_nbr ? NAN : s[u] * uinv;
      if (rr == g) la[0] = lam * gamma, fa[0] = after ? 1.0f : lam * gamma;
      if (rr == g + 8) la[1] = lam * gamma, fa[1] = after ? 1.0f : lam * gamma;
      if (rec && lane == 0 && i < n) {  // the record's alignment fields (Rec), written here: nothing stays live
        float* const o = rec + (bh * n + i) * kRec;
        o[rGammaA] = gamma, o[rSnorm] = snorm, o[rNbr] = nan_nbr ? -1.0f : float(m);
      }
      if (nbr_out && i < n && lane < nbr_k)
        nbr_out[(bh * n + i) * nbr_k + lane] = nan_nbr && lane == 0 ? -2 : lane < m ? ti[rr * kMaxNbr + lane] : -1;
    }
  }
  float* const Cr = c_rows + bh * n * dz;  // this head's c_i (n, d_z), read back by load_global
  if (p.use_coh) {
#pragma unroll
    for (int r = 0; r < 2; ++r) cc[r] = 0.0f;
#pragma unroll
    for (int dd = 0; dd < kMaxL / 8; ++dd)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t c = 8 * dd + 2 * tt + (e & 1);
        const float cv = as_operand<K>(cnum[dd].x[e] / Wc[e >> 1]);  // as the products with z read it
        if (c < dz) {
          cc[e >> 1] += cv * cv;
          if (row[e >> 1] < n) Cr[row[e >> 1] * dz + c] = cv;
        }
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) cc[r] = group_sum(cc[r]);  // |c_i|²
  }
  __syncthreads();  // u_i and c_i are written (read back by other lanes); region A takes tiles again

  // The tiles of passes 2 and 3 (region A; set `set` after use(set)), and a tile's recomputed products.
  S *KRs, *KHs, *Vs, *Es, *Zs;
  float *ZZs, *KN, *EN;  // |z_j|², 1 / max(|k_j|, 1e-12), 1 / max(|e_j|, 1e-8)
  auto use = [&](int set) {
    Carve cv{A_ + set * kPass23Set<S>};
    KRs = cv.tile<S>(kMaxD), KHs = cv.tile<S>(kMaxD), Vs = cv.tile<S>(kMaxD), Es = cv.tile<S>(kMaxL);
    Zs = cv.tile<S>(kMaxL), ZZs = cv.take<float>(kTile), KN = cv.take<float>(kTile), EN = cv.take<float>(kTile);
  };
  const float delta = hd.scalar(kDelta, H);
  auto stage_keys = [&](int64_t s0, int set, bool scores) {
    use(set);
    if (scores) stage(KRs, LdD, hd.kr, s0, kTile, n, d, dp), stage(Vs, LdD, hd.v, s0, kTile, n, d, dp);
    if (p.use_align) stage(KHs, LdD, hd.k, s0, kTile, n, d, dp), fields(KN, hd.kinv, s0, n);
    if (p.use_sep) stage(Es, LdL, hd.e, s0, kTile, n, da, dap), fields(EN, hd.einv, s0, n);
    if (p.use_sep || p.use_coh) stage(Zs, LdL, hd.z, s0, kTile, n, dz, dzp), fields(ZZs, hd.zsq, s0, n);
  };
  auto stage2 = [&](int64_t s0, int set) { stage_keys(s0, set, false); };  // pass 2 needs no k_rot, v
  auto stage3 = [&](int64_t s0, int set) { stage_keys(s0, set, true); };
  // One tile's raw-row sources, term by term (each a (16 × kTile) tile; one at a time keeps the registers down):
  // r = u_i · k̂_j, φ = w^sep [a - δ]_+, dc = |z_j - c_i|². d2 = |z_i - z_j|² from the z product zd.
  auto d2_of = [&](const FragC& zd, int j, int e) { return dist2(zz[e >> 1], ZZs[col_of(j, e)], zd.x[e]); };
  auto align_tile = [&](FragC(&x)[kNt]) { ascender_mma::align_tile<K>(x, U, tw, n, d, dp, KHs, KN); };
  auto sep_tile = [&](FragC(&x)[kNt]) {
    FragC zd[kNt];
    mma_tiles::products(x, ea, Es, LdL, dap);  // e_i · e_j, then φ
    mma_tiles::products(zd, za, Zs, LdL, dzp);
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float hinge = x[j].x[e] * einv[e >> 1] * EN[col_of(j, e)] - delta;             // a_ij - δ
        x[j].x[e] = dexp(-d2_of(zd[j], j, e) * inv_tau_s) * (hinge <= 0.0f ? 0.0f : hinge);  // a NaN stays NaN
      }
  };
  auto coh_tile = [&](FragC(&x)[kNt]) { ascender_mma::coh_tile<K>(x, Cr, tw, n, dz, dzp, Zs, ZZs, cc); };
  auto keep_bits = [&](int64_t s0) { return ascender_mma::keep_bits(p, b, h, row, s0); };

  // ---- pass 2: the raw rows' moments, and Var^coh ------------------------------------------------------------------
  Moments ma[2], ms[2], mc[2];
  float var_c[2] = {0.0f, 0.0f};
  if (p.use_align || p.use_sep || p.use_coh)
    for_tiles_pipelined<kSets<S>>(vis, stage2, [&](int64_t s0, int set) {
      use(set);
      const unsigned kb = keep_bits(s0);
      FragC x[kNt];
      if (p.use_align) {
        align_tile(x);
#pragma unroll
        for (int j = 0; j < kNt; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (kb >> (4 * j + e) & 1u) ma[e >> 1].add(x[j].x[e]);
      }
      if (p.use_sep) {
        sep_tile(x);
#pragma unroll
        for (int j = 0; j < kNt; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (kb >> (4 * j + e) & 1u) ms[e >> 1].add(x[j].x[e]);
      }
      if (p.use_coh) {
        FragC zd[kNt];
        coh_tile(x);
        mma_tiles::products(zd, za, Zs, LdL, dzp);
#pragma unroll
        for (int j = 0; j < kNt; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (kb >> (4 * j + e) & 1u) {
              mc[e >> 1].add(x[j].x[e]);
              var_c[e >> 1] += dexp(-d2_of(zd[j], j, e) * inv_tau_c) * x[j].x[e];
            }
      }
    });

  // The terms in S: Σ_t w_t (f_t src_t - μ_t) = Σ_t k_t src_t + k0, with w_t = ω' (the gate after_norm) scale_t,
  // k_t = w_t f_t and k0 = -Σ_t w_t μ_t (the raw row raw_t = f_t src_t, its mean μ_t and scale_t).
  float ka[2] = {0, 0}, ks[2] = {0, 0}, kc[2] = {0, 0}, k0[2] = {0, 0};
  // The record (Rec) of row r's raw row `t`, by one lane of its group, as soon as it is known: nothing of it stays
  // live through pass 3.
  auto record_stat = [&](int r, int t, const Moments& m, const Standardise& st) {
    if (!rec || tt != 0 || row[r] >= n) return;
    float* const o = rec + (bh * n + row[r]) * kRec;
    o[rec_stat(t, sCount)] = m.n, o[rec_stat(t, sMean)] = m.mean, o[rec_stat(t, sM2)] = m.m2;
    o[rec_stat(t, sSd)] = st.sd, o[rec_stat(t, sScale)] = st.scale;
  };
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    ma[r].merge_group(), ms[r].merge_group(), mc[r].merge_group();
    var_c[r] = group_sum(var_c[r]) / Wc[r];
    if (p.use_align) {
      const Standardise st(ma[r], fa[r], p.norm_eps, p.constant_row);
      record_stat(r, 0, ma[r], st);
      const float w = hd.scalar(kOmegaA, H) * om * (after ? la[r] : 1.0f) * st.scale;
      ka[r] = w * fa[r], k0[r] -= w * st.mu;
    }
    if (p.use_sep) {
      const float f = -(after ? 1.0f : ls[r]);  // raw sep = -f φ
      const Standardise st(ms[r], f, p.norm_eps, p.constant_row);
      record_stat(r, 1, ms[r], st);
      const float w = hd.scalar(kOmegaS, H) * om * (after ? ls[r] : 1.0f) * st.scale;
      ks[r] = w * f, k0[r] -= w * st.mu;
    }
    if (p.use_coh) {
      const float gamma = math::sigmoid(static_cast<float>(-p.alpha_coh[h]) * var_c[r]);
      const float lc = hd.scalar(kLambdaC, H) * gamma;
      const float f = -(after ? 1.0f : lc * inv_tau_c);
      const Standardise st(mc[r], f, p.norm_eps, p.constant_row);
      record_stat(r, 2, mc[r], st);
      if (rec && tt == 0 && row[r] < n) {
        float* const o = rec + (bh * n + row[r]) * kRec;
        o[rLc] = lc, o[rGammaC] = gamma, o[rVarC] = var_c[r];
      }
      const float w = hd.scalar(kOmegaC, H) * om * (after ? lc : 1.0f) * st.scale;
      kc[r] = w * f, k0[r] -= w * st.mu;
    }
    if (rec && tt == 0 && row[r] < n) {  // the rest of the record but the softmax's max and sum
      float* const o = rec + (bh * n + row[r]) * kRec;
      o[rK0] = k0[r], o[rKa] = ka[r], o[rKs] = ks[r], o[rKc] = kc[r], o[rFa] = fa[r], o[rLa] = la[r];
      o[rLs] = ls[r], o[rEta] = eta[r], o[rRho] = rho[r], o[rW] = Wc[r];
    }
  }

  // ---- pass 3: S, the online softmax and y = A V -------------------------------------------------------------------
  float mrow[2] = {neg_inf<float>(), neg_inf<float>()}, l[2] = {0.0f, 0.0f};
  FragC acc[kMaxD / 8] = {};
  for_tiles_pipelined<kSets<S>>(vis, stage3, [&](int64_t s0, int set) {
    use(set);
    const unsigned kb = keep_bits(s0);
    FragC s[kNt], x[kNt];
    {
      mma_tiles::RowsA<K, kMaxD> qa;
      load_global(qa, hd.q, tw, n, d, dp);
      mma_tiles::products(s, qa, KRs, LdD, dp);
    }
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j].x[e] = s[j].x[e] * inv_sqrt_d + k0[e >> 1];
    // S += k_t src_t, term by term
    if (p.use_align) {
      align_tile(x);
#pragma unroll
      for (int j = 0; j < kNt; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j].x[e] += ka[e >> 1] * x[j].x[e];
    }
    if (p.use_sep) {
      sep_tile(x);
#pragma unroll
      for (int j = 0; j < kNt; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j].x[e] += ks[e >> 1] * x[j].x[e];
    }
    if (p.use_coh) {
      coh_tile(x);
#pragma unroll
      for (int j = 0; j < kNt; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j].x[e] += kc[e >> 1] * x[j].x[e];
    }
    float mx[2] = {neg_inf<float>(), neg_inf<float>()};
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const bool kp = kb >> (4 * j + e) & 1u;
        float Sj = s[j].x[e];
        if (kp && p.bias) Sj += bias_at<S>(p, b, h, row[r], s0 + col_of(j, e));
        s[j].x[e] = kp ? Sj * inv_tau : neg_inf<float>();
        mx[r] = nan_max(mx[r], s[j].x[e]);
      }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float tile_max = group_max(mx[r]);
      const float m_new = tile_max != tile_max ? tile_max : fmaxf(mrow[r], tile_max);  // NaN poisons the row
      corr[r] = m_new == neg_inf<float>() ? 1.0f : dexp(mrow[r] - m_new);
      mx[r] = m_new;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float mr = mx[e >> 1];
        s[j].x[e] = mr == neg_inf<float>() ? 0.0f : dexp(s[j].x[e] - mr);
        sum[e >> 1] += s[j].x[e];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + group_sum(sum[r]), mrow[r] = mx[r];
#pragma unroll
    for (int dd = 0; dd < kMaxD / 8; ++dd)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[dd].x[e] *= corr[e >> 1];
    mma_tiles::times_tile<K, kMaxD>(acc, s, Vs, LdD, dp, scratch);
  });
  S* const y = static_cast<S*>(p.y) + bh * n * d;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= n) continue;
    if (rec && tt == 0) rec[(bh * n + row[r]) * kRec + rMax] = mrow[r], rec[(bh * n + row[r]) * kRec + rSum] = l[r];
    const bool live = l[r] > 0.0f || l[r] != l[r];  // no kept key: a zero row; a NaN row stays NaN
    const float inv = live ? 1.0f / l[r] : 0.0f;
#pragma unroll
    for (int dd = 0; dd < kMaxD / 8; ++dd)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t c = 8 * dd + 2 * tt + e;
        if (c < d) y[row[r] * d + c] = from_acc<S>(live ? acc[dd].x[2 * r + e] * inv : 0.0f);  // exact 0: no key
      }
  }
}

// The per-key fields of the workspace (MmaWorkspace) of row r of every (batch, head): |k_r|, |e_r| in float32, their
// inverses as the products use them, and |z_r|² of the operands; one warp per row.
template <class S>
__global__ void key_fields_kernel(Params p, MmaWorkspace ws) {
  const int64_t r = blockIdx.x;
  if (r >= ws.rows) return;
  auto norm = [&](const void* base, int64_t cols) {
    const S* const x = static_cast<const S*>(base) + r * cols;
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += 32) s += to_acc(x[c]) * to_acc(x[c]);
    return sqrtf(tiles::warp_sum(s));
  };
  const float kn = norm(p.k, p.d), en = norm(p.e, p.da);
  if (threadIdx.x != 0) return;
  ws.knorm[r] = kn, ws.enorm[r] = en, ws.kinv[r] = 1.0f / fmaxf(kn, 1e-12f), ws.einv[r] = 1.0f / fmaxf(en, 1e-8f);
  ws.zsq[r] = operand_sq<mma::kind_of<S>()>(static_cast<const S*>(p.z) + r * p.dz, p.dz);
}

cudaError_t checked(cudaError_t e) { return e != cudaSuccess ? e : cudaGetLastError(); }

}  // namespace

namespace ascender_launch {

bool mma_takes(FloatElem t, const Params& p, bool allow_tf32) {
  if (t == FloatElem::F64 || (t == FloatElem::F32 && !allow_tf32)) return false;
  int64_t kmax = 0;
  for (int64_t h = 0; h < p.H && h < kMaxHeads; ++h) kmax = p.k_nbr[h] > kmax ? p.k_nbr[h] : kmax;
  return p.d <= kMaxD && p.dz <= kMaxL && p.da <= kMaxL && kmax <= kMaxNbr;
}

int64_t mma_workspace_floats(const Params& p, bool records) {
  return rows16(p) * (MmaWorkspace::kKeyFields + p.d + p.dz + (records ? kRec : 0));
}

cudaError_t mma_forward(FloatElem t, const Params& p, void* workspace, bool records, int64_t* nbr, int64_t nbr_k,
                        cudaStream_t stream) {
  if (p.B * p.H == 0 || p.T == 0) return cudaSuccess;
  auto go = [&](auto tag) -> cudaError_t {
    using S = decltype(tag);
    const MmaWorkspace w(p, workspace);
    const cudaError_t err =
        checked(launch_kernel(key_fields_kernel<S>, dim3(grid_dim(w.rows)), dim3(32), stream, p, w));
    if (err != cudaSuccess) return err;
    const dim3 grid(grid_dim((p.T + kBlockRows - 1) / kBlockRows), grid_dim(p.B * p.H, kMaxGridYZ));
    return checked(
        launch_kernel(ascender_mma_forward_kernel<S>, grid, dim3(32, kWarps), stream, p, w, nbr, nbr_k, records));
  };
  return visit_mma_elem(t, go);
}

}  // namespace ascender_launch
}  // namespace asc::cuda
