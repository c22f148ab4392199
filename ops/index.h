#pragma once
// Indexing, joining and splitting. Index tensors are int64; every index is bounds-checked (an out-of-range
// index is an asc::Error naming the op, the index and the dimension size, never a wild read).
//
//   Tensor rows = asc::index_select(x, 0, asc::tensor(std::vector<int64_t>{2, 0}, {2}));
//   Tensor y = asc::cat({a, b}, -1);
#include "core/tensor.h"

namespace asc {

// x.select along `dim` at each of `index` (1-D, or 0-D, int64): out.shape[dim] = index.numel().
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// out[i][j][k] = x[index[i][j][k]][j][k] for dim 0 (and so on): index has x's rank; out has index's shape.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// out = x, then out[index[i][j]][j] += src[i][j] (dim 0); index and src must have exactly the same shape (PyTorch
// also allows a larger src; here that is an error). Differentiable in x, src.
// Accumulation: bfloat16/float16 sums are taken in float32 and rounded once (here and in the backward of
// index_select and embedding). On CUDA the additions run as atomics (embedding's backward too, when few columns
// meet many indices), so floating sums may differ in the last bits from run to run; the CPU order is fixed.
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
// torch.scatter (out of place): out = x, then out[index[i][j]][j] = src[i][j] (dim 0), and so on; index has x's
// rank and sizes <= x's on the other dims, bounds-checked; src has exactly index's shape (PyTorch also allows a larger
// src; here that is an error, as in scatter_add). Where an index repeats along dim, the last write along dim wins, on
// every device (PyTorch leaves it unspecified). Differentiable in x (zero gradient at the written places) and in src
// (the gradient gathered at index, zero for the writes that lost). The value form writes `value` wherever index
// points.
//   asc::Tensor mask = asc::scatter(asc::zeros({B, V}), 1, top_ids, 1.0);  // (B, V): 1 at each row's top ids
Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, double value);
// Joins along an existing dim (cat) or a new one (stack). All inputs share dtype, device, and other sizes.
Tensor cat(const TensorList& xs, int64_t dim);
Tensor stack(const TensorList& xs, int64_t dim);
// Views of consecutive pieces of `size` along dim (the last may be smaller) / of `chunks` nearly equal pieces.
TensorList split(const Tensor& x, int64_t size, int64_t dim);
// Views of consecutive pieces of the given sizes along dim (they must add up to its length), as PyTorch's
// split_with_sizes; one autograd node whose backward is one cat of the pieces' gradients.
//   auto qkv = asc::split_with_sizes(y, {D, D, D}, -1);  // y (B, T, 3D) -> three (B, T, D) views
TensorList split_with_sizes(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
TensorList chunk(const Tensor& x, int64_t chunks, int64_t dim);
// (..., ) int64 -> (..., num_classes) of dtype `dtype` (default float32). Not differentiable.
Tensor one_hot(const Tensor& index, int64_t num_classes, DType dtype = kFloat32);
// weight (V, D), index (...) int64 -> (..., D). Gradient accumulates into the rows of weight used;
// rows equal to padding_idx (if >= 0) get no gradient (the forward still reads them). padding_idx is -1 (none)
// or in [0, V); other negative values are an error (no wrap-around).
Tensor embedding(const Tensor& weight, const Tensor& index, int64_t padding_idx = -1);

}  // namespace asc
