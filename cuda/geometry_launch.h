#pragma once
// Launchers of the CUDA geometry kernels (cuda/geometry.cu), called by cuda/geometry.cpp with plain data. Every
// input is contiguous and viewed as R rows of the last dimension; `elem` is the element type of the float tensors
// (bfloat16 / float16 compute in float32, float32 / float64 as the CPU kernels do).
// C++17-clean; each launcher returns the launch's cudaError_t.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/float_elem.h"
#include "ops/math.h"  // ASC_HD

namespace asc::cuda {

// The built-in surrogates of ops/geometry.cpp's registry, by kind.
enum class SurrogateKind : uint8_t { Sigmoid, Rectangular, Triangular, Atan };

// s'(u; width) of the built-in surrogates, in float64: the same formulas as the registry's host functions (which
// could call this too, so that both backends share one definition).
ASC_HD double surrogate_derivative(SurrogateKind kind, double u, double w) {
  switch (kind) {
    case SurrogateKind::Sigmoid: {  // alpha sigma(alpha u)(1 - sigma(alpha u)) = alpha e^{-|alpha u|} / (1 + e^{-|alpha u|})^2
      const double e = std::exp(-std::fabs(w * u));
      return w * e / ((1.0 + e) * (1.0 + e));
    }
    case SurrogateKind::Rectangular: return std::fabs(u) < w / 2 ? 1.0 / w : 0.0;
    case SurrogateKind::Triangular: {
      const double t = 1.0 - std::fabs(u) / w;
      return (t > 0.0 ? t : 0.0) / w;
    }
    case SurrogateKind::Atan: {
      const double t = 3.14159265358979323846 / 2 * w * u;
      return w / (2.0 * (1.0 + t * t));
    }
  }
  return 0.0;
}

// values / indices (R, k) = the k best selectable entries of each row of x (R, n), sorted, ties by the lower
// index, NaN the largest value. mask: nullptr or bool (R, n); diag_n > 0 excludes column r % diag_n of row r.
// Needs n < 2^31 and at least k selectable entries per row.
cudaError_t launch_topk(const void* x, const bool* mask, int64_t R, int64_t n, int64_t k, bool largest,
                        int64_t diag_n, void* values, int64_t* indices, FloatElem elem, cudaStream_t stream);
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
cudaError_t launch_row_standardize(const void* x, const bool* mask, int64_t R, int64_t n, double eps, void* y,
                                   void* sd, FloatElem elem, cudaStream_t stream);
// out[i] = surrogate_derivative(kind, u[i], width) for N elements.
cudaError_t launch_apply_surrogate(SurrogateKind kind, double width, const void* u, int64_t N, void* out, FloatElem elem,
                                   cudaStream_t stream);

}  // namespace asc::cuda
