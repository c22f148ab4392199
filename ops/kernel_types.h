#pragma once
// The argument types of the backends' kernels (ops/kernel_list.inc) that are not tensors or numbers: plain data,
// filled by the ops from their user-facing options, so a backend includes this and ops/kernels.h, never an op's
// user header. The ops' headers include it too, so a user sees these types where the ops are.
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
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
// Where the gates act: before or after the row standardisation (docs/ascender.md §6).
enum class GatePosition {
  BeforeNorm,  // β̃ = normalize(λ γ r): the original order, in which λ, γ_align, η, γ_coh have (almost) no effect
  AfterNorm,  // β̃ = λ γ normalize(r): the gates act
};

// The core's configuration, everything in it that is not a tensor, as one type from the layer to the kernels:
// nn::AscenderAttention fills it as the base of AscenderCoreArgs (ops/ascender.h, which adds the learnable scalars,
// masks and training switches), the op clamps it to the sequence length (ops/ascender.cpp: kernel_config), the CPU
// kernels read it as it is, and the CUDA launcher copies it into the kernels' by-value parameters
// (cuda/ascender_launch.h: Params, per-head values in fixed arrays, as a kernel argument must be).
struct AscenderConfig {
  std::vector<int64_t> k;                                        // (H) neighbourhood sizes
  std::vector<double> tau_sep, tau_coh, alpha_align, alpha_coh;  // (H)
  bool include_self = false;
  bool select_by_scores = false;  // AscenderMode::Reuse: N(i) from the base scores instead of the affinities
  GatePosition gate_position = GatePosition::BeforeNorm;
  bool use_align = true, use_sep = true, use_coh = true;
  double norm_eps = 1e-6;
  // AscenderMode::Windowed when window > 0: row i keeps key j only if |i - j| < window, i < global_tokens or
  // j < global_tokens (ANDed with any keep mask). Given this way, not as a (T, T) mask, the fused kernels visit only
  // the window: O(T (window + global_tokens)) per head.
  int64_t window = 0, global_tokens = 0;
  double omega_scale = 1.0;  // the schedule's warm-up factor m_ω on every ω
  int64_t row_block = 0;     // query rows per tile of the fused CPU kernel; 0: its choice (16-128, by length).
                             // Tests use small tiles to cover several blocks with short sequences.

  bool after_norm() const { return gate_position == GatePosition::AfterNorm; }
};
using AscenderKernelConfig [[deprecated("renamed AscenderConfig in 0.2.0")]] = AscenderConfig;

// What a backend's forward keeps for its backward besides the inputs, when asked to (undefined: the backward
// recomputes everything). The CPU kernel's per-row statistics (ops/cpu/ascender.cpp, RowState): rows (B, H, T, ·)
// float64, nbr (B, H, T, k_max) int64. O(T (k + d_z)) per head, never (T, T). The CUDA tensor-core forward: nbr,
// and the constant-row threshold it applied (docs/ascender.md §12.3; 0: the float32 one).
struct AscenderKernelState {
  Tensor rows, nbr;
  double constant_row = 0;
};

// ---- sparse attention over a CSR pattern (ops/sparse_attention.h: SparsePattern) --------------------------------
// Read-only pointers into a pattern's own int64 lists, on its device (valid while the pattern lives); the transpose's
// (col_*) only where the caller asked for it (SparsePattern::view(true)), else null.
struct SparsePatternLists {
  const int64_t *row_ptr, *cols, *col_ptr, *col_rows, *col_pos;
};
// The block view the CUDA kernels tile by (SparsePattern explains it); all null on the CPU.
struct SparsePatternBlocks {
  const int64_t *rblk_ptr = nullptr, *rblk_keys = nullptr, *rblk_bits = nullptr;
  const int64_t *kblk_ptr = nullptr, *kblk_rows = nullptr, *kblk_bits = nullptr;
};
// What a backend derives from a pattern's lists and keeps while the pattern lives (the CPU kernels' tile plans): made
// on the first call that needs it and shared by every copy of the pattern. Its types belong to the backend.
struct SparsePatternCache {
  std::once_flag cpu_once;
  std::shared_ptr<const void> cpu_plans;         // without padding: made once
  std::mutex mu;                                 // guards the next
  std::shared_ptr<const void> cpu_padded_plans;  // with padding: the last ones made, and for which key_keep
  // A CPU pattern's copy on a CUDA device (SparsePattern::to), the last one made, and its device index: a pattern
  // reused across calls is checked, given its block view and copied once. The copy has a cache of its own.
  std::shared_ptr<const void> device_copy;
  int device_index = -1;
};
// What the kernels read of a pattern: its sizes and lists (SparsePattern::view()), and its cache.
struct SparsePatternView {
  static constexpr int64_t kRowBlock = 16, kKeyBlock = 16;  // the block view's row and key blocks
  // nnz and max_row are -1 for a pattern whose counts are still on its device (clustered_union's view on CUDA; only
  // the CPU kernels read them, and a CPU pattern always knows them)
  int64_t groups = 0, queries = 0, keys = 0, nnz = 0, max_row = 0;
  SparsePatternLists lists{};           // null pointers for a pattern without lists (a view built on a device)
  SparsePatternBlocks blocks{};         // null pointers without a block view
  SparsePatternCache* cache = nullptr;  // null: nothing is kept between calls
  bool has_blocks() const { return blocks.rblk_ptr != nullptr; }
};

// What the kernels that build a clustered union's block view read (ops/sparse_attention.h: clustered_union): the
// shared pattern `base` (its block view, on the kernels' device; base_groups 1 or groups), the sizes of the result
// (groups = B·H, queries T, keys S >= T), θ and causality. The pair (i, j) joins when j < T, (causal) j <= i, and
// Σ_m a_im a_jm > θ summed in float64 in the order m = 0, 1, …, each product and sum rounded (no fused multiply-add:
// the host's clustered_pattern makes the same sums); a row of a with a non-finite entry joins only (i, i).
struct ClusteredBlocksArgs {
  SparsePatternBlocks base;
  int64_t base_groups = 1, groups = 0, queries = 0, keys = 0;
  double theta = 0;
  bool causal = false;
};

}  // namespace asc
