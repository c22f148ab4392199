// clustered_row_flags (ops/cpu/clustered_rows.h). fp-contract=off: a · b + c stays a product and a sum, each rounded,
// as the baseline build and the bucket walk compute it — the vector levels differ in speed only.
#include "ops/cpu/clustered_rows.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math", "fp-contract=off")
#endif

#include "ops/cpu/vec_math.h"  // ASC_CPU_DISPATCH, ASC_SIMD

namespace asc::cpu {
namespace {

ASC_ALWAYS_INLINE void row_flags(const double* ai, const double* at, int64_t ld, int64_t c, int64_t n, double theta,
                                 double* dots, unsigned char* flags) {
  {
    const double a0 = ai[0];
    ASC_SIMD
    for (int64_t j = 0; j < n; ++j) dots[j] = 0.0 + a0 * at[j];  // 0 + x: the bucket walk's first addition
  }
  for (int64_t m = 1; m < c; ++m) {
    const double am = ai[m];
    const double* col = at + m * ld;
    ASC_SIMD
    for (int64_t j = 0; j < n; ++j) dots[j] += am * col[j];
  }
  ASC_SIMD
  for (int64_t j = 0; j < n; ++j) flags[j] = dots[j] > theta ? 1 : 0;
}

}  // namespace

void clustered_row_flags(const double* ai, const double* at, int64_t ld, int64_t c, int64_t n, double theta,
                         double* dots, unsigned char* flags) {
  ASC_CPU_DISPATCH(row_flags(ai, at, ld, c, n, theta, dots, flags));
}

}  // namespace asc::cpu

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
