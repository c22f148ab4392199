// clustered_row_flags (ops/cpu/clustered_rows.h). fp-contract=off: a · b + c stays a product and a sum, each rounded,
// as the baseline build and the bucket walk compute it — the vector levels differ in speed only.
#include "ops/cpu/clustered_rows.h"

#include <cstring>

#include "core/cpu_isa.h"
#ifdef ASC_CPU_MULTI_ISA
#include <immintrin.h>
#endif

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

namespace {

int64_t compact_scalar(const unsigned char* flags, int64_t j, int64_t n, int64_t* out, int64_t len) {
  for (; j < n; ++j) out[len] = j, len += flags[j];
  return len;
}

#ifdef ASC_CPU_MULTI_ISA
// Eight flags as one word, their low bits gathered into a mask (pext), the eight indices compressed by it in a
// register and stored whole: the lanes past the kept ones land in out[len + popcount, len + 8), which the next words
// overwrite, and never past out[n) (len <= j, and j + 8 <= n). Not the compressing store to memory: AMD's Zen 4
// microcodes it, and it took 15 % of an ASAM training step there (its rows' clustered keys).
[[gnu::target("arch=x86-64-v4")]] int64_t compact_v4(const unsigned char* flags, int64_t n, int64_t* out) {
  int64_t len = 0, j = 0;
  __m512i idx = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
  const __m512i eight = _mm512_set1_epi64(8);
  for (; j + 8 <= n; j += 8) {
    uint64_t word;
    std::memcpy(&word, flags + j, sizeof(word));
    const auto mask = static_cast<__mmask8>(_pext_u64(word, 0x0101010101010101ull));
    _mm512_storeu_si512(out + len, _mm512_maskz_compress_epi64(mask, idx));
    len += __builtin_popcount(mask);
    idx = _mm512_add_epi64(idx, eight);
  }
  return compact_scalar(flags, j, n, out, len);
}
#endif

}  // namespace

int64_t compact_flags(const unsigned char* flags, int64_t n, int64_t* out) {
#ifdef ASC_CPU_MULTI_ISA
  if (cpu_isa() == CpuIsa::x86_64_v4) return compact_v4(flags, n, out);
#endif
  return compact_scalar(flags, 0, n, out, 0);
}

}  // namespace asc::cpu

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
