#pragma once
// Launchers of the CUDA geometry kernels (cuda/geometry.cu), called by cuda/geometry.cpp with plain data. Every
// input is contiguous and viewed as R rows of the last dimension; `elem` is the element type of the float tensors
// (bfloat16 / float16 compute in float32, float32 / float64 as the CPU kernels do).
// C++17-clean; each launcher returns the launch's cudaError_t.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/float_elem.h"
#include "ops/math.h"  // math::SurrogateKind, math::surrogate_derivative

namespace asc::cuda {

// values / indices (R, k) = the k best selectable entries of each row of x (R, n), sorted, ties by the lower
// index, NaN the largest value. mask: nullptr or bool (R, n); diag_n > 0 excludes column r % diag_n of row r.
// Needs n < 2^31 and at least k selectable entries per row.
cudaError_t launch_topk(const void* x, const bool* mask, int64_t R, int64_t n, int64_t k, bool largest, int64_t diag_n,
                        void* values, int64_t* indices, FloatElem elem, cudaStream_t stream);
// counts (R) int64 = selectable entries of each row of mask (R, n).
cudaError_t launch_topk_count(const bool* mask, int64_t R, int64_t n, int64_t diag_n, int64_t* counts,
                              cudaStream_t stream);
// gx (R, n) [r, indices[r, j]] += g (R, k) [r, j].
cudaError_t launch_topk_backward(const void* g, const int64_t* indices, int64_t R, int64_t k, int64_t n, void* gx,
                                 FloatElem elem, cudaStream_t stream);
// y = x / max(||x||, eps) per row of x (R, d); norm (R) = ||x||.
cudaError_t launch_normalize_rows(const void* x, int64_t R, int64_t d, double eps, void* y, void* norm, FloatElem elem,
                                  cudaStream_t stream);
// Masked row standardisation (population std) of x (R, n); mask nullptr or bool (R, n); sd (R) = std.
cudaError_t launch_row_standardize(const void* x, const bool* mask, int64_t R, int64_t n, double eps, void* y, void* sd,
                                   FloatElem elem, cudaStream_t stream);
// out[i] = math::surrogate_derivative(kind, u[i], width) for N elements.
cudaError_t launch_apply_surrogate(math::SurrogateKind kind, double width, const void* u, int64_t N, void* out,
                                   FloatElem elem, cudaStream_t stream);

}  // namespace asc::cuda
