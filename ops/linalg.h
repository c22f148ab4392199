#pragma once
// Matrix products.
//   Tensor y = asc::matmul(x, w);   // (B, T, K) @ (K, N) -> (B, T, N); batch dims broadcast
#include "core/tensor.h"

namespace asc {

// NumPy matmul semantics: 1-D operands are promoted (and the added dim removed), leading batch dims broadcast.
// GEMM through OpenBLAS when available; transposed views are passed to BLAS without a copy.
Tensor matmul(const Tensor& a, const Tensor& b);

}  // namespace asc
