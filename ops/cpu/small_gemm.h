#pragma once
// C = A B (or C += A B) where the inner dimension K or the width N is short — the latent widths d_z, d_a of ASCender
// attention, 8 to 32 — and a BLAS GEMM spends more time zeroing C (beta = 0), packing and on edge tiles than
// multiplying: (128 x 512) x 16 runs in about half of OpenBLAS's time, (128 x 16) x 512 in two thirds.
// Register-blocked 4 rows x 2 vectors of C, K summed in registers, C written once; no packing: B is read as it lies,
// K x N row-major (for the (rows, keys) products, a transposed copy of the keys' rows).
//
// Include it inside the caller's `#pragma GCC optimize` region and call it from an ASC_CPU_CLONES function: it is
// forced inline, so each clone gets its own copy (GCC vector extensions lower to AVX2 + FMA in the x86-64-v3 clone
// and to SSE2 in the baseline one).
//
//   gemm_narrow<float>(R, n, dz, z_rows, dz, zT, n, zdot, n);  // zdot (R, n) = z_rows (R, dz) · zT (dz, n)
//   gemm_narrow<float>(R, dz, n, w, n, z, dz, c, dz);          // c (R, dz) = w (R, n) · z (n, dz)
#include <cstdint>
#include <cstring>

#include "ops/cpu/vec_math.h"

namespace asc::cpu {

// C (M, N) = A (M, K; row stride lda) · B (K, N; row stride ldb), into C (row stride ldc); accumulate: C += A B.
template <class T>
ASC_ALWAYS_INLINE void gemm_narrow(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
                                   T* C, int64_t ldc, bool accumulate = false) {
  typedef T V __attribute__((vector_size(32)));     // 8 floats or 4 doubles
  constexpr int64_t L = 32 / sizeof(T), W = 2 * L;  // lanes; columns per block
  // Vectors move through memcpy (unaligned loads and stores) and never cross a call: no lambdas here (GCC warns that
  // passing them changes the ABI between the clones).
  int64_t i = 0;
  for (; i + 4 <= M; i += 4) {
    const T *a0 = A + i * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
    int64_t j = 0;
    for (; j + W <= N; j += W) {
      V c00 = {}, c01 = {}, c10 = {}, c11 = {}, c20 = {}, c21 = {}, c30 = {}, c31 = {};
      for (int64_t c = 0; c < K; ++c) {
        V b0, b1;
        std::memcpy(&b0, B + c * ldb + j, sizeof(V));
        std::memcpy(&b1, B + c * ldb + j + L, sizeof(V));
        const T x0 = a0[c], x1 = a1[c], x2 = a2[c], x3 = a3[c];
        c00 += x0 * b0, c01 += x0 * b1, c10 += x1 * b0, c11 += x1 * b1;
        c20 += x2 * b0, c21 += x2 * b1, c30 += x3 * b0, c31 += x3 * b1;
      }
      T* cr = C + i * ldc + j;
      if (accumulate) {
        V t;
        std::memcpy(&t, cr, sizeof(V)), c00 += t, std::memcpy(&t, cr + L, sizeof(V)), c01 += t;
        std::memcpy(&t, cr + ldc, sizeof(V)), c10 += t, std::memcpy(&t, cr + ldc + L, sizeof(V)), c11 += t;
        std::memcpy(&t, cr + 2 * ldc, sizeof(V)), c20 += t, std::memcpy(&t, cr + 2 * ldc + L, sizeof(V)), c21 += t;
        std::memcpy(&t, cr + 3 * ldc, sizeof(V)), c30 += t, std::memcpy(&t, cr + 3 * ldc + L, sizeof(V)), c31 += t;
      }
      std::memcpy(cr, &c00, sizeof(V)), std::memcpy(cr + L, &c01, sizeof(V));
      std::memcpy(cr + ldc, &c10, sizeof(V)), std::memcpy(cr + ldc + L, &c11, sizeof(V));
      std::memcpy(cr + 2 * ldc, &c20, sizeof(V)), std::memcpy(cr + 2 * ldc + L, &c21, sizeof(V));
      std::memcpy(cr + 3 * ldc, &c30, sizeof(V)), std::memcpy(cr + 3 * ldc + L, &c31, sizeof(V));
    }
    for (; j < N; ++j)  // the last < W columns
      for (int64_t r = 0; r < 4; ++r) {
        T s = 0;
        for (int64_t c = 0; c < K; ++c) s += A[(i + r) * lda + c] * B[c * ldb + j];
        C[(i + r) * ldc + j] = accumulate ? C[(i + r) * ldc + j] + s : s;
      }
  }
  for (; i < M; ++i)  // the last < 4 rows
    for (int64_t j = 0; j < N; ++j) {
      T s = 0;
      for (int64_t c = 0; c < K; ++c) s += A[i * lda + c] * B[c * ldb + j];
      C[i * ldc + j] = accumulate ? C[i * ldc + j] + s : s;
    }
}

}  // namespace asc::cpu
