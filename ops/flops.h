#pragma once
// The FLOP formulas of the ops, one place: the profiler's kernel events (core/profiler.h), the model counter
// (models/flops.h) and the benchmarks' rooflines count with these, so their numbers agree. A multiply-add is 2
// FLOPs; a backward of GEMM-shaped work counts twice its forward (two products of the same size), as
// models/flops.h's training() = 3 x forward does. docs/flops.md explains what is left out.
//
//   double f = asc::flops::gemm(/*batch=*/1, M, N, K);            // 2 M N K
//   double a = asc::flops::attention(B * H, asc::flops::causal_pairs(T, S), D);
#include <algorithm>
#include <cstdint>

namespace asc::flops {

inline double d(int64_t v) { return static_cast<double>(v); }

// batch products of (M, K) @ (K, N).
inline double gemm(int64_t batch, int64_t M, int64_t N, int64_t K) { return 2 * d(batch) * d(M) * d(N) * d(K); }

// (query, key) pairs of a T x S attention: all, or with causality (query t sees keys s <= t + (S - T)).
inline double dense_pairs(int64_t T, int64_t S) { return d(T) * d(S); }
inline double causal_pairs(int64_t T, int64_t S) {
  // Σ_t max(0, t + 1 + S - T) for t in [0, T): every key when S >= T on the last row, none before row T - S
  if (T <= S) return d(T) * (2 * d(S) - d(T) + 1) / 2;
  return d(S) * (d(S) + 1) / 2;
}

// Scores q·k and the weighted sum A·V over `pairs` attended pairs of each of `heads` (batch x heads) heads of
// width D: 4 pairs D per head forward; backward (dV, dA·V, dQ, dK) twice that.
inline double attention(int64_t heads, double pairs, int64_t D) { return 4 * d(heads) * pairs * d(D); }

// The ASCender core of one head over P attended pairs (docs/flops.md): scores and A·V 4 P d_head, affinities
// 2 P d_a (none with select_by_scores), the top-k comparisons P, distances and kernels 3 P d_z + 2 P, alignment
// 2 P d_head, separation 4 P, cohesion's centroids and distances 5 P d_z, the three row normalisations 12 P and the
// sum 6 P.
inline double ascender_head(double P, int64_t d_head, int64_t d_z, int64_t d_a, bool select_by_scores) {
  double f = 4 * P * d(d_head);
  if (!select_by_scores) f += 2 * P * d(d_a);
  f += P;
  f += 3 * P * d(d_z) + 2 * P;
  f += 2 * P * d(d_head) + 4 * P;
  f += 2 * P * d(d_z) + 3 * P * d(d_z);
  f += 3 * 4 * P + 6 * P;
  return f;
}

// Attended pairs of a T-token window (|i - j| < window) plus `global` global tokens, clipped to T².
inline double windowed_pairs(int64_t T, int64_t window, int64_t global) {
  const double t = d(T), w = std::min<double>(d(window), t), g = std::min<double>(d(global), t);
  return std::min(t * t, t * (2 * w - 1) + 2 * g * t);
}

}  // namespace asc::flops
