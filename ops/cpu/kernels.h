#pragma once
// CPU kernel entry points. Kernels assume validated inputs (ops check shapes, dtypes and devices first) and
// write into preallocated outputs. The CUDA backend provides the same signatures in namespace asc::cuda.
#include <cstdint>

#include "core/tensor.h"
#include "ops/math.h"

namespace asc::cpu {

// out = op(x); out is contiguous with x's shape (x may be strided).
void unary(math::Unary op, const math::UnaryParams& p, const Tensor& x, Tensor& out);
// gx = g * d op(x)/dx, with y = op(x) available for ops whose derivative uses it.
void unary_backward(math::Unary op, const math::UnaryParams& p, const Tensor& g, const Tensor& x, const Tensor& y,
                    Tensor& gx);
// out = op(a, b) with a, b broadcast to out's shape; a and b share a dtype; out is that dtype or bool.
void binary(math::Binary op, const Tensor& a, const Tensor& b, Tensor& out);
// out = cond ? a : b (broadcast to out's shape).
void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out);
// dst = src, broadcasting src to dst's shape and converting dtype; dst may be strided.
void copy(const Tensor& src, Tensor& dst);
void fill(Tensor& dst, double value);
void isnan(const Tensor& x, Tensor& out);
// out (x's shape with reduced dims of size 1, contiguous) = sum of x over those dims.
void sum(const Tensor& x, Tensor& out);
// out = a @ b for 2-D or batched 3-D (B, M, K) x (B, K, N) -> (B, M, N) with arbitrary strides.
void matmul(const Tensor& a, const Tensor& b, Tensor& out);
// Random fills from Philox counters [offset, ...): see core/generator.h for the element -> counter map.
void uniform(Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi);
// out[i] = scale where the uniform that rand() would draw for element i is >= p, else 0.
void dropout_mask(Tensor& out, uint64_t seed, uint64_t offset, double p, double scale);
void normal(Tensor& out, uint64_t seed, uint64_t offset, double mean, double stddev);
void randint(Tensor& out, uint64_t seed, uint64_t offset, int64_t low, int64_t high);

}  // namespace asc::cpu
