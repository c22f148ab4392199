// sum (the reduction every other reduction and every broadcast backward builds on) and the axis helpers.
#include "autograd/node.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

namespace asc {

Dims reduction_axes(const Dims& dims, int ndim, const char* op) {
  Dims axes;
  if (dims.empty()) {
    for (int i = 0; i < ndim; ++i) axes.push_back(i);
    return axes;
  }
  bool seen[kMaxDims] = {};
  for (auto d : dims) {
    int w = wrap_dim(d, ndim, op);
    if (ndim == 0) continue;  // a 0-d tensor: reducing "dim 0/-1" is the identity
    ASC_CHECK(!seen[w], "{}: dimension {} appears more than once in {}", op, w, dims);
    seen[w] = true;
  }
  for (int i = 0; i < ndim; ++i)
    if (seen[i]) axes.push_back(i);
  return axes;
}

Shape reduced_shape(const Shape& shape, const Dims& axes, bool keepdim) {
  Shape out;
  int a = 0;
  for (int i = 0; i < shape.size(); ++i) {
    bool reduced = a < axes.size() && axes[a] == i;
    if (reduced) ++a;
    if (!reduced)
      out.push_back(shape[i]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

Tensor sum(const Tensor& x_in, const Dims& dims, bool keepdim) {
  check_defined("sum", x_in);
  Tensor x = x_in.dtype() == kBool ? x_in.to(kInt64) : x_in;
  Dims axes = reduction_axes(dims, x.dim(), "sum");
  Shape kept = reduced_shape(x.shape(), axes, true);
  Tensor out = Tensor::empty(kept, x.options());
  ASC_KERNEL(x.device(), "sum", sum, x, out);
  if (!keepdim) out = out.view(reduced_shape(x.shape(), axes, false));
  if (autograd::needs_grad(x)) {
    Shape in_shape = x.shape();
    autograd::record("sum", {x}, {out}, [in_shape, kept](const TensorList& g) -> TensorList {
      return {g[0].reshape(kept).expand(in_shape).contiguous()};
    });
  }
  return out;
}

Tensor mean(const Tensor& x, const Dims& dims, bool keepdim) {
  check_defined("mean", x);
  Dims axes = reduction_axes(dims, x.dim(), "mean");
  int64_t n = 1;
  for (auto a : axes) n *= x.size(a);
  ASC_CHECK(n > 0, "mean: reducing over an empty dimension (shape {}, dims {})", x.shape(), dims);
  Tensor xf = is_floating(x.dtype()) ? x : x.to(kFloat32);
  return div(sum(xf, dims, keepdim), static_cast<double>(n));
}

}  // namespace asc
