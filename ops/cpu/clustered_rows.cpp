// clustered_rows_flags and clustered_rows_bits (ops/cpu/clustered_rows.h). fp-contract=off (GCC, the project's
// compiler): a · b + c stays a product and a sum, each rounded, as the baseline build and the CPU kernels of the
// block view (ops/cpu/sparse_patterns.cpp) compute it — the vector levels differ in speed only.
#include "ops/cpu/clustered_rows.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/error.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math", "fp-contract=off")
#endif

#include "ops/cpu/vec_math.h"  // ASC_CPU_DISPATCH

namespace asc::cpu {
namespace {

// Rows in fours against kJ keys at a time, the 4 · kJ sums held in registers through all c terms: each key's column
// of assignments is loaded once for four rows, and no sum is stored before its last term (a pass per term over a row
// of sums in memory loads and stores each sum c times, which bound the earlier one-row pass). Each sum's order is
// that of the bucket walk: 0 + a_i0 a_j0, then + a_im a_jm for m = 1, 2, … in order.
constexpr int64_t kR = 4;

typedef double V8 __attribute__((vector_size(64)));
typedef double V4 __attribute__((vector_size(32)));
typedef signed char C8 __attribute__((vector_size(8)));  // a byte per lane of V8
typedef signed char C4 __attribute__((vector_size(4)));  // of V4

// Out: unsigned char (a flag per key, row r's at out + r · ld_out) or uint64_t (a bit per key, row r's words at
// out + r · ld_out, its first ceil(n / 64) zeroed first).
template <class V, class Out>  // V8 at x86-64-v4 (kJ = 16 keys), else V4 (kJ = 8)
ASC_ALWAYS_INLINE void rows_test(const double* const* rows, int64_t R, const double* at, int64_t ld, int64_t c,
                                 int64_t n, double theta, Out* out, int64_t ld_out) {
  constexpr int64_t L = sizeof(V) / 8, kJ = 2 * L;  // two vectors of sums per row
  using C = std::conditional_t<L == 8, C8, C4>;
  constexpr bool kBits = std::is_same_v<Out, uint64_t>;
  if constexpr (kBits)
    for (int64_t r = 0; r < R; ++r) std::fill(out + r * ld_out, out + r * ld_out + (n + 63) / 64, uint64_t{0});
  auto put = [&](int64_t r, int64_t j, bool pass) {
    if constexpr (kBits)
      out[r * ld_out + j / 64] |= uint64_t{pass} << (j % 64);
    else
      out[r * ld_out + j] = pass ? 1 : 0;
  };
  const double* a[kR];
  for (int64_t r = 0; r < kR; ++r) a[r] = rows[r < R ? r : 0];  // fewer than four: row 0 again, not stored
  int64_t j0 = 0;
  for (; j0 + kJ <= n; j0 += kJ) {
    V acc[kR][2], x0, x1;
    std::memcpy(&x0, at + j0, sizeof(V));
    std::memcpy(&x1, at + j0 + L, sizeof(V));
    for (int64_t r = 0; r < kR; ++r) {
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
      if constexpr (kBits) {
        uint64_t word = 0;
        for (int64_t h = 0; h < 2; ++h)
          for (int64_t l = 0; l < L; ++l) word |= uint64_t{acc[r][h][l] > theta} << (h * L + l);
        out[r * ld_out + j0 / 64] |= word << (j0 % 64);
      } else {  // each lane's comparison (-1 or 0) narrowed to a byte and negated: L flags in one store
        for (int64_t h = 0; h < 2; ++h) {
          const C flags = -__builtin_convertvector(acc[r][h] > theta, C);
          std::memcpy(out + r * ld_out + j0 + h * L, &flags, sizeof(C));
        }
      }
    }
  }
  for (int64_t r = 0; r < R; ++r)  // the last n % kJ keys one by one, the same sums
    for (int64_t j = j0; j < n; ++j) {
      double dot = 0.0 + a[r][0] * at[j];
      for (int64_t m = 1; m < c; ++m) dot += a[r][m] * at[m * ld + j];
      put(r, j, dot > theta);
    }
}

void check_rows(const char* who, int64_t R, int64_t c, int64_t n) {
  ASC_CHECK(R >= 1 && R <= kR && c >= 1 && n >= 0, "{}: {} rows (1 to {}), c = {}, n = {}", who, R, kR, c, n);
}

}  // namespace

void clustered_rows_flags(const double* const* rows, int64_t R, const double* at, int64_t ld, int64_t c, int64_t n,
                          double theta, unsigned char* flags, int64_t ld_flags) {
  check_rows("clustered_rows_flags", R, c, n);
  ASC_CPU_DISPATCH((
      rows_test<std::conditional_t<kIsa == CpuIsa::x86_64_v4, V8, V4>>(rows, R, at, ld, c, n, theta, flags, ld_flags)));
}

void clustered_rows_bits(const double* const* rows, int64_t R, const double* at, int64_t ld, int64_t c, int64_t n,
                         double theta, uint64_t* bits, int64_t words) {
  check_rows("clustered_rows_bits", R, c, n);
  ASC_CHECK(words * 64 >= n, "clustered_rows_bits: {} words per row for {} keys", words, n);
  ASC_CPU_DISPATCH(
      (rows_test<std::conditional_t<kIsa == CpuIsa::x86_64_v4, V8, V4>>(rows, R, at, ld, c, n, theta, bits, words)));
}

}  // namespace asc::cpu

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
