#pragma once
// Launchers of the CUDA reduction kernels (cuda/reduce.cu), called by cuda/reduce.cpp after it has validated the
// tensors. C++17-clean and plain data only (included by a .cu file). Layouts and semantics are those of the CPU
// kernels in ops/kernel_list.inc. Each launcher returns cudaGetLastError() after its launch (cudaSuccess when
// there was nothing to do).
#include <cuda_runtime.h>

#include <cstdint>

namespace asc::cuda::reduce_launch {

enum class Elem : uint8_t { F32, F64, BF16, F16, I64 };

// x: (rows, n) contiguous, n >= 1; values: (rows) of x's type; indices: (rows) int64 or nullptr.
cudaError_t max_min_lastdim(Elem t, const void* x, bool is_max, void* values, int64_t* indices, int64_t rows, int64_t n,
                            cudaStream_t stream);
// x: (outer, n, inner) contiguous, n >= 1; values: (outer, inner); indices: (outer, inner) int64 or nullptr.
cudaError_t max_min_middim(Elem t, const void* x, bool is_max, void* values, int64_t* indices, int64_t outer, int64_t n,
                           int64_t inner, cudaStream_t stream);
// x: (rows, n) contiguous floating (not I64); out: (rows). n may be 0 (gives -inf).
cudaError_t logsumexp_lastdim(Elem t, const void* x, void* out, int64_t rows, int64_t n, cudaStream_t stream);

}  // namespace asc::cuda::reduce_launch
