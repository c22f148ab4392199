#pragma once
// Tensor-core products through cuda/mma.cuh at their plainest (cuda/mma_check.cu: one warp per output tile, fragments
// straight from global memory): what tests/test_cuda_mma.cpp compares with float64 products, on the CPU emulator in
// CI and on a GPU in tools/gpu_check.sh, where they show that the emulator's fragment layouts are the hardware's.
// Not an op: no autograd, no dispatch; CUDA tensors only.
//
//   Tensor c = asc::cuda::mma_product(a, b, /*b_nk=*/true);   // a (M, K) · bᵀ, b (N, K)
#include "core/tensor.h"

namespace asc::cuda {

// a (M, K) · B as float32 (M, N): B = bᵀ for b (N, K) when b_nk, else b (K, N). float32 operands run as TF32,
// bfloat16 and float16 as themselves. M a multiple of 16, N of 8, K of 16.
Tensor mma_product(const Tensor& a, const Tensor& b, bool b_nk);
// (a bᵀ) w as float32 (M, P), for a (M, K), b (N, K), w (N, P) of bfloat16 / float16: a bᵀ goes from the
// accumulators to the next product's A operand in registers, rounded to the element type once (flash attention's P v).
// M, N, K multiples of 16; P a multiple of 8, at most 64.
Tensor mma_chain(const Tensor& a, const Tensor& b, const Tensor& w);

}  // namespace asc::cuda
