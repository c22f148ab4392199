#pragma once
// Launchers of the firing perceptron's CUDA kernels (cuda/firing.cu), called by cuda/firing.cpp with plain data.
// Z (N, P), SP (P), f (P, α), F (N, P), Y / dY (N, P, α) contiguous, all of element type `elem` (bfloat16 /
// float16 compute in float32). C++17-clean; each launcher returns the launch's cudaError_t.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/float_elem.h"
#include "ops/math.h"  // math::SurrogateKind

namespace asc::cuda::firing_launch {

// The gate's backward: 0 exact, 1 straight-through (s' = 1), 2 the built-in surrogate `kind` of width `width`.
struct Gate {
  int mode;
  math::SurrogateKind kind;
  double width;
};

// F = 1[Z >= SP], Y = F f Z.
cudaError_t forward(const void* Z, const void* SP, const void* f, int64_t N, int64_t P, int64_t A, void* F, void* Y,
                    FloatElem elem, cudaStream_t stream);
// dZ (N, P), dSP (P), df (P, α) of ops/firing.h from dY: a thread per (b, p) forms dZ and the factors of the two
// sums over b, which then run as column sums over row blocks (partials added in a fixed order, so the result does
// not depend on scheduling). `work` holds backward_workspace(N, P, A) elements of the compute type.
constexpr int64_t backward_row_blocks(int64_t N) {
  const int64_t blocks = (N + 255) / 256;
  return blocks < 1 ? 1 : blocks > 64 ? 64 : blocks;
}
constexpr int64_t backward_workspace(int64_t N, int64_t P, int64_t A) {
  return 2 * N * P + backward_row_blocks(N) * P * (A > 1 ? A : 1);
}
cudaError_t backward(const void* Z, const void* SP, const void* f, const void* F, const void* dY, int64_t N, int64_t P,
                     int64_t A, Gate gate, void* dZ, void* dSP, void* df, void* work, FloatElem elem,
                     cudaStream_t stream);

// Rule B's sums of ops/firing.h (fz2, fired, margin: (P)) from Z, F (N, P), SP (P), float32 / float64: the column
// sums of the backward (row-block partials added in a fixed order). `work` holds batch_sums_workspace(N, P) elements.
constexpr int64_t batch_sums_workspace(int64_t N, int64_t P) { return backward_row_blocks(N) * P; }
cudaError_t batch_sums(const void* Z, const void* F, const void* SP, int64_t N, int64_t P, void* fz2, void* fired,
                       void* margin, void* work, FloatElem elem, cudaStream_t stream);
// coef (N, P) = a F Z − c dZ (dZ and c null: a F Z), a thread per (b, p).
cudaError_t rule_b_coef(const void* Z, const void* F, double a, const void* dZ, const void* c, int64_t N, int64_t P,
                        void* coef, FloatElem elem, cudaStream_t stream);
// W (P, d) <- keep (P) ∘ W, row p scaled by keep[p] in place: firing_weight_update's decay, before its GEMM adds
// coefᵀ X (cuda/firing.cpp).
cudaError_t scale_rows(void* W, const void* keep, int64_t P, int64_t d, FloatElem elem, cudaStream_t stream);

// The SSM scan of ops/firing.h: a, u, s (B, T, R), s0 (B, R), rms (B, T).
//   With the RMS normalisation (channels coupled at every step): one thread block per batch row, its threads over the
//   R <= kMaxScanChannels channels, sequential in time (a block reduction per step).
//   Without it (a linear recurrence) and T >= 2 kScanChunk: a chunked parallel scan — every (row, chunk of
//   kScanChunk steps, channel) scans its chunk from a zero state, one thread per (row, channel) carries the chunk
//   states across chunks, then every chunk scans again from its true starting state (and the same in reverse for the
//   backward). `work` holds scan_workspace(B, T, R) elements of the compute type (float32 for bfloat16 / float16).
constexpr int64_t kMaxScanChannels = 1024;
constexpr int64_t kScanChunk = 64;
constexpr bool scan_chunked(bool rms_norm, int64_t T) { return !rms_norm && T >= 2 * kScanChunk; }
constexpr int64_t scan_workspace(int64_t B, int64_t T, int64_t R) {
  return 3 * B * ((T + kScanChunk - 1) / kScanChunk) * R;
}
cudaError_t scan_forward(const void* a, const void* u, const void* s0, int64_t B, int64_t T, int64_t R, bool rms_norm,
                         double eps, void* s, void* rms, void* work, FloatElem elem, cudaStream_t stream);
// da, du (B, T, R), ds0 (B, R) from ds.
cudaError_t scan_backward(const void* a, const void* s0, const void* s, const void* rms, const void* ds, int64_t B,
                          int64_t T, int64_t R, bool rms_norm, void* da, void* du, void* ds0, void* work,
                          FloatElem elem, cudaStream_t stream);

}  // namespace asc::cuda::firing_launch
