// Tensor's view methods (core/tensor.h): view, reshape, flatten, permute, transpose, t, slice, narrow, select,
// squeeze, unsqueeze, expand. A view shares its base's storage (core::make_view checks it stays inside) and records
// a backward that maps the view's gradient back to the base's shape.
#include <functional>
#include <optional>

#include "autograd/node.h"
#include "core/format.h"
#include "core/tensor.h"
#include "ops/elementwise.h"  // sum_to

namespace asc {

// ---- views ------------------------------------------------------------------------------------------------------

namespace {

// A view op: `v` shares x's storage; backward maps the view's gradient back to x's shape.
Tensor record_view(const char* name, const Tensor& x, Tensor v, std::function<Tensor(const Tensor&)> back) {
  if (autograd::needs_grad(x))
    autograd::record(name, {x}, {v},
                     [back = std::move(back)](const TensorList& g) -> TensorList { return {back(g[0])}; });
  return v;
}

Shape infer_shape(const Shape& shape, int64_t numel, const char* op) {
  Shape out = shape;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      ASC_CHECK(infer < 0, "{}: only one dimension can be -1 in {}", op, shape);
      infer = i;
    } else {
      ASC_CHECK(out[i] >= 0, "{}: invalid dimension {} in {}", op, out[i], shape);
      known = checked_mul(known, out[i], op);
    }
  }
  if (infer >= 0) {
    ASC_CHECK(known != 0 && numel % known == 0, "{}: shape {} is invalid for a tensor of {} elements", op, shape,
              numel);
    out[infer] = numel / known;
  }
  ASC_CHECK(checked_numel(out, op) == numel, "{}: shape {} is invalid for a tensor of {} elements", op, shape, numel);
  return out;
}

// Strides for viewing (old_shape, old_strides) as new_shape without copying, if possible (dims are grouped into
// chunks that are each contiguous in memory).
std::optional<Strides> view_strides(const Shape& os, const Strides& ost, const Shape& ns) {
  Strides out = Dims::filled(ns.size(), 0);
  if (numel_of(os) == 0 || os.empty()) return contiguous_strides(ns);
  int view_d = ns.size() - 1;
  int64_t chunk_base_stride = ost.size() ? ost.back() : 1;
  int64_t tensor_numel = 1, view_numel = 1;
  for (int tensor_d = os.size() - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= os[tensor_d];
    if (tensor_d == 0 || (os[tensor_d - 1] != 1 && ost[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || ns[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= ns[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (tensor_d > 0) {
        chunk_base_stride = ost[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  Shape ns = infer_shape(shape, numel(), "view");
  auto st = view_strides(this->shape(), strides(), ns);
  ASC_CHECK(st.has_value(), "view: cannot view a tensor of shape {} with strides {} as {}; use reshape()",
            this->shape(), strides(), ns);
  Shape old = this->shape();
  return record_view("view", *this, make_view(*this, ns, *st, offset()),
                     [old](const Tensor& g) { return g.reshape(old); });
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape ns = infer_shape(shape, numel(), "reshape");
  if (view_strides(this->shape(), strides(), ns)) return view(ns);
  return contiguous().view(ns);
}

Tensor Tensor::flatten(int64_t start, int64_t end) const {
  if (dim() == 0) return reshape({1});
  int s = wrap_dim(start, dim(), "flatten"), e = wrap_dim(end, dim(), "flatten");
  ASC_CHECK(s <= e, "flatten: start dim {} is after end dim {}", start, end);
  Shape ns;
  for (int i = 0; i < s; ++i) ns.push_back(size(i));
  int64_t m = 1;
  for (int i = s; i <= e; ++i) m *= size(i);
  ns.push_back(m);
  for (int i = e + 1; i < dim(); ++i) ns.push_back(size(i));
  return reshape(ns);
}

Tensor Tensor::permute(const Dims& order) const {
  ASC_CHECK(order.size() == dim(), "permute: order {} has {} entries for a tensor of {} dimensions", order,
            order.size(), dim());
  Shape ns;
  Strides st;
  Dims inverse = Dims::filled(dim(), -1);
  for (int i = 0; i < dim(); ++i) {
    int d = wrap_dim(order[i], dim(), "permute");
    ASC_CHECK(inverse[d] == -1, "permute: dimension {} repeated in {}", d, order);
    inverse[d] = i;
    ns.push_back(size(d));
    st.push_back(stride(d));
  }
  return record_view("permute", *this, make_view(*this, ns, st, offset()),
                     [inverse](const Tensor& g) { return g.permute(inverse); });
}

Tensor Tensor::transpose(int64_t a, int64_t b) const {
  Dims order;
  for (int i = 0; i < dim(); ++i) order.push_back(i);
  int x = wrap_dim(a, dim(), "transpose"), y = wrap_dim(b, dim(), "transpose");
  std::swap(order[x], order[y]);
  return permute(order);
}

Tensor Tensor::t() const {
  ASC_CHECK(dim() >= 2, "t: expected at least 2 dimensions, got shape {}", shape());
  return transpose(-2, -1);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  int dd = wrap_dim(d, dim(), "slice");
  ASC_CHECK(step > 0, "slice: step must be positive, got {}", step);
  int64_t n = size(dd);
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape ns = shape();
  Strides st = strides();
  ns[dd] = end == start ? 0 : (end - start - 1) / step + 1;  // not (end - start + step - 1) / step: overflows
  st[dd] = ns[dd] > 1 ? checked_mul(st[dd], step, "slice", "stride") : st[dd];
  const int64_t off = ns[dd] > 0
                          ? checked_add(offset(), checked_mul(start, stride(dd), "slice", "offset"), "slice", "offset")
                          : offset();
  Shape old = shape();
  return record_view("slice", *this, make_view(*this, ns, st, off), [old, dd, start, end, step](const Tensor& g) {
    Tensor full = zeros(old, g.options());
    full.slice(dd, start, end, step).copy_(g);
    return full;
  });
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  int dd = wrap_dim(d, dim(), "narrow");
  ASC_CHECK(
      start >= 0 && length >= 0 && length <= size(dd) && start <= size(dd) - length,  // no start + length: overflows
      "narrow: start {} and length {} are out of bounds for dimension {} of size {} (shape {})", start, length, dd,
      size(dd), shape());
  return slice(dd, start, start + length);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  int dd = wrap_dim(d, dim(), "select");
  int64_t n = size(dd);
  ASC_CHECK(index >= -n && index < n, "select: index {} is out of range for dimension {} of size {} (shape {})", index,
            dd, n, shape());
  if (index < 0) index += n;
  return narrow(dd, index, 1).squeeze(dd);
}

Tensor Tensor::squeeze(std::optional<int64_t> d) const {
  Shape ns;
  Strides st;
  if (d) {
    int dd = wrap_dim(*d, dim(), "squeeze");
    ns = shape();
    st = strides();
    if (dim() > 0 && ns[dd] == 1) {
      ns.erase(dd);
      st.erase(dd);
    }
  } else {
    for (int i = 0; i < dim(); ++i)
      if (size(i) != 1) {
        ns.push_back(size(i));
        st.push_back(stride(i));
      }
  }
  Shape old = shape();
  return record_view("squeeze", *this, make_view(*this, ns, st, offset()),
                     [old](const Tensor& g) { return g.reshape(old); });
}

Tensor Tensor::unsqueeze(int64_t d) const {
  int dd = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape ns = shape();
  Strides st = strides();
  int64_t s = dd < dim() ? stride(dd) * size(dd) : 1;
  ns.insert(dd, 1);
  st.insert(dd, s);
  Shape old = shape();
  return record_view("unsqueeze", *this, make_view(*this, ns, st, offset()),
                     [old](const Tensor& g) { return g.reshape(old); });
}

Tensor Tensor::expand(const Shape& shape_in) const {
  ASC_CHECK(shape_in.size() >= dim(), "expand: target shape {} has fewer dimensions than the tensor's {}", shape_in,
            shape());
  Shape ns = shape_in;
  int lead = ns.size() - dim();
  for (int i = 0; i < ns.size(); ++i) {
    if (i >= lead && ns[i] == -1) ns[i] = size(i - lead);
    ASC_CHECK(ns[i] >= 0, "expand: invalid target shape {}", shape_in);
    if (i >= lead)
      ASC_CHECK(size(i - lead) == ns[i] || size(i - lead) == 1,
                "expand: the size of dimension {} ({}) must match the target {} or be 1 (shape {})", i - lead,
                size(i - lead), ns[i], shape());
  }
  checked_numel(ns, "expand");
  Strides st = broadcast_strides(shape(), strides(), ns);
  Shape old = shape();
  return record_view("expand", *this, make_view(*this, ns, st, offset()),
                     [old](const Tensor& g) { return sum_to(g, old); });
}

}  // namespace asc
