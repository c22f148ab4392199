#pragma once
// The clustered pattern's pair rule, written once for the kernels that build a clustered union's block view on the
// CPU (ops/cpu/sparse_patterns.cpp) and on CUDA (cuda/sparse_patterns.cu), so that both choose the same pairs bit for
// bit — and the same as the host's clustered_pattern (ops/sparse_attention.cpp), whose sums are made the same way:
//
//   (i, j) joins  when  Σ_m a_im a_jm > θ,  summed in float64 over m = 0, 1, …, c − 1 in order, every product and
//                       every sum rounded on its own (no fused multiply-add: nvcc would fuse a * b + s unless told);
//   a row with a non-finite entry joins only itself: its NaN then reaches its own output (the attention of that row),
//   never another row's list;
//   a pair that shares no bucket (bucket_mask) is not tested: it cannot exceed θ.
// C++17 and CUDA headers only.
#include <cstdint>

#include "ops/math.h"  // ASC_HD

namespace asc::clustered {

ASC_HD double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
ASC_HD double add_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
ASC_HD bool finite(double x) { return x - x == 0.0; }  // inf - inf and NaN - NaN are NaN

template <class A, class At>
ASC_HD bool finite_row(const A* ai, int64_t c, At at) {
  bool f = true;
  for (int64_t m = 0; m < c; ++m) f = f && finite(at(ai[m]));
  return f;
}

// The buckets (the bound of clustered_pattern, ops/sparse_attention.h, taken per (sample, head) here — the host takes
// the largest sum over all of them; both are sound, as a pair's rows share their group): token i is in bucket m when
// a_im > θ / (2 s), s the largest row sum of its group (at least 1, each sum made in order, rounded). A pair above θ
// shares a bucket, so a pair that shares none is never tested. As a mask: bit m for c <= 64; every bit for c > 64
// or in a group with a negative entry (every pair is tested); 0 for a row with a non-finite entry.
template <class A, class At>
ASC_HD double row_sum(const A* ai, int64_t c, At at) {
  double s = 0.0;
  for (int64_t m = 0; m < c; ++m) s = add_rn(s, at(ai[m]));
  return s;
}
template <class A, class At>
ASC_HD uint64_t bucket_mask(const A* ai, int64_t c, double bucket_min, bool negative_group, At at) {
  if (!finite_row(ai, c, at)) return 0;
  if (c > 64 || negative_group) return ~uint64_t{0};
  uint64_t bits = 0;
  for (int64_t m = 0; m < c; ++m)
    if (at(ai[m]) > bucket_min) bits |= uint64_t{1} << m;
  return bits;
}
// Whether a finite entry of the row is below 0 (the bucket bound needs entries >= 0: such a group gets every bit).
template <class A, class At>
ASC_HD bool has_negative(const A* ai, int64_t c, At at) {
  bool neg = false;
  for (int64_t m = 0; m < c; ++m) neg = neg || (at(ai[m]) < 0.0 && finite(at(ai[m])));
  return neg;
}
// θ / (2 s) for the largest row sum s of a group's finite rows (at least 1), as the host computes it.
ASC_HD double bucket_min(double theta, double largest_sum) {
  return theta / (2 * (largest_sum > 1.0 ? largest_sum : 1.0));
}

// Whether (i, j) joins, for rows ai, aj of c values read through `at` (an element to double, exactly), their bucket
// masks mi, mj; same: i == j. Rows that share no bucket do not join — but a non-finite row (mask 0) joins itself.
template <class A, class At>
ASC_HD bool joins(const A* ai, const A* aj, int64_t c, uint64_t mi, uint64_t mj, bool same, double theta, At at) {
  if ((mi & mj) == 0) return same && !finite_row(ai, c, at);
  double dot = 0.0;
  for (int64_t m = 0; m < c; ++m) dot = add_rn(dot, mul_rn(at(ai[m]), at(aj[m])));
  return dot > theta;  // finite rows (a sum that overflowed: +inf joins, NaN does not, as on the host)
}

}  // namespace asc::clustered
