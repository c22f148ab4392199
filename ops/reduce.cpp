// Reductions beyond sum/mean (which live in reduce_sum.cpp): var, std, max/min with indices, amax/amin,
// argmax/argmin, logsumexp, norm. Each op validates, runs a kernel over a contiguous (rows, n) view whose last
// dimension holds the reduced elements (ops/kernel_list.inc) or composes available ops, and records its
// backward right beside the forward.
#include <cmath>
#include <limits>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/index.h"
#include "ops/kernels.h"
#include "ops/reduce.h"

namespace asc {
namespace {

// x with the reduced `axes` (sorted, unique) moved to the end, made contiguous and flattened to (rows, n):
// row r holds the elements reduced into output element r, in the row-major order of the kept dims.
Tensor as_rows(const Tensor& x, const Dims& axes) {
  NoGradGuard ng;  // the kernel reads raw data; the op records its own node against x
  Dims order;
  int64_t rows = 1, n = 1;
  int a = 0;
  for (int i = 0; i < x.dim(); ++i) {
    if (a < axes.size() && axes[a] == i) {
      ++a;
      n *= x.size(i);
    } else {
      order.push_back(i);
      rows *= x.size(i);
    }
  }
  for (auto ax : axes) order.push_back(ax);
  return x.permute(order).contiguous().reshape({rows, n});
}

int64_t reduced_count(const Tensor& x, const Dims& axes) {
  int64_t n = 1;
  for (auto a : axes) n *= x.size(a);
  return n;
}

// Non-floating inputs of the floating-only reductions are computed in float32 (as mean does).
Tensor as_floating(const Tensor& x) { return is_floating(x.dtype()) ? x : x.to(kFloat32); }

// Runs the max/min kernel of x over `axes` (sorted, unique, each of size > 0) into `values` / `indices` (x's shape
// with the axes kept as size 1, contiguous; indices may be undefined). A contiguous input whose reduced axes
// are consecutive is read in place as (outer, n, inner); anything else is first copied into (rows, n).
void run_max_min(const Tensor& x, const Dims& axes, bool is_max, Tensor& values, Tensor& indices, const char* op) {
  NoGradGuard ng;
  bool consecutive = !axes.empty() && x.is_contiguous();
  for (int k = 1; k < axes.size() && consecutive; ++k) consecutive = axes[k] == axes[k - 1] + 1;
  if (consecutive) {
    int64_t outer = 1, n = 1, inner = 1;
    for (int i = 0; i < x.dim(); ++i) {
      if (i < axes[0])
        outer *= x.size(i);
      else if (i <= axes[axes.size() - 1])
        n *= x.size(i);
      else
        inner *= x.size(i);
    }
    Tensor vflat = values.view({outer * inner});
    Tensor iflat = indices.defined() ? indices.view({outer * inner}) : Tensor();
    if (inner == 1) {
      ASC_KERNEL(x.device(), op, max_min_lastdim, x.view({outer, n}), is_max, vflat, iflat);
    } else {
      Tensor v2 = values.view({outer, inner});
      Tensor i2 = indices.defined() ? indices.view({outer, inner}) : Tensor();
      ASC_KERNEL(x.device(), op, max_min_middim, x.view({outer, n, inner}), is_max, v2, i2);
    }
    return;
  }
  Tensor rows = as_rows(x, axes);  // (rows, n)
  Tensor vflat = values.view({rows.size(0)});
  Tensor iflat = indices.defined() ? indices.view({rows.size(0)}) : Tensor();
  ASC_KERNEL(x.device(), op, max_min_lastdim, rows, is_max, vflat, iflat);
}

struct MaxMinResult {
  Tensor values, indices;  // both with the keepdim shape
};

// max/min along one dim, without recording autograd. x has at least one dimension.
MaxMinResult max_min_forward(const Tensor& x, int d, bool is_max, bool want_indices, const char* op) {
  ASC_CHECK(x.dtype() != kBool, "{}: dtype bool is not supported (got a bool tensor of shape {})", op, x.shape());
  ASC_CHECK(x.size(d) > 0, "{}: cannot reduce over dimension {} of size 0 (shape {})", op, d, x.shape());
  Dims axes{d};
  Shape kept = reduced_shape(x.shape(), axes, true);
  MaxMinResult r;
  r.values = Tensor::empty(kept, x.options());
  if (want_indices) r.indices = Tensor::empty(kept, {.dtype = kInt64, .device = x.device()});
  run_max_min(x, axes, is_max, r.values, r.indices, op);
  return r;
}

ValuesIndices max_min(const Tensor& x_in, int64_t dim, bool keepdim, bool is_max, const char* op) {
  check_defined(op, x_in);
  const int d = wrap_dim(dim, x_in.dim(), op);
  const bool scalar = x_in.dim() == 0;
  Tensor x = scalar ? x_in.reshape({1}) : x_in;  // a 0-d tensor reduces as a one-element vector
  MaxMinResult r = max_min_forward(x, d, is_max, /*want_indices=*/true, op);
  Shape out_shape = scalar ? Shape{} : reduced_shape(x.shape(), {d}, keepdim);
  Tensor values = r.values.view(out_shape), indices = r.indices.view(out_shape);
  if (is_floating(x.dtype()) && autograd::needs_grad(x)) {
    Shape kept = r.values.shape(), in_shape = x.shape();
    const int64_t n = x.size(d);
    autograd::record(
        op, {x}, {values, indices},
        [kept, in_shape, n, d, is = autograd::SavedTensor(r.indices, op)](const TensorList& g) -> TensorList {
          const Tensor& idx = is.get();  // (kept) int64
          // The gradient goes to the selected element: mask[..., j, ...] = (j == idx[..., 0, ...]).
          Shape pos_shape;
          for (int i = 0; i < in_shape.size(); ++i) pos_shape.push_back(i == d ? n : 1);
          Tensor pos = arange(n, {.dtype = kInt64, .device = idx.device()}).view(pos_shape);
          Tensor mask = eq(pos, idx);  // (in_shape) bool
          return {where(mask, g[0].reshape(kept), 0.0).expand(in_shape).contiguous()};
        });
  }
  return {values, indices};
}

Tensor arg_max_min(const Tensor& x_in, int64_t dim, bool keepdim, bool is_max, const char* op) {
  check_defined(op, x_in);
  const int d = wrap_dim(dim, x_in.dim(), op);
  const bool scalar = x_in.dim() == 0;
  Tensor x = scalar ? x_in.reshape({1}) : x_in;
  MaxMinResult r = max_min_forward(x.detach(), d, is_max, /*want_indices=*/true, op);
  return r.indices.view(scalar ? Shape{} : reduced_shape(x.shape(), {d}, keepdim));
}

Tensor amax_amin(const Tensor& x, const Dims& dims, bool keepdim, bool is_max, const char* op) {
  check_defined(op, x);
  ASC_CHECK(x.dtype() != kBool, "{}: dtype bool is not supported (got a bool tensor of shape {})", op, x.shape());
  Dims axes = reduction_axes(dims, x.dim(), op);
  for (auto a : axes)
    ASC_CHECK(x.size(a) > 0, "{}: cannot reduce over dimension {} of size 0 (shape {})", op, a, x.shape());
  Shape kept = reduced_shape(x.shape(), axes, true);
  Tensor kept_out = Tensor::empty(kept, x.options()), none;
  run_max_min(x, axes, is_max, kept_out, none, op);
  Tensor out = keepdim ? kept_out : kept_out.view(reduced_shape(x.shape(), axes, false));
  if (is_floating(x.dtype()) && autograd::needs_grad(x)) {
    autograd::record(op, {x}, {out},
                     [kept, axes, xs = autograd::SavedTensor(x, op),
                      ys = autograd::SavedTensor(kept_out, op)](const TensorList& g) -> TensorList {
                       // Ties share the gradient equally: g * 1[x == y] / count.
                       const Tensor& x = xs.get();
                       Tensor mask = eq(x, ys.get()).to(x.dtype());       // (in_shape)
                       Tensor count = sum(mask, axes, /*keepdim=*/true);  // (kept)
                       return {mask * (g[0].reshape(kept) / count)};
                     });
  }
  return out;
}

}  // namespace

// ---- var / std --------------------------------------------------------------------------------------------------

Tensor var(const Tensor& x_in, const Dims& dims, int64_t correction, bool keepdim) {
  check_defined("var", x_in);
  Dims axes = reduction_axes(dims, x_in.dim(), "var");
  const int64_t n = reduced_count(x_in, axes);
  // correction < n, not n - correction > 0: the subtraction overflows for correction near INT64_MIN.
  ASC_CHECK(correction >= 0 && correction < n,
            "var: correction must be in [0, N), got N = {} and correction = {} (shape {}, dims {})", n, correction,
            x_in.shape(), dims);
  Tensor x = as_floating(x_in);
  // Two passes (mean, then squared deviations) keep the result accurate when |mean| >> std.
  Tensor d = x - mean(x, dims, /*keepdim=*/true);
  return div(sum(d * d, dims, keepdim), static_cast<double>(n - correction));
}

Tensor std(const Tensor& x, const Dims& dims, int64_t correction, bool keepdim) {
  check_defined("std", x);
  Dims axes = reduction_axes(dims, x.dim(), "std");
  const int64_t n = reduced_count(x, axes);
  // correction < n, not n - correction > 0: the subtraction overflows for correction near INT64_MIN.
  ASC_CHECK(correction >= 0 && correction < n,
            "std: correction must be in [0, N), got N = {} and correction = {} (shape {}, dims {})", n, correction,
            x.shape(), dims);
  return sqrt(var(x, dims, correction, keepdim));
}

// ---- max / min ---------------------------------------------------------------------------------------------------

ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim) { return max_min(x, dim, keepdim, true, "max"); }
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim) { return max_min(x, dim, keepdim, false, "min"); }
Tensor amax(const Tensor& x, const Dims& dims, bool keepdim) { return amax_amin(x, dims, keepdim, true, "amax"); }
Tensor amin(const Tensor& x, const Dims& dims, bool keepdim) { return amax_amin(x, dims, keepdim, false, "amin"); }
Tensor max(const Tensor& x) { return amax_amin(x, {}, false, true, "max"); }
Tensor min(const Tensor& x) { return amax_amin(x, {}, false, false, "min"); }
// The flattened tensor's extreme (a copy when x is strided: indices count in row-major order, as PyTorch's do).
Tensor argmax(const Tensor& x) {
  check_defined("argmax", x);
  return arg_max_min(x.reshape({-1}), 0, false, true, "argmax");
}
Tensor argmin(const Tensor& x) {
  check_defined("argmin", x);
  return arg_max_min(x.reshape({-1}), 0, false, false, "argmin");
}
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) { return arg_max_min(x, dim, keepdim, true, "argmax"); }
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) { return arg_max_min(x, dim, keepdim, false, "argmin"); }

// ---- prod, any, all ----------------------------------------------------------------------------------------------

namespace {

// The products of the rows of r (rows, n >= 1) -> (rows, 1): halves the row with one elementwise product per level
// (the odd element carried), so autograd's chain rule gives d prod / d x_i as the product of the other elements —
// exact where some are zero, where prod / x_i would divide by zero.
Tensor prod_rows(Tensor r) {
  while (r.size(1) > 1) {
    const int64_t n = r.size(1), h = n / 2;
    Tensor p = mul(r.narrow(1, 0, h), r.narrow(1, h, h));
    r = n % 2 ? cat({p, r.narrow(1, 2 * h, 1)}, 1) : p;
  }
  return r;
}

Tensor as_product_dtype(const Tensor& x) { return is_floating(x.dtype()) ? x : x.to(kInt64); }

// The rows' truth, as int64 0 / 1: x != 0 (NaN is true).
Tensor nonzero_int(const Tensor& x) { return (x.dtype() == kBool ? x : ne(x, 0.0)).to(kInt64); }

}  // namespace

Tensor prod(const Tensor& x_in, int64_t dim, bool keepdim) {
  check_defined("prod", x_in);
  const Tensor x0 = as_product_dtype(x_in);
  const Tensor x = x0.dim() == 0 ? x0.reshape({1}) : x0;  // a 0-d tensor is its own product along dim 0 / -1
  const int d = wrap_dim(dim, x.dim(), "prod");
  const int64_t n = x.size(d);
  const Tensor moved = x.transpose(d, x.dim() - 1);  // (..., n): the reduced dim last
  Shape kept = moved.shape();
  kept[kept.size() - 1] = 1;
  Tensor r = n == 0 ? ones(kept, {.dtype = x.dtype(), .device = x.device()})
                    : prod_rows(moved.contiguous().reshape({-1, n})).reshape(kept);
  r = r.transpose(d, x.dim() - 1);  // (.., 1 at d, ..)
  if (x0.dim() == 0) return r.reshape({});
  return keepdim ? r.contiguous() : r.squeeze(d);
}

Tensor prod(const Tensor& x) {
  check_defined("prod", x);
  if (x.numel() == 0) return ones({}, {.dtype = as_product_dtype(x).dtype(), .device = x.device()});
  return prod(x.reshape({-1}), 0);
}

Tensor any(const Tensor& x, int64_t dim, bool keepdim) {
  check_defined("any", x);
  if (x.dim() > 0) wrap_dim(dim, x.dim(), "any");  // the error names any, not the sum below
  NoGradGuard ng;
  return gt(sum(nonzero_int(x), {dim}, keepdim), 0.0);
}
Tensor all(const Tensor& x, int64_t dim, bool keepdim) {
  check_defined("all", x);
  NoGradGuard ng;
  const int64_t n = x.dim() == 0 ? 1 : x.size(wrap_dim(dim, x.dim(), "all"));
  return eq(sum(nonzero_int(x), {dim}, keepdim), static_cast<double>(n));  // every element non-zero
}
Tensor any(const Tensor& x) {
  check_defined("any", x);
  NoGradGuard ng;
  return gt(sum(nonzero_int(x)), 0.0);
}
Tensor all(const Tensor& x) {
  check_defined("all", x);
  NoGradGuard ng;
  return eq(sum(nonzero_int(x)), static_cast<double>(x.numel()));
}

// ---- logsumexp ---------------------------------------------------------------------------------------------------

Tensor logsumexp(const Tensor& x_in, const Dims& dims, bool keepdim) {
  check_defined("logsumexp", x_in);
  Dims axes = reduction_axes(dims, x_in.dim(), "logsumexp");
  Tensor x = as_floating(x_in);
  Shape kept = reduced_shape(x.shape(), axes, true);
  Tensor rows = as_rows(x, axes);  // (rows, n)
  Tensor kept_out = Tensor::empty(kept, x.options());
  Tensor flat = kept_out.view({rows.size(0)});
  ASC_KERNEL(x.device(), "logsumexp", logsumexp_lastdim, rows, flat);
  Tensor out = keepdim ? kept_out : kept_out.view(reduced_shape(x.shape(), axes, false));
  if (autograd::needs_grad(x)) {
    autograd::record("logsumexp", {x}, {out},
                     [kept, axes, xs = autograd::SavedTensor(x, "logsumexp"),
                      ys = autograd::SavedTensor(kept_out, "logsumexp")](const TensorList& g) -> TensorList {
                       // d lse / dx = softmax(x) = exp(x - lse). Rows with lse = -inf (all -inf) get 0: the
                       // shift is replaced by 0 there, so exp(-inf - 0) = 0 instead of exp(NaN). Rows with
                       // lse = +inf split the gradient equally among their +inf entries.
                       const Tensor& x = xs.get();
                       const Tensor& y = ys.get();  // (kept)
                       Tensor gk = g[0].reshape(kept);
                       constexpr double kInf = std::numeric_limits<double>::infinity();
                       if (!has_non_finite(y)) return {exp(x - y) * gk};
                       Tensor finite = logical_and(ne(y, kInf), ne(y, -kInf));  // (kept) bool
                       Tensor shift = where(finite, y, 0.0);
                       Tensor sm = where(finite, exp(x - shift), 0.0);  // (in_shape)
                       Tensor pos_inf = eq(y, kInf);                    // (kept) bool
                       Tensor is_pinf = eq(x, kInf).to(x.dtype());      // (in_shape)
                       Tensor share = is_pinf / sum(is_pinf, axes, /*keepdim=*/true);
                       sm = where(pos_inf, share, sm);
                       return {sm * gk};
                     });
  }
  return out;
}

// ---- norm --------------------------------------------------------------------------------------------------------

Tensor norm(const Tensor& x_in, double p, const Dims& dims, bool keepdim) {
  check_defined("norm", x_in);
  ASC_CHECK(p >= 1.0, "norm: p must be >= 1 (or inf), got p = {}", p);
  Dims axes = reduction_axes(dims, x_in.dim(), "norm");
  Tensor x = as_floating(x_in);
  if (std::isinf(p)) return amax(abs(x), dims, keepdim);  // ties split, abs' gradient is 0 at 0
  if (p == 1.0) return sum(abs(x), dims, keepdim);
  // General p (including 2): ||x||_p = (sum |x|^p)^(1/p), with a hand-written backward so that the gradient
  // at x = 0 is 0 (the composite would give 0 * inf = NaN there).
  Tensor kept_out;
  {
    NoGradGuard ng;
    Tensor s = p == 2.0 ? sum(x * x, dims, /*keepdim=*/true) : sum(pow(abs(x), p), dims, /*keepdim=*/true);
    kept_out = p == 2.0 ? sqrt(s) : pow(s, 1.0 / p);
  }
  Shape kept = kept_out.shape();
  Tensor out = keepdim ? kept_out : kept_out.view(reduced_shape(x.shape(), axes, false));
  if (autograd::needs_grad(x)) {
    autograd::record("norm", {x}, {out},
                     [kept, p, xs = autograd::SavedTensor(x, "norm"),
                      ys = autograd::SavedTensor(kept_out, "norm")](const TensorList& g) -> TensorList {
                       // d||x||_p / dx_i = sign(x_i) |x_i|^(p-1) / ||x||^(p-1); 0 where ||x|| = 0.
                       const Tensor& x = xs.get();
                       const Tensor& y = ys.get();  // (kept)
                       Tensor gk = g[0].reshape(kept);
                       Tensor scale = where(eq(y, 0.0), 0.0, p == 2.0 ? gk / y : gk / pow(y, p - 1.0));
                       Tensor dx = p == 2.0 ? x : where(eq(x, 0.0), 0.0, x * pow(abs(x), p - 2.0));
                       return {dx * scale};
                     });
  }
  return out;
}

}  // namespace asc
