#pragma once
// One GEMM for the CPU kernels: C (M, N; rows ldc apart, columns contiguous) = A (M, K) · B (K, N), or += with
// `accumulate`. A and B have arbitrary element strides (s*m/s*k: row/column strides); OpenBLAS runs it when the
// strides fit a BLAS operand (ops/layout.h: gemm_operand), else a cache-blocked loop nest. Single-threaded:
// callers parallelise over independent products. Instantiated for float and double (ops/cpu/matmul.cpp).
#include <cstdint>

namespace asc {
class Tensor;
}

namespace asc::cpu {

template <class T>
void gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t sam, int64_t sak, const T* B, int64_t sbk, int64_t sbn,
          T* C, int64_t ldc, bool accumulate = false);

// bfloat16 products (ops/cpu/gemm_bf16.cpp). The matmul op holds a Bf16ProductsScope around its kernel call for a
// product recorded by matmul_bf16 (or linear under CpuAutocast); the CPU matmul kernel then hands its float32
// operands to matmul_bf16_products: each rounded to bfloat16 once, multiplied with float32 accumulation by oneDNN.
// Thread-local: the scope and the kernel's check are on the op's calling thread.
struct Bf16ProductsScope {
  Bf16ProductsScope();
  ~Bf16ProductsScope();
  Bf16ProductsScope(const Bf16ProductsScope&) = delete;
  Bf16ProductsScope& operator=(const Bf16ProductsScope&) = delete;

 private:
  bool prev_;
};
bool bf16_products();
// a (Bt, M, K), b (Bt, K, N): float32, any strides; out: contiguous float32 (Bt, M, N). Throws asc::Error where
// asc::cpu_bf16_supported() is false.
void matmul_bf16_products(const Tensor& a, const Tensor& b, Tensor& out);

}  // namespace asc::cpu
