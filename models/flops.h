#pragma once
// One FLOP counter for the whole project: the `train` tool's MFU and summary, the experiments' accuracy-against-cost
// figures and the benchmarks' rooflines all count with these functions, so their numbers agree. docs/flops.md gives
// every formula and what is left out.
//
//   asc::models::FlopCount c = asc::models::count_flops(*model, /*T=*/196);
//   double per_token = c.forward / 196;                  // forward FLOPs per token of one sequence
//   double step = c.training() * batch;                  // forward + backward of a batch (3x forward, as PaLM counts)
//
// Conventions: a multiply-add is 2 FLOPs; an element-wise op (add, exp, max, a comparison of a top-k) is 1 per
// element when it is part of the mechanism's defining formula and is counted where it scales with T² (the
// mechanisms' extra terms); layer norms, activations, softmax and embeddings scale with T·D and are left out, as
// nanoGPT / PaLM's MFU leaves them out (they are < 1 % of a Transformer step at the sizes trained here).
// Counts are per sequence of T tokens (one example), forward only; training() is 3x forward (the backward of a
// GEMM costs two GEMMs of the same size).
#include <cstdint>

#include "nn/nn.h"

namespace asc::models {

struct FlopCount {
  double forward = 0;    // one forward pass of one example
  double attention = 0;  // the part of `forward` in attention layers: projections, scores, mechanism terms, A·V
  double training() const { return 3 * forward; }
  FlopCount& operator+=(const FlopCount& o) {
    forward += o.forward, attention += o.attention;
    return *this;
  }
};

// y = x Wᵀ + b over `rows` rows: 2 · rows · in · out.
double linear_flops(const nn::Linear& layer, int64_t rows);

// One attention layer over a sequence of T tokens (self-attention; `causal` counts the pairs a causal mask keeps for
// the sparse patterns, and all T² pairs for dense kernels, which compute the full product and mask it):
//   MultiHeadAttention: the four projections 4 · 2 T D² + scores and A·V 2 · 2 T² D.
//   AscenderAttention:  the same plus the latent and semantic projections 2 T D H (d_z + d_a), then per head over
//                       the P attended pairs (P = T² in Full and Reuse mode; T · (2 window − 1) + 2 g T, clipped to
//                       T², in Windowed mode): affinities 2 P d_a, distances 3 P d_z, the two kernels 2 P,
//                       alignment 2 P d_head, separation 4 P, cohesion's centroids 2 P d_z and distances 3 P d_z,
//                       the three row normalisations 3 · 4 P, the sum 6 P; the top-k selection is counted as P
//                       comparisons (Reuse: none for the affinities, which are skipped: 2 P d_a less).
//   AsamAttention:      projections 4 · 2 T D²; the sparse branch 4 nnz d_head per head over the exact pattern of
//                       T (clustered: T²/c pairs per head, the expected bucket size, plus the 2 T c d_head of
//                       the assignment); the dense branch 4 T² d_head per head unless the gate is fixed at 1; the
//                       gate's pooling and linear map (T D + 2 · (Σ scales) D H).
// Any other nn::Attention is an asc::Error naming its type.
FlopCount attention_flops(nn::Attention& attention, int64_t T, bool causal = false);

// The models of models/ (TransformerClassifier, DecoderLM, FiringClassifier) and the firing layers: counts per
// example, T tokens (ignored by models of fixed-size inputs). Blocks: attention + FFN 2 · 2 T D F; heads: the
// classifier's once per sequence (pooled), the LM's at every position (2 T D V). A firing layer: its weights' GEMM
// 2 d P α-independent (Z = x Wᵀ), its gate P and messages P α. An unknown module is an asc::Error naming its type.
FlopCount count_flops(nn::Module& model, int64_t T);

// The machine's measured peak for MFU: the best of a few float32 GEMMs of n x n x n (n = 512 by default) on the
// CPU through the framework's own matmul, in FLOP/s. Takes about half a second.
double measured_gemm_peak(int64_t n = 512);

}  // namespace asc::models
