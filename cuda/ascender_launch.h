#pragma once
// Launchers of the fused ASCender CUDA kernels (cuda/ascender.cu), called by cuda/ascender.cpp after it has
// validated the tensors. C++17-clean and plain data only (this header is included by a .cu file). Semantics are the
// CPU kernel's (ops/cpu/ascender.cpp, docs/ascender.md): one query row per thread block, every (row, key) quantity
// in shared memory, so a row holds at most max_keys (forward) / max_keys_backward keys.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/float_elem.h"

namespace asc::cuda::ascender_launch {

constexpr int kMaxHeads = 16;  // per-head configuration travels in the kernel's parameters
constexpr int kMaxK = 64;      // neighbourhood size
constexpr int kMaxDim = 256;   // d, d_z, d_a
// The (key) arrays a row keeps: seven in the forward, ten in the backward. They live in 48 KiB of static shared
// memory — with the row's vectors, that holds max_keys / max_keys_backward keys — or, for longer rows, in a global
// workspace of rows_in_flight rows per head (Params::scratch), which the blocks visit grid-strided: memory linear in
// the row's length, within a budget (cuda/ascender.cpp: 256 MiB, or ASC_ASCENDER_SCRATCH_MB).
constexpr int kForwardArrays = 7, kBackwardArrays = 10;
constexpr int64_t max_keys(FloatElem t) { return t == FloatElem::F64 ? 640 : 1280; }
constexpr int64_t max_keys_backward(FloatElem t) { return t == FloatElem::F64 ? 320 : 896; }
// Rows per head a workspace of `budget` bytes holds at once for rows of T keys (at least 1, at most T).
constexpr int64_t rows_in_flight(FloatElem t, int64_t BH, int64_t T, int arrays, int64_t budget) {
  const int64_t per_row = int64_t(arrays) * T * (t == FloatElem::F64 ? 8 : 4) * (BH > 0 ? BH : 1);
  const int64_t rows = budget / (per_row > 0 ? per_row : 1);
  return rows < 1 ? 1 : rows > T ? T : rows;
}

struct Params {
  // q, k_rot, k, v (B, H, T, d), z (B, H, T, d_z), e (B, H, T, d_a) contiguous; scalars (9, H): ω_a, ω_s, ω_c, λ_a,
  // λ_s, λ_c, δ, κ, τ_score; all of one element type. y (B, H, T, d).
  const void *q, *k_rot, *k, *v, *z, *e, *scalars;
  void* y;
  // keep (bool) and bias (element type): element (b, h, i, j) at b*s[0] + h*s[1] + i*s[2] + j*s[3]; nullptr: none.
  const bool* keep;
  int64_t keep_stride[4];
  const void* bias;
  int64_t bias_stride[4];
  int64_t B, H, T, d, dz, da;
  int64_t window, global_tokens;  // window 0: every key
  int include_self, select_by_scores, after_norm, use_align, use_sep, use_coh;
  double norm_eps, omega_scale;
  double constant_row;       // a raw row is constant when σ <= constant_row max|x| (docs/ascender.md §12.3)
  int64_t k_nbr[kMaxHeads];  // neighbourhood size per head
  double tau_sep[kMaxHeads], tau_coh[kMaxHeads], alpha_align[kMaxHeads], alpha_coh[kMaxHeads];
  // Rows longer than the shared-memory kernels hold: the workspace, rows_in_flight × (B·H) × arrays × T elements.
  void* scratch;
  int64_t rows_in_flight;
  // The backward only: the neighbourhoods the forward chose, (B, H, T, saved_nbr_k) int64 (-1 past |N(i)|; -2 first:
  // a NaN among the row's candidates), or null to select them again.
  const int64_t* saved_nbr;
  int64_t saved_nbr_k;
};

// The backward's buffers, all of the compute type: the gradients (B, H, T, ·) — dq, dk, de written, dkr, dv, dz
// accumulated —, dscalars (9, H) accumulated, and workspace: dkhat (B, H, T, d), dehat (B, H, T, d_a) accumulated
// (the gradients w.r.t. the unit keys k̂ and unit embeddings ê), knorm, enorm (B, H, T). Accumulated ones are zero on
// entry.
struct BackwardParams {
  Params fwd;      // the forward's inputs (fwd.y is not read)
  const void* gy;  // dL/dy (B, H, T, d)
  void *dq, *dkr, *dk, *dv, *dz, *de, *dscalars;
  void *dkhat, *dehat, *knorm, *enorm;
};

// Inputs of element type t (bfloat16 / float16 computed in float32). y is of type t; the backward's buffers are of
// the compute type (float32 for bfloat16 / float16, else t).
cudaError_t forward(FloatElem t, const Params& p, cudaStream_t stream);
cudaError_t backward(FloatElem t, const BackwardParams& p, cudaStream_t stream);

// The backward of the unit maps y = x / max(|x|, eps), row by row: dx = (dy - y (y·dy)) / |x| (dy / eps below eps).
// x (rows, cols) of element type t; norm (rows), dy and dx (rows, cols) of its compute type.
cudaError_t unit_rows_backward(FloatElem t, const void* x, const void* norm, const void* dy, int64_t rows, int64_t cols,
                               double eps, void* dx, cudaStream_t stream);

// The tensor-core forward (cuda/ascender_mma.cu), for the inputs mma_takes: bfloat16 / float16, or float32 when TF32
// is allowed; d ≤ 64, d_z and d_a ≤ 32, k ≤ 32. workspace: mma_workspace_floats(p, records) floats (the keys' and
// latents' norms and inverse norms, |z_j|², the rows' u_i and c_i, and with `records` what the backward needs of each
// row). nbr: where N(i)
// goes, (B, H, T, nbr_k) int64 as saved_nbr reads it, or null.
bool mma_takes(FloatElem t, const Params& p, bool allow_tf32);
// Its constant-row threshold: four units of the operands' roundoff (bfloat16 2^-8, float16 and TF32 2^-11).
constexpr double mma_constant_row(FloatElem t) { return t == FloatElem::BF16 ? 4 * 0x1p-8 : 4 * 0x1p-11; }
int64_t mma_workspace_floats(const Params& p, bool records);
cudaError_t mma_forward(FloatElem t, const Params& p, void* workspace, bool records, int64_t* nbr, int64_t nbr_k,
                        cudaStream_t stream);

// The tensor-core backward (cuda/ascender_mma_backward.cu), after mma_forward with records (forward_ws) and, when
// alignment is on, N(i) in p.fwd.saved_nbr. Every gradient is written (none accumulated), by one block in a fixed
// order: float32 results repeat bit for bit. The gradients (p.dq ... p.dscalars) are float32; p.dkhat, p.dehat,
// p.knorm, p.enorm are not used. workspace: mma_backward_floats(p.fwd) floats, zero on entry.
int64_t mma_backward_floats(const Params& p);
cudaError_t mma_backward(FloatElem t, const BackwardParams& p, const void* forward_ws, void* workspace,
                         cudaStream_t stream);

}  // namespace asc::cuda::ascender_launch
