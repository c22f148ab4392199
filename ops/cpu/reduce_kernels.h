#pragma once
// CPU kernels of the reductions (ops/reduce.cpp). Every kernel reduces over the LAST dimension of a contiguous
// (rows, n) tensor, one row per output element; the op permutes the reduced axes to the end first. Rows run in
// parallel. The CUDA backend is to provide the same signatures in namespace asc::cuda.
#include <cstdint>

#include "core/tensor.h"

namespace asc::cpu {

// values[r] = max (is_max) or min of x[r, :], indices[r] = the first column holding it (NaN wins: the first
// NaN is selected, as in PyTorch). x: (rows, n) contiguous, n >= 1, float32/float64/int64; values: (rows,) of
// x's dtype; indices: (rows,) int64, or an undefined Tensor when only the values are wanted.
void max_min_lastdim(const Tensor& x, bool is_max, Tensor& values, Tensor& indices);

// The same over the MIDDLE dimension of a contiguous (outer, n, inner) tensor: values/indices are (outer, inner)
// contiguous. Used when the reduced axes are consecutive in a contiguous input (no transposing copy).
void max_min_middim(const Tensor& x, bool is_max, Tensor& values, Tensor& indices);

// out[r] = log(sum_j exp(x[r, j])), max-shifted. A row whose max is -inf (all -inf, or n == 0) gives -inf, a
// row containing +inf gives +inf, a row containing NaN gives NaN. x: (rows, n) contiguous float; out: (rows,).
void logsumexp_lastdim(const Tensor& x, Tensor& out);

}  // namespace asc::cpu
