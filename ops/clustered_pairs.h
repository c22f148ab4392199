#pragma once
// The clustered pattern's pair rule, written once for the kernels that build a clustered union's block view on the
// CPU (ops/cpu/sparse_patterns.cpp) and on CUDA (cuda/sparse_patterns.cu), so that both choose the same pairs bit for
// bit — and the same as the host's clustered_pattern (ops/sparse_attention.cpp), whose sums are made the same way:
//
//   (i, j) joins  when  Σ_m a_im a_jm > θ,  summed in float64 over m = 0, 1, …, c − 1 in order, every product and
//                       every sum rounded on its own (no fused multiply-add: nvcc would fuse a * b + s unless told);
//   a row with a non-finite entry joins only itself: its NaN then reaches its own output (the attention of that row),
//   never another row's list.
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

// Whether (i, j) joins, for rows ai, aj of c values read through `at` (an element to double, exactly); same: i == j.
template <class A, class At>
ASC_HD bool joins(const A* ai, const A* aj, int64_t c, bool same, double theta, At at) {
  double dot = 0.0;
  for (int64_t m = 0; m < c; ++m) dot = add_rn(dot, mul_rn(at(ai[m]), at(aj[m])));
  if (finite(dot)) return dot > theta;
  // A non-finite entry makes the sum NaN or infinite (so does an overflow of finite rows): look at the rows.
  bool fi = true, fj = true;
  for (int64_t m = 0; m < c; ++m) fi = fi && finite(at(ai[m])), fj = fj && finite(at(aj[m]));
  if (!fi) return same;
  if (!fj) return false;
  return dot > theta;  // finite rows whose sum overflowed: +inf joins, NaN (inf - inf) does not, as on the host
}

}  // namespace asc::clustered
