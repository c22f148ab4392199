#pragma once
// Small bfloat16 products on AVX512-BF16 for the fused CPU kernels (attention under CpuAutocast:
// ops/cpu/attention_bf16.cpp). Its instruction, vdpbf16ps, multiplies pairs: each 32-bit lane of its operands holds
// two bfloat16 numbers (the even element in the low half), and
//   c[j] += a.lo · b[j].lo + a.hi · b[j].hi        (float32 sums, 16 lanes j)
// So both operands of C (M, N) = A (M, K) · B (K, N) are stored as 32-bit words of pairs along K:
//   A: word (i, p) = (A[i][2p], A[i][2p+1]), at A[i · sai + p · sap]: any strides, a word is broadcast to all lanes;
//   B: word (p, j) = (B[2p][j], B[2p+1][j]), rows of N words ldb apart: 16 columns per vector load.
// An odd K ends in a half pair: its high halves are masked off in the product, whatever the words hold there.
//
// The packers round float32 to bfloat16 as round_to_bfloat16 does (vcvtne2ps2bf16: to nearest even, a NaN stays a
// NaN, a denormal becomes a zero of its sign, as vdpbf16ps would read it anyway):
//   pack_a   A (M, K) from x (M, K): pairs of consecutive columns;
//   pack_b   B (K, N) from x (K, N): pairs of consecutive rows, interleaved;
//   pack_bt  B (K, N) from x (N, K): B = xᵀ, pairs of consecutive columns of x, transposed as words.
// pack_b's layout read with sai = 1, sap = ldb is also the A operand of xᵀ (M = N, K = rows of x): Pᵀ dO with P packed
// once.
//
//   pack_a(q, D, rows, D, qa, dp);              // qa (rows, dp = ⌈D/2⌉ words)
//   pack_bt(k, D, n, D, kt, ldk, scratch);      // kt (dp, n): kᵀ
//   gemm_pairs(rows, n, D, qa, dp, 1, kt, ldk, s, n);  // s (rows, n) = q kᵀ, float32
//
// Include it inside a region compiled for x86-64-v4 with avx512bf16 (#pragma GCC target), after the file's other
// headers (ops/cpu/small_gemm.h before the region), and call it only where the processor has the instruction
// (__builtin_cpu_supports("avx512bf16")).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "ops/cpu/small_gemm.h"  // transpose_rows

namespace asc::cpu::bf16_pairs {

// The first n of 16 lanes (none for n <= 0).
ASC_ALWAYS_INLINE __mmask16 lanes(int64_t n) {
  return static_cast<__mmask16>(n >= 16 ? 0xffff : n <= 0 ? 0 : (1u << n) - 1);
}

// Pair words of a row of n floats: ⌈n/2⌉ words; with scale, each float multiplied by it first (one rounding each).
ASC_ALWAYS_INLINE void pack_row(const float* x, int64_t n, uint32_t* out, float scale = 1.0f) {
  const __m512 s = _mm512_set1_ps(scale);
  int64_t c = 0;
  for (; c + 32 <= n; c += 32) {  // 32 floats -> 32 bfloat16 in order = 16 pair words
    const __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(x + c), s), hi = _mm512_mul_ps(_mm512_loadu_ps(x + c + 16), s);
    _mm512_storeu_si512(out + c / 2, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
  if (c < n) {  // the last < 32, zeros after them (an odd n's last high half)
    const int64_t r = n - c;
    const __mmask16 mlo = lanes(r), mhi = lanes(r - 16);
    const __m512 lo = _mm512_mul_ps(_mm512_maskz_loadu_ps(mlo, x + c), s);
    const __m512 hi = _mm512_mul_ps(_mm512_maskz_loadu_ps(mhi, x + c + 16), s);
    const int64_t words = (r + 1) / 2;
    _mm512_mask_storeu_epi32(out + c / 2, lanes(words), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
}

// A (M, K) from x (M, K), row stride ld, contiguous columns: out (M, ⌈K/2⌉ words), row stride ldo.
ASC_ALWAYS_INLINE void pack_a(const float* x, int64_t ld, int64_t M, int64_t K, uint32_t* out, int64_t ldo) {
  for (int64_t i = 0; i < M; ++i) pack_row(x + i * ld, K, out + i * ldo);
}

// B (K, N) from x (K, N), row stride ld, contiguous columns: out (⌈K/2⌉, N words), row stride ldo. Rows 2p and 2p + 1
// become 32 bfloat16 (vcvtne2ps2bf16), interleaved into 16 words by one permute; an odd K's last row pairs with zeros.
ASC_ALWAYS_INLINE void pack_b(const float* x, int64_t ld, int64_t K, int64_t N, uint32_t* out, int64_t ldo) {
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                              6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int64_t p = 0; 2 * p < K; ++p) {
    const float* r0 = x + 2 * p * ld;
    const float* r1 = r0 + ld;
    const bool pair = 2 * p + 1 < K;
    uint32_t* o = out + p * ldo;
    for (int64_t j = 0; j < N; j += 16) {
      const __mmask16 m = lanes(N - j);
      const __m512 lo = _mm512_maskz_loadu_ps(m, r0 + j);
      const __m512 hi = pair ? _mm512_maskz_loadu_ps(m, r1 + j) : _mm512_setzero_ps();
      const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);  // lo's 16 bfloat16, then hi's
      _mm512_mask_storeu_epi32(o + j, m, _mm512_permutexvar_epi16(interleave, halves));
    }
  }
}

// B (K, N) = xᵀ from x (N, K), row stride ld, contiguous columns: out (⌈K/2⌉, N words), row stride ldo (at least
// transposed_ld(N)). x's rows as pair words into `rows` (N × ⌈K/2⌉ words, grown on first use), then transposed.
template <class Buffer>
ASC_ALWAYS_INLINE void pack_bt(const float* x, int64_t ld, int64_t N, int64_t K, uint32_t* out, int64_t ldo,
                               Buffer& rows) {
  const int64_t P = (K + 1) / 2;
  if (rows.size() < static_cast<size_t>(N * P)) rows.resize(static_cast<size_t>(N * P));
  pack_a(x, ld, N, K, rows.data(), P);
  transpose_rows<uint32_t, CpuIsa::x86_64_v4>(rows.data(), P, 1, N, P, out, ldo);
}

// Rows i .. i + kRows - 1 of C, columns j .. j + 31 (m0, m1: the lanes of each 16-column half within N), over pairs
// [0, P); half: the last pair holds one element (odd K), its high halves masked off.
template <int kRows>
ASC_ALWAYS_INLINE void tile(int64_t i, int64_t j, int64_t P, bool half, const uint32_t* A, int64_t sai, int64_t sap,
                            const uint32_t* B, int64_t ldb, float* C, int64_t ldc, __mmask16 m0, __mmask16 m1,
                            bool accumulate) {
  __m512 c0[kRows], c1[kRows];
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) c0[r] = _mm512_setzero_ps(), c1[r] = _mm512_setzero_ps();
  const int64_t whole = half ? P - 1 : P;  // the pairs read as they are
  for (int64_t p = 0; p < whole; ++p) {
    const __m512i b0 = _mm512_maskz_loadu_epi32(m0, B + p * ldb + j);
    const __m512i b1 = _mm512_maskz_loadu_epi32(m1, B + p * ldb + j + 16);
#pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) {
      const __m512i a = _mm512_set1_epi32(static_cast<int>(A[(i + r) * sai + p * sap]));
      c0[r] = _mm512_dpbf16_ps(c0[r], (__m512bh)a, (__m512bh)b0);
      c1[r] = _mm512_dpbf16_ps(c1[r], (__m512bh)a, (__m512bh)b1);
    }
  }
  if (whole < P) {  // the half pair: its high halves masked off on both sides (0 · a NaN beyond K would be NaN)
    const __m512i low = _mm512_set1_epi32(0xffff);
    const __m512i b0 = _mm512_and_si512(_mm512_maskz_loadu_epi32(m0, B + whole * ldb + j), low);
    const __m512i b1 = _mm512_and_si512(_mm512_maskz_loadu_epi32(m1, B + whole * ldb + j + 16), low);
#pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) {
      const __m512i a = _mm512_and_si512(_mm512_set1_epi32(static_cast<int>(A[(i + r) * sai + whole * sap])), low);
      c0[r] = _mm512_dpbf16_ps(c0[r], (__m512bh)a, (__m512bh)b0);
      c1[r] = _mm512_dpbf16_ps(c1[r], (__m512bh)a, (__m512bh)b1);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
    float* cr = C + (i + r) * ldc + j;
    if (accumulate) {
      c0[r] = _mm512_add_ps(c0[r], _mm512_maskz_loadu_ps(m0, cr));
      c1[r] = _mm512_add_ps(c1[r], _mm512_maskz_loadu_ps(m1, cr + 16));
    }
    _mm512_mask_storeu_ps(cr, m0, c0[r]);
    _mm512_mask_storeu_ps(cr + 16, m1, c1[r]);
  }
}

// C (M, N) = A (M, K) · B (K, N) in bfloat16 products with float32 sums (accumulate: C +=), C's rows ldc apart.
// Tiles of 8 rows × 32 columns (16 accumulators), then 4, 2, 1 rows. K in blocks of 128 pairs: every row tile of a
// 32-column strip reads the same 128 × 32 words of B (16 KiB), which stay in L1; the K blocks are summed into C in
// order, so the result depends on the shapes only.
ASC_ALWAYS_INLINE void gemm_pairs(int64_t M, int64_t N, int64_t K, const uint32_t* A, int64_t sai, int64_t sap,
                                  const uint32_t* B, int64_t ldb, float* C, int64_t ldc, bool accumulate = false) {
  constexpr int64_t kPairs = 128;
  const int64_t P = (K + 1) / 2;
  if (P == 0 && !accumulate)
    for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
  for (int64_t p0 = 0; p0 < P; p0 += kPairs) {
    const int64_t np = std::min(kPairs, P - p0);
    const bool half = K % 2 == 1 && p0 + np == P, acc = accumulate || p0 > 0;
    const uint32_t* Ap = A + p0 * sap;
    const uint32_t* Bp = B + p0 * ldb;
    for (int64_t j = 0; j < N; j += 32) {
      const __mmask16 m0 = lanes(N - j), m1 = lanes(N - j - 16);
      int64_t i = 0;
      for (; i + 8 <= M; i += 8) tile<8>(i, j, np, half, Ap, sai, sap, Bp, ldb, C, ldc, m0, m1, acc);
      if (M - i >= 4) tile<4>(i, j, np, half, Ap, sai, sap, Bp, ldb, C, ldc, m0, m1, acc), i += 4;
      if (M - i >= 2) tile<2>(i, j, np, half, Ap, sai, sap, Bp, ldb, C, ldc, m0, m1, acc), i += 2;
      if (M - i >= 1) tile<1>(i, j, np, half, Ap, sai, sap, Bp, ldb, C, ldc, m0, m1, acc);
    }
  }
}

}  // namespace asc::cpu::bf16_pairs
