// CPU kernels of fused ASCender attention (ops/ascender.h, docs/ascender.md). Per (batch, head) and block of
// query rows, every (rows, keys) quantity of the reference — base scores, affinities, distances, neighbourhoods,
// kernels, the three raw biases, scores and probabilities — lives in a tile of this thread's workspace; the large
// products are GEMMs (ops/cpu/gemm.h); those with a short side — the (rows, keys) products over the latent widths
// d_z, d_a and the (rows, d_z) ones over the keys — run in a register-blocked kernel (ops/cpu/small_gemm.h). Nothing
// of size (B, H, T, T) is ever allocated. The keys of a block are all T keys, or in windowed mode only the block's
// window, gathered (Keys): O(T·w) per head. The normalised terms β̃ are never stored: each row keeps its μ and σ, and
// β̃ is formed where it is read.
//
// The backward rebuilds each block's tiles from the per-row state the forward kept (RowState: neighbourhoods, the
// terms' means and stds, the centroid, the softmax max and sum) and then runs the chain rule back through them, in
// the reverse order of the forward. Gradients of a key j collect contributions from every query row, so one task owns
// one (batch, head) and walks its row blocks in turn; gradients of the per-head scalars are summed per task and
// reduced after the parallel loop.
//
// This file holds the drivers: forward_block / backward_block call the terms in order, forward_impl / backward_impl
// walk the heads and blocks. The terms themselves, each step's forward beside its backward and the derivation beside
// the backward: ops/cpu/ascender_terms.h (row standardisation, base scores and keep mask, alignment, softmax,
// output) and ops/cpu/ascender_latent_terms.h (separation, cohesion); the block's data: ops/cpu/ascender_block.h.
//
// Loops over a row are written to vectorise: the keep-mask is a float tile, selects read both operands first, and
// nothing from std:: is called inside the no-trapping-math region (such calls do not inline there).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/format.h"
#include "ops/ascender_scalars.h"
#include "ops/cpu/loops.h"
#include "ops/kernels.h"

// The block's data and the terms: each header opens the region below for itself.
#include "ops/cpu/ascender_block.h"
#include "ops/cpu/ascender_latent_terms.h"
#include "ops/cpu/ascender_terms.h"

#include "ops/cpu/vec_region_fma_begin.h"  // the row loops' region, closed by vec_region_end.h at the end

#include "ops/cpu/vec_math.h"  // ASC_CPU_DISPATCH (already included by the headers above, inside their regions)

namespace asc::cpu {
namespace {

// Query rows per block when the config leaves it to the kernel: about 64K elements per (rows, keys) tile (256 KiB in
// float32), between 16 and 128 rows. Larger blocks make the GEMMs more efficient until the block's tiles spill from
// the cache (bench/results/2026-11-26_kernel_tuning_figures.md has the measurements). In windowed mode a block's keys
// number about R + 2w + g whatever n is, so every extra row widens every row's band: at most 64 rows there.
int64_t row_block(const AscenderConfig& cfg, int64_t n) {
  if (cfg.row_block > 0) return cfg.row_block;
  const int64_t keys = cfg.window > 0 ? std::min(n, 2 * cfg.window + cfg.global_tokens) : n;
  return std::clamp<int64_t>(65536 / std::max<int64_t>(keys, 1), 16, cfg.window > 0 ? 64 : 128);
}

// The head's unit keys k̂ and latents ê (docs: normalize_rows): y = x / max(|x|, eps), with the norms kept.
template <class T>
void unit_rows(const T* x, int64_t rows, int64_t cols, double eps, Scratch<T>& out, std::vector<double>& norm) {
  out.resize(rows * cols);
  norm.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    ASC_SIMD_REDUCE(+, s)
    for (int64_t c = 0; c < cols; ++c) s += double(x[r * cols + c]) * x[r * cols + c];
    norm[r] = std::sqrt(s);
    const double inv = 1 / std::max(norm[r], eps);
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = static_cast<T>(x[r * cols + c] * inv);
  }
}

// normalize_rows backward: y = x / max(|x|, eps) -> dx = (dy - y (y·dy)) / |x|, or dy / eps below eps.
template <class T>
void unit_rows_backward(const Scratch<T>& y, const std::vector<double>& norm, const std::vector<double>& dy,
                        int64_t rows, int64_t cols, double eps, T* dx) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* yr = y.data() + r * cols;
    const double* g = dy.data() + r * cols;
    if (norm[r] < eps) {
      for (int64_t c = 0; c < cols; ++c) dx[r * cols + c] = static_cast<T>(g[c] / eps);
      continue;
    }
    double dot = 0;
    ASC_SIMD_REDUCE(+, dot)
    for (int64_t c = 0; c < cols; ++c) dot += yr[c] * g[c];
    for (int64_t c = 0; c < cols; ++c) dx[r * cols + c] = static_cast<T>((g[c] - yr[c] * dot) / norm[r]);
  }
}

// What the forward keeps per query row for the backward, flash-attention style: the values that need passes of their
// own — N(i), each term's μ and σ, the cohesion centroid c_i, the softmax max and 1 / sum — O(T (k + d_z)) per head
// instead of the O(T²) tiles. With them the backward rebuilds a block's tiles without the top-k, the variance passes,
// the centroid product or the softmax reductions. Layout: rows (B, H, T, kFields + d_z) float64 (a Row, then c_i),
// nbr (B, H, T, k_max) int64 (column index, -1 past |N(i)|; kNanNbr in the first slot: a NaN among the row's
// candidates).
struct RowState {
  struct Term {                      // one term's NormStats, less s = σ + eps (rebuilt by get)
    double mu, sd, count, constant;  // constant: 1 or 0
  };
  struct Row {  // the first kFields doubles of a row of `rows`
    Term align, sep, coh;
    double smax, inv_z;  // the softmax's row max (of S/τ) and 1 / Σ e
  };
  static constexpr int64_t kFields = 14;  // 3 × (μ, σ, count, constant), smax, inv_z; then c_i
  static_assert(sizeof(Row) == kFields * sizeof(double), "a Row is the first kFields doubles of a row of the state");
  static constexpr int64_t kNanNbr = -2;
  static Term put(const NormStats& st) { return {st.mu, st.sd, st.count, double(st.constant)}; }
  static NormStats get(const Term& t, double eps) { return {t.mu, t.sd, t.sd + eps, t.count, t.constant != 0}; }
  template <class T>
  static void save(const Block<T>& b, int64_t R, int64_t dz, int64_t kmax, double* rows, int64_t* nbr) {
    for (int64_t r = 0; r < R; ++r) {
      double* p = rows + r * (kFields + dz);
      const Row row{put(b.st_a[r]), put(b.st_s[r]), put(b.st_c[r]), b.smax[r], b.inv_z[r]};
      std::memcpy(p, &row, sizeof(Row));  // the tensor holds doubles: copied, not cast
      double* centroid = p + kFields;
      for (int64_t c = 0; c < dz; ++c) centroid[c] = b.c[r * dz + c];
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
      Row row;
      std::memcpy(&row, p, sizeof(Row));
      b.st_a[r] = get(row.align, eps), b.st_s[r] = get(row.sep, eps), b.st_c[r] = get(row.coh, eps);
      b.smax[r] = row.smax, b.inv_z[r] = row.inv_z;
      const double* centroid = p + kFields;
      for (int64_t c = 0; c < dz; ++c) b.c[r * dz + c] = static_cast<T>(centroid[c]);
      const int64_t* q = nbr + r * kmax;
      b.nan_nbr[r] = q[0] == kNanNbr;
      int64_t cnt = 0;  // one assign per row (push_back is a call per neighbour in this region)
      while (cnt < kmax && q[cnt] >= 0) ++cnt;
      b.nbr[r].assign(q, q + cnt);
    }
  }
};

// The forward of rows [t0, t0 + R) of one head into `b` (sized by the caller). replay = false: the forward proper,
// computing every row statistic. replay = true: the backward rebuilding the block's tiles, with the values of
// RowState already loaded into `b`; the passes that write tiles still run, and recompute their by-products (ρ, W,
// Var) exactly as the forward did.
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE void forward_block(const HeadData<T>& h, const Keys<T>& kt, const AscenderConfig& cfg, int64_t t0,
                                     int64_t R, Block<T>& b, bool replay) {
  products_forward<kIsa>(h, kt, cfg, t0, R, b);  // s0, affinities, z_i · z_j
  keep_mask(h, kt, cfg, t0, R, b);
  if (cfg.use_align) {
    if (!replay) neighbourhoods(h, cfg, kt.m, R, b);
    alignment_forward(h, kt, cfg, R, b, replay);  // u, γ_a, r and its statistics
  }
  if (cfg.use_sep || cfg.use_coh) latent_kernels_forward(h, kt, cfg, t0, R, b, replay);  // w, ρ, η, φ; w', W
  if (cfg.use_coh) cohesion_forward<kIsa>(h, kt, cfg, R, b, replay);                     // c, dc, Var, γ_c
  scores_forward(h, kt, cfg, t0, R, b, replay);                                          // S, e, max, 1 / Σ e
}

// Builds a head's data for (b, h) from the op's contiguous inputs.
template <class T>
HeadData<T> head_data(const AscenderKernelInputs& in, const AscenderConfig& cfg, int64_t b, int64_t hh) {
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
    ASC_SIMD_REDUCE(+, s)
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

int64_t max_k(const AscenderConfig& cfg) {
  int64_t k = 1;
  for (int64_t x : cfg.k) k = std::max(k, x);
  return k;
}

template <class T>
void forward_impl(const AscenderKernelInputs& in, const AscenderConfig& cfg, Tensor& y, AscenderKernelState* state) {
  const int64_t B = in.q.size(0), H = in.q.size(1), Tn = in.q.size(2), d = in.q.size(3), dz = in.z.size(3);
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
        ASC_CPU_DISPATCH(forward_block<kIsa>(h, keys, cfg, t0, R, blk, false));
        output_forward(keys, R, d, blk, yp + (bh * Tn + t0) * d);
        if (state)
          RowState::save(blk, R, dz, kmax, rows_p + (bh * Tn + t0) * (RowState::kFields + dz),
                         nbr_p + (bh * Tn + t0) * kmax);
      }
    }
  });
}

// The backward of rows [t0, t0 + R) of one head: rebuilds the block's tiles (forward_block's replay, from the rows'
// saved state: kFields + d_z doubles per row at `rows`, k_max neighbours at `nbr`), then runs the chain rule.
template <CpuIsa kIsa, class T>
ASC_ALWAYS_INLINE void backward_block(const HeadData<T>& h, const AscenderConfig& cfg, int64_t t0, int64_t R,
                                      const double* rows, const int64_t* nbr, int64_t kmax, BackwardWork<T>& work,
                                      const HeadGrads<T>& out) {
  const int64_t d = h.d, dz = h.dz, da = h.da;
  Block<T>& b = work.b;
  Keys<T>& keys = work.keys;
  keys.select(h, cfg, t0, R);
  b.resize(R, keys.m, d, dz);
  RowState::load(b, R, dz, kmax, rows, nbr, cfg.norm_eps);
  forward_block<kIsa>(h, keys, cfg, t0, R, b, true);
  const int64_t n = keys.m;  // the block's key columns
  // Gradients of the block's keys: in place for full attention, else into (m, ·) buffers scattered at the end.
  const KeyGrads<T> kg = work.key_grads(out, d, da, dz);
  // The gradient tiles (R, n): each is written in full before it is read.
  for (auto* t : {&work.dA, &work.dS, &work.dr, &work.dwc, &work.ddc, &work.daff, &work.tile, &work.dd2})
    t->resize(R * n);
  output_backward(R, d, out.gy + t0 * d, work, kg.dv);  // dV, dA'
  // The chain rule runs row by row through everything that needs no GEMM between its steps — the softmax, then each
  // term from its normalisation down to its tile — so a row's slices of the ~12 tiles stay in the L1/L2 cache
  // instead of each step streaming the whole block again; the GEMMs that combine rows run between these passes.
  if (cfg.use_align) work.dsv.assign(R * d, 0.0);
  if (cfg.use_coh) work.dW.assign(R, 0.0), work.dC.assign(R * dz, T(0));
  work.colsum.assign(n, T(0));  // distances_backward's Σ_i (ddc_ij + dd²_ij)
  for (int64_t r = 0; r < R; ++r) {
    const TermSums sums = softmax_backward_row(h, cfg, work, r, out.ds);       // dS, dτ; the terms' row sums
    if (cfg.use_align) alignment_backward_row(h, cfg, work, r, sums, out.ds);  // dr, ds_i
    if (cfg.use_sep) {
      separation_backward_row(h, cfg, work, r, sums, out.ds);  // da, dd²
    } else if (cfg.use_coh) {
      T* dd2r = work.dd2.data() + r * n;  // cohesion adds to dd² after the row loop
      for (int64_t j = 0; j < n; ++j) dd2r[j] = T(0);
    }
    if (cfg.use_coh) cohesion_backward_row(h, cfg, work, r, sums, out.ds);  // ddc, dw', dW, dC
  }
  base_scores_backward(h, keys, t0, R, work.dS.data(), out.dq, kg.dkr);  // dQ, dKr
  if (cfg.use_align) alignment_backward(h, R, work, kg);                 // dK̂ (r's GEMM and the neighbourhoods)
  if (cfg.use_coh) centroid_backward<kIsa>(h, R, work, kg);              // dz through c_i; dw', dW
  if (cfg.use_sep || cfg.use_coh) distances_backward<kIsa>(h, cfg, t0, R, work, kg, out.dz);  // dz through d²
  if (cfg.use_sep) affinity_backward<kIsa>(h, t0, R, work, kg);                               // dÊ
  work.scatter(kg, out, d, da, dz);
}

template <class T>
void backward_impl(const AscenderKernelInputs& in, const AscenderConfig& cfg, const AscenderKernelState& state,
                   const Tensor& gy_in, TensorList& grads) {
  const int64_t B = in.q.size(0), H = in.q.size(1), Tn = in.q.size(2), d = in.q.size(3);
  const int64_t dz = in.z.size(3), da = in.e.size(3);
  const Tensor gy = gy_in.contiguous();
  // The op's gradients (ops/kernel_list.inc), zeroed: the blocks and heads accumulate into them.
  for (Tensor& g : grads) cpu::fill(g, 0.0);  // this backend's fill kernel, as the CUDA backward zeroes its sums
  Tensor &dq = grads[0], &dkr = grads[1], &dk = grads[2], &dv = grads[3], &dz_t = grads[4], &de = grads[5];
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
        ASC_CPU_DISPATCH(backward_block<kIsa>(h, cfg, t0, R, rows_p + (bh * Tn + t0) * fields,
                                              nbr_p + (bh * Tn + t0) * kmax, kmax, work, out));
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
  T* dsp = grads[6].data_ptr<T>();  // dscalars (9, H)
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int s = 0; s < kNumScalars; ++s)
      dsp[s * H + bh % H] = static_cast<T>(dsp[s * H + bh % H] + dsc[bh * kNumScalars + s]);
}

}  // namespace

void ascender_unsupported(const AscenderKernelInputs& in, const AscenderConfig& cfg, std::string& why) {
  why.clear();
  if (in.q.dtype() != kFloat32 && in.q.dtype() != kFloat64)
    why = fmt::format("dtype {} (the CPU kernel computes in float32 / float64)", in.q.dtype());
}

void ascender_forward(const AscenderKernelInputs& in, const AscenderConfig& cfg, Tensor& y,
                      AscenderKernelState* state) {
  ASC_DISPATCH_FLOAT(in.q.dtype(), "ascender_attention", [&] { forward_impl<scalar_t>(in, cfg, y, state); });
}

void ascender_backward(const AscenderKernelInputs& in, const AscenderConfig& cfg, const AscenderKernelState& state,
                       const Tensor& gy, TensorList& grads) {
  ASC_DISPATCH_FLOAT(in.q.dtype(), "ascender_attention backward",
                     [&] { backward_impl<scalar_t>(in, cfg, state, gy, grads); });
}

}  // namespace asc::cpu

#include "ops/cpu/vec_region_end.h"
