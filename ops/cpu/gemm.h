#pragma once
// One GEMM for the CPU kernels: C (M, N; rows ldc apart, columns contiguous) = A (M, K) · B (K, N), or += with
// `accumulate`. A and B have arbitrary element strides (s*m/s*k: row/column strides); OpenBLAS runs it when the
// strides fit a BLAS operand (ops/layout.h: gemm_operand), else a cache-blocked loop nest. Single-threaded:
// callers parallelise over independent products. Instantiated for float and double (ops/cpu/matmul.cpp).
#include <cstdint>

namespace asc::cpu {

template <class T>
void gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t sam, int64_t sak, const T* B, int64_t sbk, int64_t sbn,
          T* C, int64_t ldc, bool accumulate = false);

}  // namespace asc::cpu
