#pragma once
// The FLOP formulas of the ops, one place: the profiler's kernel events (core/profiler.h), the model counter
// (models/flops.h) and the benchmarks' rooflines count with these, so their numbers agree. A multiply-add is 2
// FLOPs; a backward of GEMM-shaped work counts twice its forward (two products of the same size), as
// models/flops.h's training() = 3 x forward does. docs/flops.md explains what is left out.
//
//   double f = asc::flops::gemm(/*batch=*/1, M, N, K);            // 2 M N K
//   double a = asc::flops::attention(B * H, asc::flops::causal_pairs(T, S), D);
#include <algorithm>

namespace asc::flops {

// Sizes are taken as double (an int64_t argument converts exactly below 2^53): the products of four sizes overflow
// no integer, and every formula is a plain expression.

// batch products of (M, K) @ (K, N).
inline double gemm(double batch, double M, double N, double K) { return 2 * batch * M * N * K; }

// (query, key) pairs of a T x S attention: all, or with causality (query t sees keys s <= t + (S - T)).
inline double dense_pairs(double T, double S) { return T * S; }
inline double causal_pairs(double T, double S) {
  // Σ_t max(0, t + 1 + S - T) for t in [0, T): every key when S >= T on the last row, none before row T - S
  if (T <= S) return T * (2 * S - T + 1) / 2;
  return S * (S + 1) / 2;
}

// Scores q·k and the weighted sum A·V over `pairs` attended pairs of each of `heads` (batch x heads) heads of
// width D: 4 pairs D per head forward; backward (dV, dA·V, dQ, dK) twice that.
inline double attention(double heads, double pairs, double D) { return 4 * heads * pairs * D; }

// The ASCender core of one head over P attended pairs (docs/flops.md): scores and A·V 4 P d_head, affinities
// 2 P d_a (none with select_by_scores), the top-k comparisons P, distances and kernels 3 P d_z + 2 P, alignment
// 2 P d_head, separation 4 P, cohesion's centroids and distances 5 P d_z, the three row normalisations 12 P and the
// sum 6 P.
inline double ascender_head(double P, double d_head, double d_z, double d_a, bool select_by_scores) {
  double f = 4 * P * d_head;
  if (!select_by_scores) f += 2 * P * d_a;
  f += P;
  f += 3 * P * d_z + 2 * P;
  f += 2 * P * d_head + 4 * P;
  f += 2 * P * d_z + 3 * P * d_z;
  f += 3 * 4 * P + 6 * P;
  return f;
}

// Attended pairs of a T-token window (|i - j| < window) plus `global` global tokens, clipped to T².
inline double windowed_pairs(double T, double window, double global) {
  const double w = std::min(window, T), g = std::min(global, T);
  return std::min(T * T, T * (2 * w - 1) + 2 * g * T);
}

}  // namespace asc::flops
