#pragma once
// Elementwise ops with NumPy broadcasting and type promotion (bool < int64 < float32 < float64).
// All floating ops are differentiable; comparisons return bool tensors and are not.
//
//   Tensor y = asc::gelu(x * 2.0 + b);             // b broadcasts over x's leading dims
//   Tensor m = asc::gt(x, 0.0);                     // bool mask
//   Tensor z = asc::where(m, x, asc::zeros_like(x));
#include <optional>

#include "core/tensor.h"

namespace asc {

// ---- binary (broadcasting) ------------------------------------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);      // a > 0 where b is not an integer; gradient to b uses log(a)
Tensor maximum(const Tensor& a, const Tensor& b);  // ties split the gradient equally
Tensor minimum(const Tensor& a, const Tensor& b);

// ---- tensor-scalar ---------------------------------------------------------------------------------------------
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor rsub(double a, const Tensor& b);  // a - b
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor rdiv(double a, const Tensor& b);  // a / b
Tensor pow(const Tensor& a, double e);

// ---- unary -----------------------------------------------------------------------------------------------------
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);                                    // gradient sign(x), 0 at 0
Tensor relu(const Tensor& x);                                   // gradient 1[x > 0]
Tensor gelu(const Tensor& x, bool tanh_approximation = false);  // exact: x * Phi(x)
Tensor silu(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor softplus(const Tensor& x, double beta = 1.0, double threshold = 20.0);  // linear where beta*x > threshold
// Clamps to [lo, hi] (either bound optional); gradient 1 strictly inside, 0 where clamped.
Tensor clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi);

// ---- comparisons and selection ---------------------------------------------------------------------------------
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor ne(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor le(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor ge(const Tensor& a, double b);
Tensor logical_and(const Tensor& a, const Tensor& b);  // bool inputs
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_not(const Tensor& a);
// cond ? a : b, broadcasting all three; cond must be bool. Differentiable in a and b.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, double b);
Tensor where(const Tensor& cond, double a, const Tensor& b);
// x with `value` where mask (bool, broadcastable to x) is true. Differentiable in x.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// True where x is NaN.
Tensor isnan(const Tensor& x);
// torch.tril / torch.triu over the last two dims (batch dims kept, any dtype): tril keeps x[..., i, j] where
// j - i <= diagonal and zeroes the rest, triu keeps j - i >= diagonal. Differentiable (the gradient masked alike).
//   asc::Tensor causal = asc::tril(asc::ones({T, T}));  // nanoGPT's bias buffer
Tensor tril(const Tensor& x, int64_t diagonal = 0);
Tensor triu(const Tensor& x, int64_t diagonal = 0);
// True when any element of x is NaN or infinite (floating dtypes).
bool has_non_finite(const Tensor& x);

// Sums `g` over broadcast dimensions so it has `shape` (the gradient of an expand/broadcast).
Tensor sum_to(const Tensor& g, const Shape& shape);

}  // namespace asc
