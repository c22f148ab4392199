// Index lists from flags or values (ops/cpu/compact.h). The x86-64-v4 paths compress the indices in a register and
// store the whole vector (the lanes past the kept ones land in out[len + kept, len + width), which the next vectors
// overwrite, and never past out[n): len <= j and j + width <= n), not with the compressing store to memory, which
// AMD's Zen 4 microcodes: it took 15 % of an ASAM training step there, on its rows' clustered keys.
#include "ops/cpu/compact.h"

#include <cstring>

#include "core/cpu_isa.h"
#ifdef ASC_CPU_MULTI_ISA
#include <immintrin.h>
#endif

namespace asc::cpu {
namespace {

int64_t compact_flags_scalar(const unsigned char* flags, int64_t j, int64_t n, int64_t* out, int64_t len) {
  for (; j < n; ++j) out[len] = j, len += flags[j];
  return len;
}

template <class T>
int64_t compact_greater_scalar(const T* x, int64_t j, int64_t n, T thr, int64_t* out, int64_t len) {
  for (; j < n; ++j) out[len] = j, len += x[j] > thr ? 1 : 0;
  return len;
}

#ifdef ASC_CPU_MULTI_ISA
// Eight flags as one word, their low bits gathered into a mask (pext), the eight indices compressed by it.
[[gnu::target("arch=x86-64-v4")]] int64_t compact_flags_v4(const unsigned char* flags, int64_t n, int64_t* out) {
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
  return compact_flags_scalar(flags, j, n, out, len);
}

// 16 floats compared at once (ordered: NaN is not greater), their mask's two halves compressing two vectors of eight
// 64-bit indices.
[[gnu::target("arch=x86-64-v4")]] int64_t compact_greater_v4(const float* x, int64_t n, float thr, int64_t* out) {
  int64_t len = 0, j = 0;
  __m512i idx = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
  const __m512i eight = _mm512_set1_epi64(8), sixteen = _mm512_set1_epi64(16);
  const __m512 t = _mm512_set1_ps(thr);
  for (; j + 16 <= n; j += 16) {
    const __mmask16 mask = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + j), t, _CMP_GT_OQ);
    const auto lo = static_cast<__mmask8>(mask), hi = static_cast<__mmask8>(mask >> 8);
    _mm512_storeu_si512(out + len, _mm512_maskz_compress_epi64(lo, idx));
    len += __builtin_popcount(lo);
    _mm512_storeu_si512(out + len, _mm512_maskz_compress_epi64(hi, _mm512_add_epi64(idx, eight)));
    len += __builtin_popcount(hi);
    idx = _mm512_add_epi64(idx, sixteen);
  }
  return compact_greater_scalar(x, j, n, thr, out, len);
}

[[gnu::target("arch=x86-64-v4")]] int64_t compact_greater_v4(const double* x, int64_t n, double thr, int64_t* out) {
  int64_t len = 0, j = 0;
  __m512i idx = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
  const __m512i eight = _mm512_set1_epi64(8);
  const __m512d t = _mm512_set1_pd(thr);
  for (; j + 8 <= n; j += 8) {
    const __mmask8 mask = _mm512_cmp_pd_mask(_mm512_loadu_pd(x + j), t, _CMP_GT_OQ);
    _mm512_storeu_si512(out + len, _mm512_maskz_compress_epi64(mask, idx));
    len += __builtin_popcount(mask);
    idx = _mm512_add_epi64(idx, eight);
  }
  return compact_greater_scalar(x, j, n, thr, out, len);
}
#endif

template <class T>
int64_t compact_greater_any(const T* x, int64_t n, T thr, int64_t* out) {
#ifdef ASC_CPU_MULTI_ISA
  if (cpu_isa() == CpuIsa::x86_64_v4) return compact_greater_v4(x, n, thr, out);
#endif
  return compact_greater_scalar(x, 0, n, thr, out, 0);
}

}  // namespace

int64_t compact_flags(const unsigned char* flags, int64_t n, int64_t* out) {
#ifdef ASC_CPU_MULTI_ISA
  if (cpu_isa() == CpuIsa::x86_64_v4) return compact_flags_v4(flags, n, out);
#endif
  return compact_flags_scalar(flags, 0, n, out, 0);
}

int64_t compact_greater(const float* x, int64_t n, float thr, int64_t* out) {
  return compact_greater_any(x, n, thr, out);
}
int64_t compact_greater(const double* x, int64_t n, double thr, int64_t* out) {
  return compact_greater_any(x, n, thr, out);
}

}  // namespace asc::cpu
