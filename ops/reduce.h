#pragma once
// Reductions over any set of axes (negative axes count from the end; an empty `dims` list means all axes),
// with keepdim. All differentiable except the index outputs.
//
//   Tensor m = asc::mean(x, {-1}, /*keepdim=*/true);      // (B, T, 1)
//   auto [v, i] = asc::max(x, 1);                         // values and int64 indices along dim 1
//   Tensor top = asc::max(x);                              // the largest element, 0-d (PyTorch's x.max())
#include "core/tensor.h"

namespace asc {

struct ValuesIndices {
  Tensor values;
  Tensor indices;  // int64
};

Tensor sum(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
// var, std, logsumexp and norm compute integer inputs in float32 (as mean does).
// Variance with `correction` (0: population, 1: unbiased / Bessel). Error when N - correction <= 0.
Tensor var(const Tensor& x, const Dims& dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor std(const Tensor& x, const Dims& dims = {}, int64_t correction = 1, bool keepdim = false);
// Max / min along one dim with the (first) index of the extreme; error on an empty dimension. NaN counts as the
// extreme (the first NaN is selected), as in PyTorch.
// Gradient flows to the selected element.
ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim = false);
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim = false);
// Max / min over axes (all when empty); ties split the gradient equally among the maxima. Error on an empty axis.
Tensor amax(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);
// Over every element, as PyTorch's torch.max(x) / x.min() without a dimension: a 0-d tensor (amax / amin over all
// axes: NaN anywhere gives NaN, ties share the gradient equally); argmax / argmin: the 0-d int64 index of the first
// extreme in the flattened tensor (row-major, whatever its strides; NaN counts as the extreme). Error when empty.
Tensor max(const Tensor& x);
Tensor min(const Tensor& x);
Tensor argmax(const Tensor& x);
Tensor argmin(const Tensor& x);
// Product of every element (a 0-d tensor; 1 for an empty tensor) or along one dim, as torch.prod. Bool and integer
// inputs give int64. Computed as a tree of elementwise products, so the gradient of each element is exactly the
// product of the others, also where the input holds zeros (no division by x).
//   asc::Tensor p = asc::prod(x, 1);  // (B, T) -> (B,)
Tensor prod(const Tensor& x);
Tensor prod(const Tensor& x, int64_t dim, bool keepdim = false);
// Whether any / every element is non-zero (NaN counts as non-zero), over all elements (0-d) or along one dim: bool,
// not differentiable. Over zero elements any is false and all is true, as in PyTorch.
Tensor any(const Tensor& x);
Tensor any(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor all(const Tensor& x);
Tensor all(const Tensor& x, int64_t dim, bool keepdim = false);
// log(sum(exp(x))) computed stably (max-shifted); rows of all -inf (or empty rows) give -inf with gradient 0; a
// row containing +inf gives +inf, its gradient split equally among the +inf entries.
Tensor logsumexp(const Tensor& x, const Dims& dims = {}, bool keepdim = false);
// p-norm (p = 2 by default; p = 1, any p >= 1, and p = inf supported). Gradient of the 2-norm at 0 is 0.
Tensor norm(const Tensor& x, double p = 2.0, const Dims& dims = {}, bool keepdim = false);

// Helpers for op implementers: the wrapped, sorted, de-duplicated axes (all when `dims` is empty), and the
// output shape with those axes kept as size 1 or removed.
Dims reduction_axes(const Dims& dims, int ndim, const char* op);
Shape reduced_shape(const Shape& shape, const Dims& axes, bool keepdim);

}  // namespace asc
