#pragma once
// Layout arithmetic every backend's kernels share: merging dimensions of strided operands, splitting a shape
// around one dimension, and how a strided 2-D operand maps onto a BLAS GEMM. Plain functions of shapes and strides,
// written once here instead of once per backend (ops/cpu/, cuda/).
#include <algorithm>
#include <array>
#include <cstdint>

#include "core/shape.h"

namespace asc {

// N operands over one shape with their own element strides (0 on broadcast dims), after coalescing.
template <int N>
struct StridedLayout {
  Shape shape;                     // coalesced
  std::array<Strides, N> strides;  // coalesced, per operand
};

// Drops size-1 dims, then merges dim d into the one before it when every operand has stride[prev] ==
// stride[d] * size[d]. Contiguous operands collapse to one dim of numel elements; a scalar gives shape (1).
template <int N>
StridedLayout<N> coalesce(const Shape& shape, const std::array<Strides, N>& strides) {
  StridedLayout<N> out;
  for (int d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    int last = out.shape.size() - 1;
    bool merge = last >= 0;
    for (int k = 0; k < N && merge; ++k) merge = out.strides[k][last] == strides[k][d] * shape[d];
    if (merge) {
      out.shape[last] *= shape[d];
      for (int k = 0; k < N; ++k) out.strides[k][last] = strides[k][d];
    } else {
      out.shape.push_back(shape[d]);
      for (int k = 0; k < N; ++k) out.strides[k].push_back(strides[k][d]);
    }
  }
  if (out.shape.empty()) {  // a scalar, or all dims of size 1
    out.shape.push_back(1);
    for (int k = 0; k < N; ++k) out.strides[k].push_back(0);
  }
  return out;
}

// A contiguous shape seen as (outer, size[dim], inner).
struct OuterInner {
  int64_t outer = 1, inner = 1;
};
inline OuterInner split_at(const Shape& s, int dim) {
  OuterInner r;
  for (int d = 0; d < dim; ++d) r.outer *= s[d];
  for (int d = dim + 1; d < s.size(); ++d) r.inner *= s[d];
  return r;
}

// A (rows x cols) matrix operand with element strides (s_row, s_col), as a row-major GEMM takes it: rows
// contiguous (trans = false, leading dim ld = s_row) or a transposed view with columns contiguous (trans = true,
// ld = s_col). ok = false when neither stride is 1 (or they overlap): the operand needs a contiguous copy. Column-
// major libraries (cuBLAS) take the same operand as the transposed problem, so one rule serves both backends.
struct GemmOperand {
  bool trans = false;
  int64_t ld = 0;
  bool ok = false;
};
inline GemmOperand gemm_operand(int64_t rows, int64_t cols, int64_t s_row, int64_t s_col) {
  if (s_col == 1 && (s_row >= std::max<int64_t>(cols, 1) || rows == 1)) return {false, std::max(s_row, cols), true};
  if (s_row == 1 && (s_col >= std::max<int64_t>(rows, 1) || cols == 1)) return {true, std::max(s_col, rows), true};
  return {};
}

}  // namespace asc
