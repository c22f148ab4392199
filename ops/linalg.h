#pragma once
// Matrix products.
//   Tensor y = asc::matmul(x, w);   // (B, T, K) @ (K, N) -> (B, T, N); batch dims broadcast
#include "core/tensor.h"

namespace asc {

// NumPy matmul semantics: 1-D operands are promoted (and the added dim removed), leading batch dims broadcast.
// GEMM through OpenBLAS when available; transposed views are passed to BLAS without a copy.
Tensor matmul(const Tensor& a, const Tensor& b);

// matmul of float32 CPU tensors with its products in bfloat16: both operands rounded to bfloat16 (to nearest even;
// NaN stays NaN), multiplied with float32 accumulation into a float32 result; the products of its backward likewise
// (dA = dC Bᵀ and dB = Aᵀ dC, each operand rounded). What linear() runs under CpuAutocast (core/autocast.h). Throws
// asc::Error for other dtypes or devices, and where asc::cpu_bf16_supported() is false.
//   Tensor y = asc::matmul_bf16(x, w.t());   // (N, K) @ (K, M) -> (N, M), float32
Tensor matmul_bf16(const Tensor& a, const Tensor& b);

// bias + a @ b with the bias (N) broadcast over the rows of the (M, K) @ (K, N) product, as torch.addmm with a 1-D
// input: one GEMM that writes each row as the bias plus its product, no second pass over the output. What linear()
// runs for a layer with a bias (outside CpuAutocast). Differentiable in all three; the bias's gradient is dC summed
// over the rows.
//   Tensor y = asc::addmm(b, x, w.t());   // (N) + (M, K) @ (K, N) -> (M, N)
Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b);

// addmm with matmul_bf16's products: float32 CPU operands rounded to bfloat16, float32 accumulation, the float32 bias
// added to each row block of the product as it is written (the same bits as matmul_bf16(a, b) + bias, without the
// second pass). What linear() runs for a layer with a bias under CpuAutocast. Its backward: matmul_bf16's products,
// and the bias's gradient dC summed over the rows in float32. Throws asc::Error as matmul_bf16 does.
//   Tensor y = asc::addmm_bf16(b, x, w.t());   // (N) + (M, K) @ (K, N) -> (M, N), float32
Tensor addmm_bf16(const Tensor& bias, const Tensor& a, const Tensor& b);

}  // namespace asc
