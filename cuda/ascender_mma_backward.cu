// The backward of fused ASCender attention on tensor cores (cuda/ascender_launch.h: mma_backward), after the
// tensor-core forward (cuda/ascender_mma.cu) has left its per-row records (Rec), u_i, c_i, the norms and N(i). The
// chain rule is the row kernel's (cuda/ascender_terms.cuh: each term's backward with its derivation), rearranged so
// that nothing (rows, keys) is stored and no gradient is summed by atomics: every result is written once, by the
// block that owns its row or key, in a fixed order — float32 gradients repeat bit for bit from run to run.
//
// What makes it possible: every row-wide quantity the chain rule needs from dS_ij = P_ij (dP_ij - D_i) / τ is a sum
// over the row that the forward's records and one pass over the keys give. With D_i = Σ_j P_ij dP_ij (dP = dy_i · v_j),
// Σ_j dS_ij x_ij = (Σ_j P dP x - D_i Σ_j P x) / τ for any x. The standardisation's backward is then affine per row:
//   d(raw_ij) = P1 dS_ij + P2 src_ij + P3   on kept keys (0 elsewhere; raw = f src, see Rec),
// and so is each term's gradient with respect to its source (align dr, sep dφ, coh d(dc): the "affine coefficients"
// of Coef). The passes, each over the tiles of keys (or queries) a block sees (windowed mode: its band and the global
// tokens):
//   query kernel, 64 rows per block, a warp per 16 rows (A fragments) and the key tiles as B:
//     Sums    S, P and dP recomputed; the row sums above → the affine coefficients (Coef) and the rows' shares of the
//             learnable scalars' gradients (summed per head by scalars_kernel, in a fixed order).
//     Dq      dq_i = Σ_j dS_ij k_rot_j / √d and du_i = Σ_j dr_ij k̂_j → ds_i (the gradient w.r.t. s = Σ_{l∈N(i)} k̂_l).
//     Latent  dê_i (separation's a_ij), dc_i (the centroid's gradient) → dW; and the query side of d²'s backward
//             from separation: dz_i = 2 Σ_j dd²_ij (z_i - z_j).
//     Coh     cohesion's share of dd²_ij (it needs dc_i) into dz_i.
//   key kernel, 32 keys per block, a warp per 16 keys (A fragments) and the query tiles as B — the transposed
//   products of FlashAttention-2's backward:
//     Values  dv_j = Σ_i P_ij dy_i, dk_rot_j = Σ_i dS_ij q_i / √d, dk̂_j = Σ_i dr_ij u_i + Σ_{i: j∈N(i)} ds_i (each
//             key gathers the ds rows of the tile's rows that hold it in N(i): a gather, not a scatter).
//     Latent  dê_j = Σ_i da_ij ê_i + the query side's; dz_j from d², the cohesion distances and the centroids.
//   then the unit maps' backward (k̂ = k / |k|, ê = e / |e|; cuda/ascender.cu's kernel).
// Inputs and limits are the forward's (mma_takes); every accumulator is float32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
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
using namespace ascender_mma;
using namespace ascender;  // kOmegaA ... (ops/ascender_scalars.h), kConstantRow
using mma_tiles::col_of;
using mma_tiles::group_sum;
using mma_tiles::kNt;
using mma_tiles::kPld;
using mma_tiles::padded;
using mma_tiles::row_of;
using mma_tiles::RowsA;
using mma_tiles::times_tile;
using rows::dexp;
using tiles::neg_inf;

constexpr int kQWarps = 4, kQRows = kQWarps * kRows;  // query kernel: 64 rows per block
constexpr int kKWarps = 2, kKRows = kKWarps * kRows;  // key kernel: 32 keys per block

// What the Sums pass derives per query row for the other passes, float32 at (bh·T + i)·kCoef + field: D_i, the
// affine coefficients of dr (align), dφ (sep) and fc d(raw) (coh) — d(src) = c1 dS + c2 src + c3 on kept keys —,
// separation's dρ, cohesion's dVar / W and dW (the Latent pass completes it with the centroid's share), and
// alignment's dVar.
enum Coef : int { cD, cA1, cA2, cA3, cS1, cS2, cS3, cDrho, cC1, cC2, cC3, cDvw, cDW, cDvarA, kCoef };

// The backward's workspace (mma_backward_floats), float32: Coef rows, the rows' scalar shares (rows, 9), ds_i (rows,
// d), dc_i (rows, d_z), and the query side's dz (rows, d_z) and dê (rows, d_a); the key side's dk̂ (rows, d) and the
// whole dê (rows, d_a), which the unit maps' backward reads.
struct BackWs {
  float *coef, *dscal, *ds, *dc, *dzq, *deq, *dkhat, *dehat;
  __host__ __device__ BackWs(const Params& p, void* base) {
    const int64_t rows = rows16(p);
    coef = static_cast<float*>(base), dscal = coef + rows * kCoef, ds = dscal + rows * kNumScalars;
    dc = ds + rows * p.d, dzq = dc + rows * p.dz, deq = dzq + rows * p.dz, dkhat = deq + rows * p.da;
    dehat = dkhat + rows * p.d;
  }
  static int64_t floats(const Params& p) {
    return rows16(p) * (int64_t(kCoef) + int64_t(kNumScalars) + 2 * p.d + 2 * p.dz + 2 * p.da);
  }
};

// ==== one (query i, key j) pair ===================================================================================
// The formulas both kernels evaluate per pair, from the pair's products; `kp` is the keep test. Separation's pieces:
// the hinge a_ij - δ and the weight w_ij = exp(-d²_ij / τ_sep), φ = w [hinge]_+.

__device__ __forceinline__ float hinge_pos(float h) { return h <= 0.0f ? 0.0f : h; }  // a NaN stays NaN

// |c_i|² of a centroid row (d_z ≤ kMaxL) summed as the forward sums it: per lane of a group over its accumulator
// columns, then the group's butterfly — so the recomputed dc_ij are the forward's.
__device__ __forceinline__ float centroid_sq(const float* c, int64_t dz) {
  float part[4];
  for (int t = 0; t < 4; ++t) {
    part[t] = 0.0f;
    for (int dd = 0; dd < kMaxL / 8; ++dd)
      for (int e = 0; e < 2; ++e) {
        const int64_t cl = 8 * dd + 2 * t + e;
        if (cl < dz) part[t] += c[cl] * c[cl];
      }
  }
  return (part[0] + part[1]) + (part[2] + part[3]);
}

// P_ij from S_ij / τ (-inf on keys not kept) and the row's max and sum; 0 for a row without a kept key.
__device__ __forceinline__ float prob(float s_tau, float m, float l) { return l == 0.0f ? 0.0f : dexp(s_tau - m) / l; }

// d(src) = c1 dS + c2 src + c3 on kept pairs, 0 elsewhere (the term's affine coefficients, Coef).
__device__ __forceinline__ float affine(bool kp, float c1, float c2, float c3, float dS, float src) {
  return kp ? c1 * dS + c2 * src + c3 : 0.0f;
}

// Separation, from dφ (affine): dd²_ij = -(dφ [h]_+ + dρ on kept j ≠ i) w / τ_sep and da_ij = dφ w where h > 0.
struct SepGrad {
  float dd2, da;
};
__device__ __forceinline__ SepGrad sep_grad(bool kp, bool self, float dphi, float hinge, float w, float drho,
                                            float inv_tau_s) {
  const float dw = dphi * hinge_pos(hinge) + (kp && !self ? drho : 0.0f);
  return {-dw * w * inv_tau_s, hinge > 0.0f ? dphi * w : 0.0f};
}

// Cohesion: d(dc_ij) = fc d(raw) + dVar / W w'_ij, and its share of dd²_ij, -(dVar / W dc_ij + dc_i · z_j / W + dW)
// w'_ij / τ_coh (dcz = dc_i · z_j; w' = 0 on keys not kept).
__device__ __forceinline__ float coh_ddc(bool kp, float fcg, float dvw, float wc) { return kp ? fcg + dvw * wc : 0.0f; }
__device__ __forceinline__ float coh_dd2(bool kp, float dvw, float dc, float dcz, float inv_w, float dW, float wc,
                                         float inv_tau_c) {
  return kp ? -(dvw * dc + dcz * inv_w + dW) * wc * inv_tau_c : 0.0f;
}

// ==== the query kernel ============================================================================================

enum class QPass { Sums, Dq, Latent, Coh };

template <class S, QPass kPass>
__global__ void __launch_bounds__(32 * kQWarps, 1)
    ascender_mma_query_kernel(BackwardParams bp, BackWs ws, MmaWorkspace fw) {
  constexpr Kind K = mma::kind_of<S>();
  constexpr int LdD = ld_of<S>(kMaxD), LdL = ld_of<S>(kMaxL);  // the staged tiles' strides
  // kSets<S> sets of the key tiles (k_rot, k, v, e, z, of the inputs' type; |z_j|², 1/|k_j|, 1/|e_j|) and TF32's
  // P scratch.
  constexpr int kSetBytes = 3 * tile_bytes<S>(kMaxD) + 2 * tile_bytes<S>(kMaxL) + 3 * 4 * kTile;
  __shared__ Bytes16 T_words[kSets<S> * kSetBytes / 16];
  unsigned char* const T_ = reinterpret_cast<unsigned char*>(T_words);
  __shared__ float B_[K == Kind::TF32 ? kQWarps * kRows * kPld : 1];
  const Params& p = bp.fwd;
  const int warp = threadIdx.y, g = mma::lane_g(), tt = mma::lane_t();
  const int64_t n = p.T, d = p.d, dz = p.dz, da = p.da, H = p.H;
  const int64_t bh = blockIdx.y, b = bh / H, h = bh % H, t0 = int64_t(blockIdx.x) * kQRows;
  const int64_t tw = t0 + warp * kRows;
  const int64_t dp = padded<K>(d), dzp = padded<K>(dz), dap = padded<K>(da);
  const S *Q = static_cast<const S*>(p.q) + bh * n * d, *KR = static_cast<const S*>(p.k_rot) + bh * n * d;
  const S *KK = static_cast<const S*>(p.k) + bh * n * d, *V = static_cast<const S*>(p.v) + bh * n * d;
  const S *Z = static_cast<const S*>(p.z) + bh * n * dz, *E = static_cast<const S*>(p.e) + bh * n * da;
  const S* GY = static_cast<const S*>(bp.gy) + bh * n * d;
  const S* scal = static_cast<const S*>(p.scalars);
  auto scalar = [&](int s) { return to_acc(scal[s * H + h]); };
  const float *U = fw.u + bh * n * d, *Cr = fw.c + bh * n * dz;
  const float* const kinv = fw.kinv + bh * n;
  const float inv_sqrt_d = 1.0f / sqrtf(float(d)), tau = scalar(kTauScore), inv_tau = 1.0f / tau;
  const float inv_tau_s = static_cast<float>(1 / p.tau_sep[h]), inv_tau_c = static_cast<float>(1 / p.tau_coh[h]);
  const float delta = scalar(kDelta);
  const Visit vis = visit_of(p, t0, kQRows);

  // This lane's rows (g and g + 8 of the warp's), their records and coefficients.
  int64_t row[2] = {tw + g, tw + g + 8};
  const float* rec[2];
  float* coef[2];
  float einv[2], zz[2] = {0, 0}, cc[2] = {0, 0};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = row[r] < n ? row[r] : n - 1;  // rows past n read row n - 1 and write nothing
    rec[r] = fw.rec + (bh * n + i) * kRec;
    coef[r] = ws.coef + (bh * n + i) * kCoef;
    einv[r] = fw.einv[bh * n + i], zz[r] = fw.zsq[bh * n + i];  // as the forward's (MmaWorkspace)
    if (p.use_coh) cc[r] = centroid_sq(Cr + i * dz, dz);        // c_i exists with cohesion
  }

  RowsA<K, kMaxL> ea, za;  // the rows' e and z as A fragments, held
  load_global(ea, E, tw, n, da, dap);
  load_global(za, Z, tw, n, dz, dzp);

  S *KRs, *KHs, *Vs, *Es, *Zs;  // set `set` after use(set)
  float *ZZs, *KN, *EN;         // |z_j|², 1 / max(|k_j|, 1e-12), 1 / max(|e_j|, 1e-8)
  auto use = [&](int set) {
    Carve cv{T_ + set * kSetBytes};
    KRs = cv.tile<S>(kMaxD), KHs = cv.tile<S>(kMaxD), Vs = cv.tile<S>(kMaxD), Es = cv.tile<S>(kMaxL);
    Zs = cv.tile<S>(kMaxL), ZZs = cv.take<float>(kTile), KN = cv.take<float>(kTile), EN = cv.take<float>(kTile);
  };
  float* const scratch = B_ + (K == Kind::TF32 ? warp * kRows * kPld : 0);
  constexpr bool kScores = kPass != QPass::Coh;  // every pass but Coh recomputes S, P and dS
  auto stage_keys = [&](int64_t s0, int set) {
    use(set);
    if (kScores) stage(KRs, LdD, KR, s0, kTile, n, d, dp), stage(Vs, LdD, V, s0, kTile, n, d, dp);
    if (kScores && p.use_align) stage(KHs, LdD, KK, s0, kTile, n, d, dp), fields(KN, fw.kinv + bh * n, s0, n);
    if (kScores && p.use_sep) stage(Es, LdL, E, s0, kTile, n, da, dap), fields(EN, fw.einv + bh * n, s0, n);
    if (p.use_sep || p.use_coh) stage(Zs, LdL, Z, s0, kTile, n, dz, dzp), fields(ZZs, fw.zsq + bh * n, s0, n);
  };
  // The terms' sources over a tile, as the forward's: r = u_i · k̂_j; separation's hinge and weight; dc = |z_j - c_i|²;
  // d² from the z product.
  auto align_tile = [&](FragC(&x)[kNt]) { ascender_mma::align_tile<K>(x, U, tw, n, d, dp, KHs, KN); };
  auto sep_tile = [&](FragC(&hinge)[kNt], FragC(&w)[kNt]) {  // then φ = w [hinge]_+
    mma_tiles::products(hinge, ea, Es, LdL, dap);
    mma_tiles::products(w, za, Zs, LdL, dzp);
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        hinge[j].x[e] = hinge[j].x[e] * einv[e >> 1] * EN[col_of(j, e)] - delta;
        w[j].x[e] = dexp(-dist2(zz[e >> 1], ZZs[col_of(j, e)], w[j].x[e]) * inv_tau_s);
      }
  };
  auto coh_tile = [&](FragC(&x)[kNt]) { ascender_mma::coh_tile<K>(x, Cr, tw, n, dz, dzp, Zs, ZZs, cc); };
  auto d2_tile = [&](FragC(&x)[kNt]) {
    mma_tiles::products(x, za, Zs, LdL, dzp);
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[j].x[e] = dist2(zz[e >> 1], ZZs[col_of(j, e)], x[j].x[e]);
  };
  auto keep_bits = [&](int64_t s0) { return ascender_mma::keep_bits(p, b, h, row, s0); };
  // S / τ (-inf off the kept keys) of a tile, as the forward's pass 3, then P and dP: p_ holds P, dp_ dP.
  auto probabilities = [&](int64_t s0, unsigned kb, FragC(&s)[kNt], FragC(&pp)[kNt], FragC(&dpp)[kNt]) {
    {
      RowsA<K, kMaxD> qa;
      load_global(qa, Q, tw, n, d, dp);
      mma_tiles::products(s, qa, KRs, LdD, dp);
    }
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j].x[e] = s[j].x[e] * inv_sqrt_d + rec[e >> 1][rK0];
    if (p.use_align) {
      align_tile(pp);
#pragma unroll
      for (int j = 0; j < kNt; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j].x[e] += rec[e >> 1][rKa] * pp[j].x[e];
    }
    if (p.use_sep) {
      sep_tile(pp, dpp);
#pragma unroll
      for (int j = 0; j < kNt; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j].x[e] += rec[e >> 1][rKs] * (dpp[j].x[e] * hinge_pos(pp[j].x[e]));
    }
    if (p.use_coh) {
      coh_tile(pp);
#pragma unroll
      for (int j = 0; j < kNt; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j].x[e] += rec[e >> 1][rKc] * pp[j].x[e];
    }
    {
      RowsA<K, kMaxD> ga;
      load_global(ga, GY, tw, n, d, dp);
      mma_tiles::products(dpp, ga, Vs, LdD, dp);
    }
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const bool kp = kb >> (4 * j + e) & 1u;
        float Sj = s[j].x[e];
        if (kp && p.bias) Sj += bias_at<S>(p, b, h, row[r], s0 + col_of(j, e));
        s[j].x[e] = kp ? Sj * inv_tau : neg_inf<float>();
        pp[j].x[e] = kp ? prob(s[j].x[e], rec[r][rMax], rec[r][rSum]) : 0.0f;
      }
  };

  if constexpr (kPass == QPass::Sums) {
    // Per row: Σ P, D = Σ P dP, Σ P dP S/τ and Σ P S/τ (kept keys), and per term x: Σ P x, Σ P dP x; separation's
    // Σ_{h>0} w P, Σ_{h>0} w P dP, and over kept keys Σ_{h>0} w, Σ_{h>0} w φ.
    enum { kP, kD, kG, kHs, kFa, kEa, kFs, kEs, kFc, kEc, kWP, kWPdP, kW, kWphi, kSums };
    float sum[2][kSums] = {};
    for_tiles_pipelined<kSets<S>>(vis, stage_keys, [&](int64_t s0, int set) {
      use(set);
      const unsigned kb = keep_bits(s0);
      FragC s[kNt], pp[kNt], dpp[kNt], x[kNt];
      probabilities(s0, kb, s, pp, dpp);
#pragma unroll
      for (int j = 0; j < kNt; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (kb >> (4 * j + e) & 1u) {
            float* const a = sum[e >> 1];
            const float P = pp[j].x[e], PdP = P * dpp[j].x[e];
            a[kP] += P, a[kD] += PdP, a[kG] += PdP * s[j].x[e], a[kHs] += P * s[j].x[e];
          }
      if (p.use_align) {
        align_tile(x);
#pragma unroll
        for (int j = 0; j < kNt; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (kb >> (4 * j + e) & 1u) {
              float* const a = sum[e >> 1];
              a[kFa] += pp[j].x[e] * x[j].x[e], a[kEa] += pp[j].x[e] * dpp[j].x[e] * x[j].x[e];
            }
      }
      if (p.use_sep) {
        FragC w[kNt];
        sep_tile(x, w);
#pragma unroll
        for (int j = 0; j < kNt; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (kb >> (4 * j + e) & 1u) {
              float* const a = sum[e >> 1];
              const float P = pp[j].x[e], PdP = P * dpp[j].x[e], phi = w[j].x[e] * hinge_pos(x[j].x[e]);
              a[kFs] += P * phi, a[kEs] += PdP * phi;
              if (x[j].x[e] > 0.0f) a[kWP] += w[j].x[e] * P, a[kWPdP] += w[j].x[e] * PdP, a[kW] += w[j].x[e];
              a[kWphi] += w[j].x[e] * phi;  // φ = 0 where h <= 0
            }
      }
      if (p.use_coh) {
        coh_tile(x);
#pragma unroll
        for (int j = 0; j < kNt; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (kb >> (4 * j + e) & 1u) {
              float* const a = sum[e >> 1];
              a[kFc] += pp[j].x[e] * x[j].x[e], a[kEc] += pp[j].x[e] * dpp[j].x[e] * x[j].x[e];
            }
      }
    });
    // The coefficients and scalar shares of each row (bias_backward, standardize_backward and the terms' backward of
    // cuda/ascender_terms.cuh, with Σ_j dS_j x_j = (Σ P dP x - D Σ P x) / τ).
    const bool after = p.after_norm != 0;
    const float om = static_cast<float>(p.omega_scale);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float* const a = sum[r];
#pragma unroll
      for (int k = 0; k < kSums; ++k) a[k] = group_sum(a[k]);
      if (row[r] >= n || tt != 0) continue;
      const float* const o = rec[r];
      float cf[kCoef] = {}, ds[kNumScalars] = {};
      if (o[rSum] != 0.0f) {  // a row without a kept key has no gradient (y_i = 0 whatever the inputs)
        const float D = a[kD];
        cf[cD] = D;
        const float sdS = (D - D * a[kP]) * inv_tau;      // Σ dS (0 up to rounding)
        ds[kTauScore] = -(a[kG] - D * a[kHs]) * inv_tau;  // -Σ gg S / τ² with S = τ (S / τ)
        // One term, raw = f src with src's kept moments (Rec) and the row's Σ dS src: its share of dω, dl (d of its
        // gate after_norm), and P1..P3 of d(raw) = P1 dS + P2 src + P3; returns Σ_kept d(raw) src.
        auto term = [&](int t, int omega, float f, float gate, float sdSx, float& dl, float(&P)[3]) {
          const float cnt = o[rec_stat(t, sCount)], mean = o[rec_stat(t, sMean)], m2 = o[rec_stat(t, sM2)];
          const float sd = o[rec_stat(t, sSd)], scale = o[rec_stat(t, sScale)], w = scalar(omega) * om;
          const float mu = f * mean;
          const float dsn = scale * (f * sdSx - mu * sdS);  // Σ dS (raw - μ) scale
          ds[omega] += dsn * gate * om;
          dl = after ? w * dsn : 0.0f;
          P[0] = P[1] = P[2] = 0.0f;
          if (scale == 0.0f) return 0.0f;  // constant, or nothing kept: no gradient through the term
          const float inv_s = scale, omf = w * gate;
          const float a_ = omf * sdS / cnt, mgx = omf * (f * sdSx - mu * sdS);
          const float cf_ = sd > 0.0f ? mgx / cnt * scale / sd : 0.0f;  // mean(g xc) / (σ s)
          P[0] = omf * inv_s, P[1] = -f * cf_ * inv_s, P[2] = (mu * cf_ - a_) * inv_s;
          // Σ_kept d(raw) src = P1 Σ dS src + P2 Σ src² + P3 Σ src, with Σ src² = M2 + n mean², in the form without
          // the cancellation of n mean² (P2 mean + P3 = -a inv_s)
          return P[0] * sdSx + P[1] * m2 - a_ * inv_s * cnt * mean;
        };
        if (p.use_align) {
          const float fa = o[rFa], la = o[rLa], gam = o[rGammaA];
          float dla, P[3];
          const float gsrc = term(0, kOmegaA, fa, after ? la : 1.0f, (a[kEa] - D * a[kFa]) * inv_tau, dla, P);
          if (!after) dla += gsrc;
          ds[kLambdaA] += dla * gam;
          cf[cDvarA] = dla * scalar(kLambdaA) * gam * (1.0f - gam) * static_cast<float>(-p.alpha_align[h]);
          cf[cA1] = fa * P[0], cf[cA2] = fa * P[1], cf[cA3] = fa * P[2];  // dr = fa d(raw)
        }
        if (p.use_sep) {
          const float ls = o[rLs], eta = o[rEta], rho = o[rRho], kappa = scalar(kKappa);
          const float f = -(after ? 1.0f : ls), fac = after ? 1.0f : ls;  // raw sep = f φ
          float dls, P[3];
          const float gsrc = term(1, kOmegaS, f, after ? ls : 1.0f, (a[kEs] - D * a[kFs]) * inv_tau, dls, P);
          if (!after) dls -= gsrc;
          // dδ = -Σ_{h>0} dφ w, dφ = -fac d(raw)
          const float wdS = (a[kWPdP] - D * a[kWP]) * inv_tau;
          const float dhinge = -fac * (P[0] * wdS + P[1] * a[kWphi] + P[2] * a[kW]);
          ds[kDelta] += -dhinge;
          ds[kLambdaS] += dls * eta;
          const float deta = dls * scalar(kLambdaS);
          if (rho / kappa < 1.0f) {
            cf[cDrho] = deta / kappa;
            ds[kKappa] += -deta * rho / (kappa * kappa);
          }
          cf[cS1] = -fac * P[0], cf[cS2] = -fac * P[1], cf[cS3] = -fac * P[2];
        }
        if (p.use_coh) {
          const float lc = o[rLc], gam = o[rGammaC], var = o[rVarC], W = o[rW];
          const float fc = -(after ? 1.0f : lc * inv_tau_c);  // raw coh = fc dc
          float dlc, P[3];
          const float gsrc = term(2, kOmegaC, fc, after ? lc : 1.0f, (a[kEc] - D * a[kFc]) * inv_tau, dlc, P);
          if (!after) dlc -= gsrc * inv_tau_c;
          ds[kLambdaC] += dlc * gam;
          const float dvar = dlc * scalar(kLambdaC) * gam * (1.0f - gam) * static_cast<float>(-p.alpha_coh[h]);
          cf[cDW] = -dvar * var / W, cf[cDvw] = dvar / W;
          cf[cC1] = fc * P[0], cf[cC2] = fc * P[1], cf[cC3] = fc * P[2];  // fc d(raw); + dVar / W w' in coh_ddc
        }
      }
      for (int k = 0; k < kCoef; ++k) coef[r][k] = cf[k];
      float* const dso = ws.dscal + (bh * n + row[r]) * kNumScalars;
      for (int k = 0; k < kNumScalars; ++k) dso[k] = ds[k];
    }
  } else if constexpr (kPass == QPass::Dq) {
    // dq_i = Σ_j dS_ij k_rot_j / √d;  du_i = Σ_j dr_ij k̂_j (dr / |k_j| times the raw keys)
    FragC dq[kMaxD / 8] = {}, du[kMaxD / 8] = {};
    float c[2][4];
#pragma unroll
    for (int r = 0; r < 2; ++r)
      c[r][0] = coef[r][cD], c[r][1] = coef[r][cA1], c[r][2] = coef[r][cA2], c[r][3] = coef[r][cA3];
    for_tiles_pipelined<kSets<S>>(vis, stage_keys, [&](int64_t s0, int set) {
      use(set);
      const unsigned kb = keep_bits(s0);
      FragC s[kNt], pp[kNt], dpp[kNt];
      probabilities(s0, kb, s, pp, dpp);
#pragma unroll
      for (int j = 0; j < kNt; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) pp[j].x[e] = pp[j].x[e] * (dpp[j].x[e] - c[e >> 1][0]) * inv_tau;  // dS
      times_tile<K, kMaxD>(dq, pp, KRs, LdD, dp, scratch);
      if (p.use_align) {
        align_tile(s);
#pragma unroll
        for (int j = 0; j < kNt; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float* const cr = c[e >> 1];
            s[j].x[e] = affine(kb >> (4 * j + e) & 1u, cr[1], cr[2], cr[3], pp[j].x[e], s[j].x[e]) * KN[col_of(j, e)];
          }
        times_tile<K, kMaxD>(du, s, KHs, LdD, dp, scratch);
      }
    });
    float* const dqo = static_cast<float*>(bp.dq) + bh * n * d;
    float* const dso = ws.ds + bh * n * d;
    const int64_t* nbr = p.saved_nbr;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // ds = -2 s / m² dVar + (du - u (u · du)) / |s| (nothing where the headings cancel), s = Σ_{l∈N(i)} k̂_l summed
      // again in the forward's order.
      const int64_t i = row[r] < n ? row[r] : n - 1;
      const float* const o = rec[r];
      const int m = o[rNbr] < 0.0f ? 0 : static_cast<int>(o[rNbr]);
      const float snorm = o[rSnorm], cdiv = m > 0 ? float(m) : 1.0f, dvar = coef[r][cDvarA];
      const bool cancelled = snorm <= static_cast<float>(kConstantRow) * float(m);
      float dot = 0.0f;
#pragma unroll
      for (int dd = 0; dd < kMaxD / 8; ++dd)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t cl = 8 * dd + 2 * tt + e;
          if (cl < d && p.use_align) dot += U[i * d + cl] * du[dd].x[2 * r + e];
        }
      dot = group_sum(dot);
      if (row[r] >= n) continue;
#pragma unroll
      for (int dd = 0; dd < kMaxD / 8; ++dd)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t cl = 8 * dd + 2 * tt + e;
          if (cl >= d) continue;
          dqo[i * d + cl] = dq[dd].x[2 * r + e] * inv_sqrt_d;
          if (!p.use_align) continue;
          float sv = 0.0f;
          for (int t = 0; t < m; ++t) {
            const int64_t l = nbr[(bh * n + i) * p.saved_nbr_k + t];
            sv += to_acc(KK[l * d + cl]) * kinv[l];
          }
          const float u = U[i * d + cl], g_u = du[dd].x[2 * r + e];
          const float dn = cancelled ? 0.0f : (g_u - u * dot) / snorm;
          dso[i * d + cl] = -2.0f * sv / (cdiv * cdiv) * dvar + dn;
        }
    }
  } else if constexpr (kPass == QPass::Latent) {
    // dê_i = Σ_j da_ij ê_j; dc_i = -2 Σ_j ddc_ij (z_j - c_i); separation's dz_i = 2 Σ_j dd²_ij (z_i - z_j).
    FragC de[kMaxL / 8] = {}, dcz[kMaxL / 8] = {}, dzz[kMaxL / 8] = {};
    float sum_ddc[2] = {0, 0}, sum_dd2[2] = {0, 0};
    for_tiles_pipelined<kSets<S>>(vis, stage_keys, [&](int64_t s0, int set) {
      use(set);
      const unsigned kb = keep_bits(s0);
      FragC s[kNt], pp[kNt], dpp[kNt];
      probabilities(s0, kb, s, pp, dpp);
#pragma unroll
      for (int j = 0; j < kNt; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) pp[j].x[e] = pp[j].x[e] * (dpp[j].x[e] - coef[e >> 1][cD]) * inv_tau;  // dS
      if (p.use_sep) {
        FragC hg[kNt], w[kNt];
        sep_tile(hg, w);
#pragma unroll
        for (int j = 0; j < kNt; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float* const cr = coef[e >> 1];
            const bool kp = kb >> (4 * j + e) & 1u;
            const float phi = w[j].x[e] * hinge_pos(hg[j].x[e]);
            const float dphi = affine(kp, cr[cS1], cr[cS2], cr[cS3], pp[j].x[e], phi);
            const SepGrad sg =
                sep_grad(kp, row[e >> 1] == s0 + col_of(j, e), dphi, hg[j].x[e], w[j].x[e], cr[cDrho], inv_tau_s);
            // The products read their A operands rounded (as_operand): the sums beside them take the same values, or
            // z_i Σ dd² - Σ dd² z_j would not cancel where it should.
            const float dd2 = as_operand<K>(sg.dd2);
            sum_dd2[e >> 1] += dd2;
            hg[j].x[e] = sg.da * EN[col_of(j, e)];  // da / |e_j|, times the raw e_j
            w[j].x[e] = dd2;
          }
        times_tile<K, kMaxL>(de, hg, Es, LdL, dap, scratch);
        times_tile<K, kMaxL>(dzz, w, Zs, LdL, dzp, scratch);
      }
      if (p.use_coh) {
        FragC dc[kNt], wc[kNt];
        coh_tile(dc);
        d2_tile(wc);
#pragma unroll
        for (int j = 0; j < kNt; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float* const cr = coef[e >> 1];
            const bool kp = kb >> (4 * j + e) & 1u;
            const float w = kp ? dexp(-wc[j].x[e] * inv_tau_c) : 0.0f;
            const float fcg = affine(kp, cr[cC1], cr[cC2], cr[cC3], pp[j].x[e], dc[j].x[e]);
            dc[j].x[e] = as_operand<K>(coh_ddc(kp, fcg, cr[cDvw], w));  // as the product reads it
            sum_ddc[e >> 1] += dc[j].x[e];
          }
        times_tile<K, kMaxL>(dcz, dc, Zs, LdL, dzp, scratch);
      }
    });
    float* const deo = ws.deq + bh * n * da;
    float* const dco = ws.dc + bh * n * dz;
    float* const dzo = ws.dzq + bh * n * dz;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum_ddc[r] = group_sum(sum_ddc[r]), sum_dd2[r] = group_sum(sum_dd2[r]);
      const int64_t i = row[r] < n ? row[r] : n - 1;
      float cdot = 0.0f;  // dc_i · c_i
#pragma unroll
      for (int dd = 0; dd < kMaxL / 8; ++dd)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t cl = 8 * dd + 2 * tt + e;
          if (cl < dz && p.use_coh)
            cdot += -2.0f * (dcz[dd].x[2 * r + e] - Cr[i * dz + cl] * sum_ddc[r]) * Cr[i * dz + cl];
        }
      cdot = group_sum(cdot);
      if (row[r] >= n) continue;
      if (tt == 0) coef[r][cDW] -= cdot / rec[r][rW];  // dW = -dVar Var / W - dc · c / W
#pragma unroll
      for (int dd = 0; dd < kMaxL / 8; ++dd)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t cl = 8 * dd + 2 * tt + e;
          if (cl < da) deo[i * da + cl] = de[dd].x[2 * r + e];
          if (cl < dz) {
            const float c_i = p.use_coh ? Cr[i * dz + cl] : 0.0f;
            dco[i * dz + cl] = -2.0f * (dcz[dd].x[2 * r + e] - c_i * sum_ddc[r]);
            dzo[i * dz + cl] = 2.0f * (as_operand<K>(to_acc(Z[i * dz + cl])) * sum_dd2[r] - dzz[dd].x[2 * r + e]);
          }
        }
    }
  } else {
    // Cohesion's share of dd²_ij, which needs dc_i: dz_i += 2 Σ_j dd²_ij (z_i - z_j).
    FragC dzz[kMaxL / 8] = {};
    float sum_dd2[2] = {0, 0};
    float inv_w[2], dvw[2], dW[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) inv_w[r] = 1.0f / rec[r][rW], dvw[r] = coef[r][cDvw], dW[r] = coef[r][cDW];
    const float* const dC = ws.dc + bh * n * dz;
    for_tiles_pipelined<kSets<S>>(vis, stage_keys, [&](int64_t s0, int set) {
      use(set);
      const unsigned kb = keep_bits(s0);
      FragC dc[kNt], wc[kNt], dcz[kNt];
      coh_tile(dc);
      d2_tile(wc);
      {
        RowsA<K, kMaxL> dca;
        load_global(dca, dC, tw, n, dz, dzp);
        mma_tiles::products(dcz, dca, Zs, LdL, dzp);
      }
#pragma unroll
      for (int j = 0; j < kNt; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          const bool kp = kb >> (4 * j + e) & 1u;
          const float w = kp ? dexp(-wc[j].x[e] * inv_tau_c) : 0.0f;
          dc[j].x[e] = as_operand<K>(coh_dd2(kp, dvw[r], dc[j].x[e], dcz[j].x[e], inv_w[r], dW[r], w, inv_tau_c));
          sum_dd2[r] += dc[j].x[e];
        }
      times_tile<K, kMaxL>(dzz, dc, Zs, LdL, dzp, scratch);
    });
    float* const dzo = ws.dzq + bh * n * dz;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum_dd2[r] = group_sum(sum_dd2[r]);
      if (row[r] >= n) continue;
#pragma unroll
      for (int dd = 0; dd < kMaxL / 8; ++dd)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t cl = 8 * dd + 2 * tt + e;
          if (cl < dz)
            dzo[row[r] * dz + cl] +=
                2.0f * (as_operand<K>(to_acc(Z[row[r] * dz + cl])) * sum_dd2[r] - dzz[dd].x[2 * r + e]);
        }
    }
  }
}

// ==== the key kernel ==============================================================================================

enum class KPass { Values, Latent };

// The query rows' fields a key block stages per tile (QF: from Rec and Coef), (kQF, kTile).
enum QField : int {
  qMax,
  qSum,
  qK0,
  qKa,
  qKs,
  qKc,
  qZZ,
  qCC,
  qEN,
  qD,
  qA1,
  qA2,
  qA3,
  qS1,
  qS2,
  qS3,
  qDrho,
  qC1,
  qC2,
  qC3,
  qDvw,
  qInvW,
  qDW,
  kQF
};

template <class S, KPass kPass>
__global__ void __launch_bounds__(32 * kKWarps, 1)
    ascender_mma_key_kernel(BackwardParams bp, BackWs ws, MmaWorkspace fw) {
  constexpr Kind K = mma::kind_of<S>();
  constexpr int LdD = ld_of<S>(kMaxD), LdL = ld_of<S>(kMaxL);  // the strides of the inputs' staged tiles
  // The query tiles: q, dy (d wide), u (float32), e, z (latent wide), c (float32); their fields; TF32's scratch;
  // N(i)'s membership. Values reuses the latent tiles' space for the ds rows, Latent the q tile's for the dc rows
  // (both float32, after the products).
  constexpr int kLatentBytes = 2 * tile_bytes<S>(kMaxL) + tile_bytes<float>(kMaxL);
  __shared__ Bytes16 T_words[(2 * tile_bytes<S>(kMaxD) + tile_bytes<float>(kMaxD) + kLatentBytes) / 16];
  unsigned char* const T_ = reinterpret_cast<unsigned char*>(T_words);
  __shared__ float F_[kQF * kTile];
  __shared__ float B_[kKWarps * kRows * kPld];
  __shared__ uint32_t memb[kTile];
  static_assert(tile_bytes<float>(kMaxD) <= kLatentBytes, "the ds rows fit the latent tiles' space");
  static_assert(tile_bytes<float>(kMaxL) <= tile_bytes<S>(kMaxD), "the dc rows fit the q tile's space");
  const Params& p = bp.fwd;
  const int warp = threadIdx.y, g = mma::lane_g(), tt = mma::lane_t();
  const int64_t n = p.T, d = p.d, dz = p.dz, da = p.da, H = p.H;
  const int64_t bh = blockIdx.y, b = bh / H, h = bh % H, j0 = int64_t(blockIdx.x) * kKRows;
  const int64_t kw = j0 + warp * kRows;  // the warp's first key
  const int64_t dp = padded<K>(d), dzp = padded<K>(dz), dap = padded<K>(da);
  const S *Q = static_cast<const S*>(p.q) + bh * n * d, *KR = static_cast<const S*>(p.k_rot) + bh * n * d;
  const S *KK = static_cast<const S*>(p.k) + bh * n * d, *V = static_cast<const S*>(p.v) + bh * n * d;
  const S *Z = static_cast<const S*>(p.z) + bh * n * dz, *E = static_cast<const S*>(p.e) + bh * n * da;
  const S* GY = static_cast<const S*>(bp.gy) + bh * n * d;
  const S* scal = static_cast<const S*>(p.scalars);
  const float *U = fw.u + bh * n * d, *Cr = fw.c + bh * n * dz;
  const float inv_sqrt_d = 1.0f / sqrtf(float(d)), inv_tau = 1.0f / to_acc(scal[kTauScore * H + h]);
  const float inv_tau_s = static_cast<float>(1 / p.tau_sep[h]), inv_tau_c = static_cast<float>(1 / p.tau_coh[h]);
  const float delta = to_acc(scal[kDelta * H + h]);
  const Visit vis = visit_of(p, j0, kKRows);  // the query rows that keep one of these keys (symmetric to the rows')

  // This lane's keys (rows g, g + 8 of the warp's): their inverse norms and |z_j|² (MmaWorkspace).
  int64_t key[2] = {kw + g, kw + g + 8};
  float kn[2], en[2], zz[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t j = bh * n + (key[r] < n ? key[r] : n - 1);
    kn[r] = fw.kinv[j], en[r] = fw.einv[j], zz[r] = fw.zsq[j];
  }
  Carve cv{T_};
  S* const Qs = cv.tile<S>(kMaxD);
  S* const DYs = cv.tile<S>(kMaxD);
  float* const Us = cv.tile<float>(kMaxD);
  S* const Es = cv.tile<S>(kMaxL);
  S* const Zs = cv.tile<S>(kMaxL);
  float* const Cs = cv.tile<float>(kMaxL);
  float* const DSs = reinterpret_cast<float*>(Es);  // Values: the ds rows, after the products
  float* const DCs = reinterpret_cast<float*>(Qs);  // Latent: the dc rows, after the products
  float* const scratch = B_ + warp * kRows * kPld;
  auto F = [&](int f, int q) { return F_[f * kTile + q]; };

  auto stage_queries = [&](int64_t s0) {
    __syncthreads();
    stage(Qs, LdD, Q, s0, kTile, n, d, dp), stage(DYs, LdD, GY, s0, kTile, n, d, dp);
    if (p.use_align) stage(Us, kLdD, U, s0, kTile, n, d, dp);
    if (p.use_sep) stage(Es, LdL, E, s0, kTile, n, da, dap);
    if (p.use_sep || p.use_coh) stage(Zs, LdL, Z, s0, kTile, n, dz, dzp);
    if (p.use_coh) stage(Cs, kLdL, Cr, s0, kTile, n, dz, dzp);
    for (int q = block_thread(); q < kTile; q += block_threads()) {
      const int64_t i = s0 + q < n ? s0 + q : n - 1;
      const float* const o = fw.rec + (bh * n + i) * kRec;
      const float* const c = ws.coef + (bh * n + i) * kCoef;
      const float zq = fw.zsq[bh * n + i];
      const float cq = p.use_coh ? centroid_sq(Cr + i * dz, dz) : 0.0f;
      const float vals[kQF] = {o[rMax],
                               s0 + q < n ? o[rSum] : 0.0f,
                               o[rK0],
                               o[rKa],
                               o[rKs],
                               o[rKc],
                               zq,
                               cq,
                               fw.einv[bh * n + i],
                               c[cD],
                               c[cA1],
                               c[cA2],
                               c[cA3],
                               c[cS1],
                               c[cS2],
                               c[cS3],
                               c[cDrho],
                               c[cC1],
                               c[cC2],
                               c[cC3],
                               c[cDvw],
                               1.0f / o[rW],
                               c[cDW]};
      for (int f = 0; f < kQF; ++f) F_[f * kTile + q] = vals[f];
      if (kPass == KPass::Values) {  // which of this block's keys are in N(i)
        uint32_t bits = 0;
        const int64_t* nb = p.saved_nbr ? p.saved_nbr + (bh * n + i) * p.saved_nbr_k : nullptr;
        const int m = nb && s0 + q < n && p.use_align && o[rNbr] > 0.0f ? static_cast<int>(o[rNbr]) : 0;
        for (int t = 0; t < m; ++t)
          if (nb[t] >= j0 && nb[t] < j0 + kKRows) bits |= 1u << (nb[t] - j0);
        memb[q] = bits;
      }
    }
    staged();
  };
  // Entry e of accumulator tile jt: key row key[e >> 1], query column s0 + col_of(jt, e).
  auto keep_bits = [&](int64_t s0) { return ascender_mma::keep_bits<true>(p, b, h, key, s0); };
  // The transposed products: key rows (A, from global memory) times a staged query tile (B).
  // A tile is S (the inputs) or float (u, c, ds, dc), each with its own stride.
  auto products_d = [&](FragC(&x)[kNt], const S* src, const auto* tile) {
    RowsA<K, kMaxD> a;
    load_global(a, src, kw, n, d, dp);
    mma_tiles::products(x, a, tile, ld_of<std::remove_cv_t<std::remove_pointer_t<decltype(tile)>>>(kMaxD), dp);
  };
  auto products_l = [&](FragC(&x)[kNt], const S* src, int64_t width, int64_t wp, const auto* tile) {
    RowsA<K, kMaxL> a;
    load_global(a, src, kw, n, width, wp);
    mma_tiles::products(x, a, tile, ld_of<std::remove_cv_t<std::remove_pointer_t<decltype(tile)>>>(kMaxL), wp);
  };
  auto r_tile = [&](FragC(&x)[kNt]) {  // r_ij = u_i · k̂_j
    products_d(x, KK, Us);
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[j].x[e] *= kn[e >> 1];
  };
  auto sep_tile = [&](FragC(&hinge)[kNt], FragC(&w)[kNt]) {  // a_ij - δ and w_ij
    products_l(hinge, E, da, dap, Es);
    products_l(w, Z, dz, dzp, Zs);
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int q = col_of(j, e);
        hinge[j].x[e] = hinge[j].x[e] * F(qEN, q) * en[e >> 1] - delta;
        w[j].x[e] = dexp(-dist2(F(qZZ, q), zz[e >> 1], w[j].x[e]) * inv_tau_s);
      }
  };
  auto dc_tile = [&](FragC(&x)[kNt]) {  // dc_ij = |z_j - c_i|²
    products_l(x, Z, dz, dzp, Cs);
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[j].x[e] = dist2(zz[e >> 1], F(qCC, col_of(j, e)), x[j].x[e]);
  };
  auto d2_tile = [&](FragC(&x)[kNt]) {
    products_l(x, Z, dz, dzp, Zs);
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[j].x[e] = dist2(F(qZZ, col_of(j, e)), zz[e >> 1], x[j].x[e]);
  };
  // P and dS of a tile (dS into ds, P into pp); s and x are scratch.
  auto probabilities = [&](int64_t s0, unsigned kb, FragC(&pp)[kNt], FragC(&ds)[kNt], FragC(&x)[kNt]) {
    products_d(ds, KR, Qs);
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[j].x[e] = ds[j].x[e] * inv_sqrt_d + F(qK0, col_of(j, e));
    if (p.use_align) {
      r_tile(x);
#pragma unroll
      for (int j = 0; j < kNt; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) ds[j].x[e] += F(qKa, col_of(j, e)) * x[j].x[e];
    }
    if (p.use_sep) {
      sep_tile(x, pp);
#pragma unroll
      for (int j = 0; j < kNt; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) ds[j].x[e] += F(qKs, col_of(j, e)) * (pp[j].x[e] * hinge_pos(x[j].x[e]));
    }
    if (p.use_coh) {
      dc_tile(x);
#pragma unroll
      for (int j = 0; j < kNt; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) ds[j].x[e] += F(qKc, col_of(j, e)) * x[j].x[e];
    }
    products_d(x, V, DYs);  // dP_ij = dy_i · v_j
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int q = col_of(j, e);
        const bool kp = kb >> (4 * j + e) & 1u;
        float Sj = ds[j].x[e];
        if (kp && p.bias) Sj += bias_at<S>(p, b, h, s0 + q, key[e >> 1]);
        const float P = kp ? prob(Sj * inv_tau, F(qMax, q), F(qSum, q)) : 0.0f;
        pp[j].x[e] = P;
        ds[j].x[e] = P * (x[j].x[e] - F(qD, q)) * inv_tau;
      }
  };

  if constexpr (kPass == KPass::Values) {
    // dv_j = Σ_i P_ij dy_i;  dk_rot_j = Σ_i dS_ij q_i / √d;  dk̂_j = Σ_i dr_ij u_i + Σ_{i: j∈N(i)} ds_i
    FragC dv[kMaxD / 8] = {}, dkr[kMaxD / 8] = {}, dkh[kMaxD / 8] = {};
    for_tiles(vis, [&](int64_t s0) {
      stage_queries(s0);
      const unsigned kb = keep_bits(s0);
      FragC pp[kNt], ds[kNt], x[kNt];
      probabilities(s0, kb, pp, ds, x);
      times_tile<K, kMaxD>(dv, pp, DYs, LdD, dp, scratch);
      times_tile<K, kMaxD>(dkr, ds, Qs, LdD, dp, scratch);
      if (p.use_align) {
        r_tile(x);
#pragma unroll
        for (int j = 0; j < kNt; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int q = col_of(j, e);
            x[j].x[e] = affine(kb >> (4 * j + e) & 1u, F(qA1, q), F(qA2, q), F(qA3, q), ds[j].x[e], x[j].x[e]);
          }
      }
      __syncthreads();  // the latent tiles are read no more: the ds rows take their place
      if (p.use_align) stage(DSs, kLdD, ws.ds + bh * n * d, s0, kTile, n, d, dp);
      staged();
      if (p.use_align) {
        times_tile<K, kMaxD>(dkh, x, Us, kLdD, dp, scratch);
        // The neighbourhoods' share, summed in float32 in the order of the rows (a product would round ds_i to the
        // operands' precision, and ds is large where a row's headings nearly cancel).
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int kr = static_cast<int>(key[r] - j0);
          for (int q = 0; q < kTile; ++q) {
            if (!(memb[q] >> kr & 1u)) continue;
#pragma unroll
            for (int dd = 0; dd < kMaxD / 8; ++dd)
#pragma unroll
              for (int e = 0; e < 2; ++e) dkh[dd].x[2 * r + e] += DSs[q * kLdD + 8 * dd + 2 * tt + e];
          }
        }
      }
    });
    float* const dvo = static_cast<float*>(bp.dv) + bh * n * d;
    float* const dkro = static_cast<float*>(bp.dkr) + bh * n * d;
    float* const dkho = ws.dkhat + bh * n * d;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (key[r] >= n) continue;
#pragma unroll
      for (int dd = 0; dd < kMaxD / 8; ++dd)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t cl = 8 * dd + 2 * tt + e;
          if (cl >= d) continue;
          dvo[key[r] * d + cl] = dv[dd].x[2 * r + e];
          dkro[key[r] * d + cl] = dkr[dd].x[2 * r + e] * inv_sqrt_d;
          dkho[key[r] * d + cl] = dkh[dd].x[2 * r + e];
        }
    }
  } else {
    // dê_j = Σ_i da_ij ê_i (+ the query side's);  dz_j = 2 z_j Σ_i (ddc_ij + dd²_ij) - 2 Σ_i ddc_ij c_i
    // - 2 Σ_i dd²_ij z_i + Σ_i w'_ij / W_i dc_i (+ the query side's)
    FragC de[kMaxL / 8] = {}, dzk[kMaxL / 8] = {};
    float sum_z[2] = {0, 0};
    for_tiles(vis, [&](int64_t s0) {
      stage_queries(s0);
      const unsigned kb = keep_bits(s0);
      FragC pp[kNt], ds[kNt], x[kNt];
      probabilities(s0, kb, pp, ds, x);
      __syncthreads();  // the q tile is read no more: the dc rows take its place
      if (p.use_coh) stage(DCs, kLdL, ws.dc + bh * n * dz, s0, kTile, n, dz, dzp);
      staged();
      FragC dd2[kNt] = {};
      if (p.use_sep) {
        FragC hg[kNt];
        sep_tile(hg, x);
#pragma unroll
        for (int j = 0; j < kNt; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int q = col_of(j, e);
            const bool kp = kb >> (4 * j + e) & 1u;
            const float phi = x[j].x[e] * hinge_pos(hg[j].x[e]);
            const float dphi = affine(kp, F(qS1, q), F(qS2, q), F(qS3, q), ds[j].x[e], phi);
            const SepGrad sg = sep_grad(kp, s0 + q == key[e >> 1], dphi, hg[j].x[e], x[j].x[e], F(qDrho, q), inv_tau_s);
            dd2[j].x[e] = sg.dd2;
            hg[j].x[e] = sg.da * F(qEN, q);  // da / |e_i|, times the raw e_i
          }
        times_tile<K, kMaxL>(de, hg, Es, LdL, dap, scratch);
      }
      if (p.use_coh) {
        FragC dc[kNt], wc[kNt];
        dc_tile(dc);
        d2_tile(wc);
        products_l(x, Z, dz, dzp, DCs);  // dc_i · z_j
#pragma unroll
        for (int j = 0; j < kNt; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int q = col_of(j, e);
            const bool kp = kb >> (4 * j + e) & 1u;
            const float w = kp ? dexp(-wc[j].x[e] * inv_tau_c) : 0.0f;
            const float fcg = affine(kp, F(qC1, q), F(qC2, q), F(qC3, q), ds[j].x[e], dc[j].x[e]);
            const float ddc = as_operand<K>(coh_ddc(kp, fcg, F(qDvw, q), w));  // as the product reads it
            dd2[j].x[e] += coh_dd2(kp, F(qDvw, q), dc[j].x[e], x[j].x[e], F(qInvW, q), F(qDW, q), w, inv_tau_c);
            sum_z[e >> 1] += ddc;
            wc[j].x[e] = w * F(qInvW, q);  // w' / W, times the dc rows
            dc[j].x[e] = -2.0f * ddc;      // times the centroids
          }
        times_tile<K, kMaxL>(dzk, wc, DCs, kLdL, dzp, scratch);
        times_tile<K, kMaxL>(dzk, dc, Cs, kLdL, dzp, scratch);
      }
#pragma unroll
      for (int j = 0; j < kNt; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          dd2[j].x[e] = as_operand<K>(dd2[j].x[e]);  // the sum takes what the product reads
          sum_z[e >> 1] += dd2[j].x[e], dd2[j].x[e] *= -2.0f;
        }
      times_tile<K, kMaxL>(dzk, dd2, Zs, LdL, dzp, scratch);
    });
    float* const dzo = static_cast<float*>(bp.dz) + bh * n * dz;
    float* const deo = ws.dehat + bh * n * da;
    const float *dzq = ws.dzq + bh * n * dz, *deq = ws.deq + bh * n * da;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum_z[r] = group_sum(sum_z[r]);
      if (key[r] >= n) continue;
      const int64_t j = key[r];
#pragma unroll
      for (int dd = 0; dd < kMaxL / 8; ++dd)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t cl = 8 * dd + 2 * tt + e;
          if (cl < da) deo[j * da + cl] = deq[j * da + cl] + de[dd].x[2 * r + e];
          if (cl < dz)
            dzo[j * dz + cl] =
                dzq[j * dz + cl] + (2.0f * as_operand<K>(to_acc(Z[j * dz + cl])) * sum_z[r] + dzk[dd].x[2 * r + e]);
        }
    }
  }
}

// Each learnable scalar's gradient of head h: its rows' shares summed over (batch, row) in a fixed order (a thread's
// strided sum, then the block's tree). grid (kNumScalars, H), 256 threads.
__global__ void scalars_kernel(const float* dscal, int64_t B, int64_t H, int64_t T, float* dscalars) {
  __shared__ float red[32];
  const int s = blockIdx.x;
  const int64_t h = blockIdx.y;
  float v = 0.0f;
  for (int64_t x = threadIdx.x; x < B * T; x += blockDim.x) {
    const int64_t b = x / T, i = x % T;
    v += dscal[((b * H + h) * T + i) * kNumScalars + s];
  }
  v = rows::row_reduce(v, rows::SumOp{}, red);
  if (threadIdx.x == 0) dscalars[s * H + h] = v;
}

cudaError_t checked(cudaError_t e) { return e != cudaSuccess ? e : cudaGetLastError(); }

template <class S>
cudaError_t backward_for(FloatElem t, const BackwardParams& bp, const void* forward_ws, void* workspace,
                         cudaStream_t stream) {
  const Params& p = bp.fwd;
  const MmaWorkspace fw(p, const_cast<void*>(forward_ws));
  const BackWs ws(p, workspace);
  const unsigned BH = grid_dim(p.B * p.H, kMaxGridYZ);
  const dim3 qgrid(grid_dim((p.T + kQRows - 1) / kQRows), BH), qblock(32, kQWarps);
  const dim3 kgrid(grid_dim((p.T + kKRows - 1) / kKRows), BH), kblock(32, kKWarps);
  cudaError_t err = cudaSuccess;
  auto run = [&](auto kernel, dim3 grid, dim3 block) {
    if (err == cudaSuccess) err = checked(launch_kernel(kernel, grid, block, stream, bp, ws, fw));
  };
  run(ascender_mma_query_kernel<S, QPass::Sums>, qgrid, qblock);
  if (err == cudaSuccess)
    err = checked(launch_kernel(scalars_kernel, dim3(kNumScalars, grid_dim(p.H, kMaxGridYZ)), dim3(256), stream,
                                static_cast<const float*>(ws.dscal), p.B, p.H, p.T, static_cast<float*>(bp.dscalars)));
  run(ascender_mma_query_kernel<S, QPass::Dq>, qgrid, qblock);
  if (p.use_sep || p.use_coh) run(ascender_mma_query_kernel<S, QPass::Latent>, qgrid, qblock);
  if (p.use_coh) run(ascender_mma_query_kernel<S, QPass::Coh>, qgrid, qblock);
  run(ascender_mma_key_kernel<S, KPass::Values>, kgrid, kblock);
  if (p.use_sep || p.use_coh) run(ascender_mma_key_kernel<S, KPass::Latent>, kgrid, kblock);
  if (err != cudaSuccess) return err;
  const int64_t rows = p.B * p.H * p.T;
  err = unit_rows_backward(t, p.k, fw.knorm, ws.dkhat, rows, p.d, 1e-12, bp.dk, stream);
  if (err != cudaSuccess) return err;
  return unit_rows_backward(t, p.e, fw.enorm, ws.dehat, rows, p.da, 1e-8, bp.de, stream);
}

}  // namespace

namespace ascender_launch {

int64_t mma_backward_floats(const Params& p) { return BackWs::floats(p); }

cudaError_t mma_backward(FloatElem t, const BackwardParams& p, const void* forward_ws, void* workspace,
                         cudaStream_t stream) {
  if (p.fwd.B * p.fwd.H == 0 || p.fwd.T == 0) return cudaSuccess;
  return visit_mma_elem(t, [&](auto tag) { return backward_for<decltype(tag)>(t, p, forward_ws, workspace, stream); });
}

}  // namespace ascender_launch
}  // namespace asc::cuda
