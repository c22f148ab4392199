// clustered_row_flags and clustered_rows_bits (ops/cpu/clustered_rows.h). fp-contract=off: a · b + c stays a product
// and a sum, each rounded, as the baseline build and the bucket walk compute it — the vector levels differ in speed
// only.
#include "ops/cpu/clustered_rows.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/error.h"

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

// Rows in fours against kJ keys at a time, the 4 · kJ sums held in registers through all c terms: each key's column
// of assignments is loaded once for four rows, where the row pass above loads it per row and stores its sums c times.
// The bucket's (c, ld) block stays in the cache while its members' rows go through it. Each sum's order is unchanged.
constexpr int64_t kR = 4;

typedef double V8 __attribute__((vector_size(64)));
typedef double V4 __attribute__((vector_size(32)));

template <class V>  // V8 at x86-64-v4 (kJ = 16 keys), else V4 (kJ = 8)
ASC_ALWAYS_INLINE void rows_bits(const double* const* rows, int64_t R, const double* at, int64_t ld, int64_t c,
                                 int64_t n, double theta, uint64_t* bits, int64_t words) {
  constexpr int64_t L = sizeof(V) / 8, kJ = 2 * L;  // two vectors of sums per row
  for (int64_t r = 0; r < R; ++r) std::fill(bits + r * words, bits + r * words + (n + 63) / 64, uint64_t{0});
  const double* a[kR];
  for (int64_t r = 0; r < kR; ++r) a[r] = rows[r < R ? r : 0];  // fewer than four: row 0 again, not stored
  int64_t j0 = 0;
  for (; j0 + kJ <= n; j0 += kJ) {
    V acc[kR][2], x0, x1;
    std::memcpy(&x0, at + j0, sizeof(V));
    std::memcpy(&x1, at + j0 + L, sizeof(V));
    for (int64_t r = 0; r < kR; ++r) {  // 0 + x: the bucket walk's first addition
      acc[r][0] = V{} + a[r][0] * x0;
      acc[r][1] = V{} + a[r][0] * x1;
    }
    for (int64_t m = 1; m < c; ++m) {
      std::memcpy(&x0, at + m * ld + j0, sizeof(V));
      std::memcpy(&x1, at + m * ld + j0 + L, sizeof(V));
      for (int64_t r = 0; r < kR; ++r) {
        const double am = a[r][m];
        acc[r][0] += am * x0;
        acc[r][1] += am * x1;
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      uint64_t word = 0;
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t l = 0; l < L; ++l) word |= uint64_t{acc[r][h][l] > theta} << (h * L + l);
      bits[r * words + j0 / 64] |= word << (j0 % 64);
    }
  }
  for (int64_t r = 0; r < R; ++r)  // the last n % kJ keys one by one, the same sums
    for (int64_t j = j0; j < n; ++j) {
      double dot = 0.0 + a[r][0] * at[j];
      for (int64_t m = 1; m < c; ++m) dot += a[r][m] * at[m * ld + j];
      bits[r * words + j / 64] |= uint64_t{dot > theta} << (j % 64);
    }
}

}  // namespace

void clustered_row_flags(const double* ai, const double* at, int64_t ld, int64_t c, int64_t n, double theta,
                         double* dots, unsigned char* flags) {
  ASC_CPU_DISPATCH(row_flags(ai, at, ld, c, n, theta, dots, flags));
}

void clustered_rows_bits(const double* const* rows, int64_t R, const double* at, int64_t ld, int64_t c, int64_t n,
                         double theta, uint64_t* bits, int64_t words) {
  ASC_CHECK(R >= 1 && R <= kR && words * 64 >= n, "clustered_rows_bits: {} rows (1 to {}), {} words for {} keys", R, kR,
            words, n);
  ASC_CPU_DISPATCH(
      (rows_bits<std::conditional_t<kIsa == CpuIsa::x86_64_v4, V8, V4>>(rows, R, at, ld, c, n, theta, bits, words)));
}

}  // namespace asc::cpu

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
