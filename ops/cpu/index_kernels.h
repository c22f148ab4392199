#pragma once
// CPU kernels of the indexing / joining ops (ops/index.h). Like every kernel they take validated inputs (index
// tensors are int64 and already bounds-checked by the op) and write into preallocated outputs. cat and stack
// need no kernel of their own: they copy each input into a slice of the output with cpu::copy.
#include <cstdint>

#include "core/tensor.h"

namespace asc::cpu {

// lo/hi = the smallest/largest value of a non-empty int64 tensor (any strides); used for bounds checks.
void index_minmax(const Tensor& index, int64_t& lo, int64_t& hi);
// out (contiguous; x's shape with dim replaced by index.numel()) = x.select(dim, index[j]) for each j.
// x: any dtype and strides; index: 0-D or 1-D int64.
void index_select(const Tensor& x, int dim, const Tensor& index, Tensor& out);
// out (contiguous, float) [.., index[j], ..] += src[.., j, ..] along dim, skipping entries whose index equals
// `skip` (pass -1 to skip nothing). src has out's shape with dim replaced by index.numel(); any strides.
void index_add(Tensor& out, int dim, const Tensor& index, const Tensor& src, int64_t skip);
// out (contiguous, index's shape) = x[.., index[i..], ..] along dim. x and index: same rank, any strides.
void gather(const Tensor& x, int dim, const Tensor& index, Tensor& out);
// out (contiguous, numeric) [.., index[i..], ..] += src[i..] along dim; src has index's shape, any strides.
void scatter_add(Tensor& out, int dim, const Tensor& index, const Tensor& src);
// out (contiguous, index's shape + (C,), already zero) gets 1 at [i.., index[i..]].
void one_hot(const Tensor& index, Tensor& out);

}  // namespace asc::cpu
