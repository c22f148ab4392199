#pragma once
// Launchers of the tensor-core check kernels (cuda/mma_check.cu), called by cuda/mma_check.cpp. C++17-clean, plain
// data. Row-major contiguous operands of element type `elem` (F32: TF32 operands; BF16; F16); results float32.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/float_elem.h"

namespace asc::cuda::mma_check_launch {

// c (M, N) = a (M, K) · B, B = bᵀ for b (N, K) when b_nk, else b (K, N). M a multiple of 16, N of 8, K of 16.
cudaError_t product(FloatElem elem, bool b_nk, int64_t M, int64_t N, int64_t K, const void* a, const void* b, float* c,
                    cudaStream_t stream);
// d (M, P) = (a bᵀ) w for a (M, K), b (N, K), w (N, P), the product a bᵀ passed from accumulators to the next A
// operand in registers (16-bit elements only). M a multiple of 16, N of 16, K of 16, P of 8.
cudaError_t chain(FloatElem elem, int64_t M, int64_t N, int64_t K, int64_t P, const void* a, const void* b,
                  const void* w, float* d, cudaStream_t stream);

}  // namespace asc::cuda::mma_check_launch
