#pragma once
// CPU kernels of the geometry ops (ops/geometry.h). Every kernel takes validated, contiguous inputs viewed as
// R rows of the last dimension and writes preallocated contiguous outputs.
#include <cstdint>

#include "core/tensor.h"
#include "ops/geometry.h"

namespace asc::cpu {

// x (R, n) float; mask undefined or bool (R, n) (false = never selected); diag_n > 0 excludes column r % diag_n
// of row r. Writes the k best entries of each row, sorted (ties: lower index first), into values (R, k) (x's
// dtype) and indices (R, k) int64. Every row must have at least k selectable entries (checked by the op).
void topk(const Tensor& x, const Tensor& mask, int64_t k, bool largest, int64_t diag_n, Tensor& values,
          Tensor& indices);
// Number of selectable entries of each row (same selection rules as topk) into counts (R) int64.
void topk_count(const Tensor& mask, int64_t diag_n, Tensor& counts);
// gx (R, n), zero-filled by the caller: gx[r, indices[r, j]] += g[r, j].
void topk_backward(const Tensor& g, const Tensor& indices, Tensor& gx);
// y = x / max(||x||, eps) per row of x (R, d); norm (R) receives ||x||.
void normalize_rows(const Tensor& x, double eps, Tensor& y, Tensor& norm);
// Per row of x (R, n) over the valid entries (mask undefined: all; else bool (R, n)): population mean and std;
// y = (x - mean) / (std + eps) on valid entries, 0 elsewhere (and on rows with no valid entry); sd (R) = std.
void row_standardize(const Tensor& x, const Tensor& mask, double eps, Tensor& y, Tensor& sd);
// out = s.derivative(u, width) elementwise (u and out contiguous, same float dtype).
void apply_surrogate(const Surrogate& s, double width, const Tensor& u, Tensor& out);

}  // namespace asc::cpu
