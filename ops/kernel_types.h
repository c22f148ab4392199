#pragma once
// The argument types of the backends' kernels (ops/kernel_list.inc) that are not tensors or numbers: plain data,
// filled by the ops from their user-facing options, so a backend includes this and ops/kernels.h, never an op's
// user header. The ops' headers include it too, so a user sees these types where the ops are.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/math.h"  // math::SurrogateKind

namespace asc {

// ---- the hard gate F = 1[z >= theta] (ops/geometry.h: hard_gate; ops/firing.h: firing_output) --------------------
enum class GateBackward {
  None,             // exact hard gate: zero gradient to z and theta
  StraightThrough,  // dF/dz = 1, dF/dtheta = -1
  Surrogate,        // dF/dz = s'(z - theta) from the named surrogate, dF/dtheta = -s'(z - theta)
};

// A surrogate derivative s'(u; width), integrating to 1 over u, with its name (the registry: ops/geometry.h).
struct Surrogate {
  std::string name;
  std::function<double(double u, double width)> derivative;
  // Set for the built-ins (which also run on CUDA); user entries: none.
  std::optional<math::SurrogateKind> builtin = {};
};

// The gate's backward as every kernel takes it, resolved once from the user's GateOptions by gate_spec()
// (ops/geometry.h), which checks it: the mode, the surrogate's width (finite, > 0) and, in Surrogate mode, the
// registry's entry — copied, so a backward that runs later does not depend on the registry.
struct GateSpec {
  GateBackward mode = GateBackward::None;
  double width = 1.0;
  Surrogate surrogate;  // Surrogate mode only
};

// ---- the SSM scan (ops/firing.h: ssm_scan) ----------------------------------------------------------------------
// The most state channels R the CUDA kernels of ssm_scan take (a row's state lives in one thread block).
inline constexpr int64_t kSsmScanMaxCudaChannels = 1024;

// ---- fused ASCender attention (ops/ascender.h) ------------------------------------------------------------------
// What the fused kernels take (plain data besides the tensors): q, k_rot, k, v (B, H, T, d), z (B, H, T, d_z),
// e (B, H, T, d_a) contiguous, one float dtype; scalars (9, H): ω_align, ω_sep, ω_coh, λ_align, λ_sep, λ_coh, δ, κ,
// τ_score; keep and bias undefined or (B, H, T, T) views (stride 0 on broadcast dims), bias in the heads' dtype.
struct AscenderKernelInputs {
  Tensor q, k_rot, k, v, z, e, scalars, keep, bias;
};
struct AscenderKernelConfig {
  std::vector<int64_t> k;
  std::vector<double> tau_sep, tau_coh, alpha_align, alpha_coh;
  bool include_self = false, select_by_scores = false, after_norm = false;
  bool use_align = true, use_sep = true, use_coh = true;
  double norm_eps = 1e-6, omega_scale = 1.0;
  int64_t window = 0, global_tokens = 0;  // AscenderCoreArgs::window: the key columns of each block of rows
  int64_t row_block = 0;                  // AscenderCoreArgs::row_block
};
// What a backend's forward keeps for its backward besides the inputs, when asked to (undefined: the backward
// recomputes everything). The CPU kernel's per-row statistics (ops/cpu/ascender.cpp, RowState): rows (B, H, T, ·)
// float64, nbr (B, H, T, k_max) int64. O(T (k + d_z)) per head, never (T, T).
struct AscenderKernelState {
  Tensor rows, nbr;
};

// ---- sparse attention over a CSR pattern (ops/sparse_attention.h: SparsePattern) --------------------------------
// Read-only pointers into a pattern's own int64 lists, on its device (valid while the pattern lives).
struct SparsePatternLists {
  const int64_t *row_ptr, *cols, *col_ptr, *col_rows, *col_pos;
};
// The block view the CUDA kernels tile by (SparsePattern explains it); all null on the CPU.
struct SparsePatternBlocks {
  const int64_t *rblk_ptr = nullptr, *rblk_keys = nullptr, *rblk_bits = nullptr;
  const int64_t *kblk_ptr = nullptr, *kblk_rows = nullptr, *kblk_bits = nullptr;
};
// What the kernels read of a pattern: its sizes and lists (SparsePattern::view()).
struct SparsePatternView {
  static constexpr int64_t kRowBlock = 16, kKeyBlock = 8;  // the block view's row and key blocks
  int64_t groups = 0, queries = 0, keys = 0, nnz = 0, max_row = 0;
  SparsePatternLists lists{};
  SparsePatternBlocks blocks{};  // null pointers without a block view
  bool has_blocks() const { return blocks.rblk_ptr != nullptr; }
};

}  // namespace asc
