#pragma once
// One GEMM for the CPU kernels: C (M, N; rows ldc apart, columns contiguous) = A (M, K) · B (K, N), or += with
// `accumulate`. A and B have arbitrary element strides (s*m/s*k: row/column strides); OpenBLAS runs it when the
// strides fit a BLAS operand (ops/layout.h: gemm_operand), else a cache-blocked loop nest. Single-threaded:
// callers parallelise over independent products. Instantiated for float and double (ops/cpu/matmul.cpp).
#include <cstdint>

#include "core/tensor.h"
#include "ops/cpu/loops.h"

namespace asc::cpu {

template <class T>
void gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t sam, int64_t sak, const T* B, int64_t sbk, int64_t sbn,
          T* C, int64_t ldc, bool accumulate = false);

// How a few large products of M rows each are split over the threads, the float32 and bfloat16 kernels alike
// (ops/cpu/matmul.cpp, gemm_bf16.cpp). OpenBLAS's result for a row depends on how the rows are split (its edge kernels
// sum in another order), so a split by thread count makes the bits depend on it: in deterministic mode the rows go in
// blocks fixed by M alone (at least 128 rows, at most 8 blocks), each its own call, B packed once per block and the
// threads' shares less even (up to a few tens of percent on mid-sized products). Otherwise one chunk per 512 rows
// (each chunk packs all of B again: a product with a long inner dimension, like a weight gradient, spends too much of
// a thinner chunk packing), at least one per thread, at most kChunksPerThread per thread.
struct RowBlocks {
  int64_t per = 0;     // rows per block (the last may have fewer)
  int64_t count = 0;   // blocks
  bool fixed = false;  // deterministic mode: each block is its own GEMM call, whichever thread runs it
};
RowBlocks gemm_row_blocks(int64_t M);

// Runs fn(r0, r1) over the rows [0, M) of a product split as gemm_row_blocks(M) says, on the threads: each thread's
// range of blocks in one call, or in deterministic mode each block in its own call (the same GEMM calls whichever
// thread makes them). row_work: the multiply-adds of one row (parallel_for's grain).
template <class F>
void for_gemm_row_blocks(int64_t M, int64_t row_work, F&& fn) {
  const RowBlocks rb = gemm_row_blocks(M);
  const int64_t per = rb.per;
  parallel_for(rb.count, per * std::max<int64_t>(row_work, 1), [&](int64_t b0, int64_t b1) {
    const int64_t m0 = b0 * per, m1 = std::min(M, b1 * per);
    const int64_t step = rb.fixed ? per : m1 - m0;
    for (int64_t r0 = m0; r0 < m1; r0 += step) fn(r0, std::min(m1, r0 + step));
  });
}

// bfloat16 products (ops/cpu/gemm_bf16.cpp). matmul_bf16 rounds its float32 operands with round_to_bfloat16 (and
// keeps the rounded copies for its backward, which rounds the incoming gradient once for both of its products), then
// holds a Bf16ProductsScope around its kernel call: the CPU matmul kernel then hands the bfloat16 operands to
// matmul_bf16_products, one oneDNN matmul primitive per row block with float32 accumulation. Thread-local: the scope
// and the kernel's check are on the op's calling thread.
struct Bf16ProductsScope {
  Bf16ProductsScope();
  ~Bf16ProductsScope();
  Bf16ProductsScope(const Bf16ProductsScope&) = delete;
  Bf16ProductsScope& operator=(const Bf16ProductsScope&) = delete;

 private:
  bool prev_;
};
bool bf16_products();
// A float32 CPU tensor rounded to bfloat16 (to nearest even; NaN stays NaN; a denormal to a zero of its sign, as
// AVX512-BF16's instruction reads it, and as the products read a bfloat16 denormal), in its own layout when it is
// contiguous or a transposed view of a contiguous tensor (else contiguous). Not differentiable. Throws asc::Error where
// asc::cpu_bf16_supported() is false. With column_sums, a contiguous 2-D t of more than one column also gets its
// float32 values summed over the rows in the same pass, with sum(t, {0})'s bits (a bias's gradient beside the rounded
// incoming gradient of its product); otherwise *column_sums is left undefined.
Tensor round_to_bfloat16(const Tensor& t, Tensor* column_sums = nullptr);
// a (Bt, M, K), b (Bt, K, N): bfloat16, any strides; out: contiguous float32 (Bt, M, N); bias: undefined, or a
// contiguous float32 (N) added to every row of each row block's product while it is in cache (addmm_bf16). Throws
// asc::Error where asc::cpu_bf16_supported() is false.
void matmul_bf16_products(const Tensor& a, const Tensor& b, Tensor& out, const Tensor& bias = Tensor());
// c (rows, n; contiguous) += bias (n) on every row, at the processor's vector width (ops/cpu/matmul.cpp).
void add_bias_rows(float* c, const float* bias, int64_t rows, int64_t n);

}  // namespace asc::cpu
