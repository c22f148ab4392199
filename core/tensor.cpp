#include "core/tensor.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>

#include "autograd/node.h"
#include "core/format.h"
#include "core/generator.h"
#include "core/overlap.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

namespace asc {

// ---- construction and metadata ----------------------------------------------------------------------------------

void Tensor::throw_undefined(const char* method) {
  ASC_THROW("Tensor::{}: the tensor is undefined (default-constructed, or an absent gradient); check defined() first",
            method);
}

Tensor Tensor::empty(const Shape& shape, TensorOptions opts) {
  const int64_t nbytes = checked_nbytes(checked_numel(shape, "empty"), dtype_size(opts.dtype), "empty");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(nbytes), opts.device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = opts.dtype;
  Tensor t(std::move(impl));
  if (opts.requires_grad) t.set_requires_grad(true);
  return t;
}

// Unlike ops' dim arguments, which accept 0 / -1 for a 0-d tensor (wrap_dim), a 0-d tensor has no size to read.
int64_t Tensor::size(int64_t d) const {
  ASC_CHECK(dim() > 0, "size: dimension {} of a 0-d tensor (it has none)", d);
  return shape()[wrap_dim(d, dim(), "size")];
}
int64_t Tensor::stride(int64_t d) const {
  ASC_CHECK(dim() > 0, "stride: dimension {} of a 0-d tensor (it has none)", d);
  return strides()[wrap_dim(d, dim(), "stride")];
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // no element to misplace (and a size-0 dim would zero `expected` below)
  int64_t expected = 1;
  for (int i = dim() - 1; i >= 0; --i) {
    if (impl_->shape[i] == 1) continue;
    if (impl_->strides[i] != expected) return false;
    expected *= impl_->shape[i];
  }
  return true;
}

Tensor make_view(const Tensor& base, const Shape& shape, const Strides& strides, int64_t offset) {
  // Every view is checked against its storage: whatever arithmetic produced (shape, strides, offset), a view that
  // could address an element outside the storage is refused here rather than read or written later.
  ASC_CHECK(base.defined(), "view: undefined tensor");
  ASC_CHECK(shape.size() == strides.size(), "view: shape {} and strides {} differ in length", shape, strides);
  // An empty view addresses nothing: its offset is set to 0, so no later offset * element_size can overflow.
  if (checked_numel(shape, "view") == 0) {
    offset = 0;
  } else {
    int64_t lo = offset, hi = offset;
    for (int i = 0; i < shape.size(); ++i) {
      const int64_t span = checked_mul(shape[i] - 1, strides[i], "view", "offset");
      (span < 0 ? lo : hi) = checked_add(span < 0 ? lo : hi, span, "view", "offset");
    }
    const int64_t capacity = static_cast<int64_t>(base.impl()->storage->nbytes() / base.element_size());
    ASC_CHECK(lo >= 0 && hi < capacity,
              "view: shape {} with strides {} at offset {} reaches elements [{}, {}] outside the storage of {} "
              "elements",
              shape, strides, offset, lo, hi, capacity);
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.impl()->storage;
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

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

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
  Tensor out = Tensor::empty(shape(), options());
  ASC_KERNEL(device(), "clone", copy, *this, out);
  if (autograd::needs_grad(*this))
    autograd::record("clone", {*this}, {out}, [](const TensorList& g) -> TensorList { return {g[0]}; });
  return out;
}

Tensor Tensor::to(DType dt) const {
  if (dt == dtype()) return *this;
  Tensor out = Tensor::empty(shape(), {dt, device()});
  ASC_KERNEL(device(), "to", copy, *this, out);
  if (is_floating(dt) && autograd::needs_grad(*this)) {
    DType src = dtype();
    autograd::record("to(dtype)", {*this}, {out}, [src](const TensorList& g) -> TensorList { return {g[0].to(src)}; });
  }
  return out;
}

Tensor Tensor::to(Device dev, bool non_blocking) const {
  if (dev == device()) return *this;
  Tensor src = contiguous();
  Tensor out = Tensor::empty(shape(), {dtype(), dev});
  // Host <-> device transfers go through the destination's (or source's) allocator copy; the CUDA backend's
  // allocator implements cross-device copies, and asynchronous ones from pinned memory.
  Allocator* a = allocator_for(dev.is_cpu() ? device() : dev);
  const size_t nbytes = static_cast<size_t>(numel()) * element_size();
  if (non_blocking && dev.is_cuda() && src.is_pinned()) {
    a->copy_async(out.raw_data(), src.raw_data(), nbytes);
  } else {
    a->copy(out.raw_data(), src.raw_data(), nbytes);
  }
  if (autograd::needs_grad(*this)) {
    Device back = device();
    autograd::record("to(device)", {*this}, {out},
                     [back](const TensorList& g) -> TensorList { return {g[0].to(back)}; });
  }
  return out;
}

bool Tensor::is_pinned() const {
  return defined() && device().is_cpu() && pinned_allocator() && impl_->storage->allocator() == pinned_allocator();
}

Tensor Tensor::pin_memory() const {
  ASC_CHECK(defined(), "pin_memory: undefined tensor");
  ASC_CHECK(device().is_cpu(), "pin_memory: only CPU tensors can be pinned, got a tensor {} on {}", shape(), device());
  if (is_pinned()) return *this;
  Allocator* pinned = pinned_allocator();
  ASC_CHECK(pinned != nullptr, "pin_memory: pinned host memory needs a CUDA device (none available; tensor {})",
            shape());
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(numel()) * element_size(), Device::cpu(), pinned);
  impl->shape = shape();
  impl->strides = contiguous_strides(shape());
  impl->dtype = dtype();
  Tensor out(std::move(impl));
  out.copy_(detach());
  return out;
}

void Tensor::set_data(const Tensor& src) {
  ASC_CHECK(defined() && src.defined(), "set_data: undefined tensor");
  ASC_CHECK(is_leaf(), "set_data: only leaf tensors can be re-pointed (shape {})", shape());
  ASC_CHECK(!impl_->requires_grad || is_floating(src.dtype()),
            "set_data: a tensor that requires grad needs a floating dtype, got {}", src.dtype());
  impl_->storage = src.impl_->storage;
  impl_->shape = src.impl_->shape;
  impl_->strides = src.impl_->strides;
  impl_->offset = src.impl_->offset;
  impl_->dtype = src.impl_->dtype;
  impl_->grad.reset();  // a gradient of the old data would have the wrong device/dtype; hooks stay
}

// ---- in-place ---------------------------------------------------------------------------------------------------

namespace {
void check_inplace(const Tensor& t, const char* op) {
  ASC_CHECK(t.defined(), "{}: undefined tensor", op);
  ASC_CHECK(!(GradMode::is_enabled() && t.requires_grad()),
            "{}: in-place modification of a tensor that requires grad (shape {}) is not supported while grad mode is "
            "on; use the out-of-place op, or NoGradGuard for parameter updates",
            op, t.shape());
}
}  // namespace

// Aliasing: an in-place op whose input shares memory with its destination (x.add_(x.t()), a.copy_(a shifted view))
// gives the result of the non-aliased call — add_ and mul_ compute out of place, copy_ reads an overlapping source
// from a private copy. A destination that reaches one memory location through several of its elements (expand) has
// no such result and is refused, as in PyTorch; fill_ is allowed there (every element gets the same value).
Tensor& Tensor::copy_(const Tensor& src) {
  check_inplace(*this, "copy_");
  check_same_device("copy_", {this, &src});
  ASC_CHECK(broadcast_shapes(src.shape(), shape(), "copy_") == shape(),
            "copy_: source of shape {} cannot be broadcast to destination shape {}", src.shape(), shape());
  check_no_internal_overlap(*this, "copy_");
  // If src overlaps this tensor's memory, read from a private copy.
  Tensor s = shares_storage(src) ? src.detach().clone() : src;
  ASC_KERNEL(device(), "copy_", copy, s, *this);
  impl_->storage->bump_version();
  return *this;
}

Tensor& Tensor::fill_(double value) {
  check_inplace(*this, "fill_");
  ASC_KERNEL(device(), "fill_", fill, *this, value);
  impl_->storage->bump_version();
  return *this;
}

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  check_inplace(*this, "add_");
  check_no_internal_overlap(*this, "add_");
  Tensor r = alpha == 1.0 ? asc::add(*this, other) : asc::add(*this, asc::mul(other, alpha));
  ASC_CHECK(r.shape() == shape(), "add_: result shape {} differs from the destination shape {}", r.shape(), shape());
  return copy_(r);
}

Tensor& Tensor::mul_(double value) {
  check_inplace(*this, "mul_");
  check_no_internal_overlap(*this, "mul_");
  return copy_(asc::mul(*this, value));
}

// ---- host access ------------------------------------------------------------------------------------------------

template <class T>
std::vector<T> Tensor::to_vector() const {
  // bfloat16 / float16 (CUDA dtypes) are read through float32, which holds each of their values exactly.
  Tensor c = (is_reduced_float(dtype()) ? to(kFloat32).cpu() : cpu()).contiguous();
  std::vector<T> out(static_cast<size_t>(numel()));
  ASC_DISPATCH_ALL(c.dtype(), "to_vector", [&] {
    const scalar_t* p = c.data_ptr<scalar_t>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(p[i]);
  });
  return out;
}

template <class T>
T Tensor::item() const {
  ASC_CHECK(numel() == 1, "item: expected a one-element tensor, got shape {}", shape());
  return to_vector<T>()[0];
}

template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<bool> Tensor::to_vector<bool>() const;
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int64_t Tensor::item<int64_t>() const;
template bool Tensor::item<bool>() const;

std::string to_string(const Tensor& t, int max_per_dim) {
  if (!t.defined()) return "tensor(undefined)";
  std::vector<double> v = t.to_vector<double>();
  std::string s = "tensor(";
  Strides st = contiguous_strides(t.shape());
  const bool fl = is_floating(t.dtype());
  std::function<void(int, int64_t)> rec = [&](int d, int64_t base) {
    if (d == t.dim()) {
      double x = v[static_cast<size_t>(base)];
      if (t.dtype() == kBool)
        s += x != 0 ? "true" : "false";
      else if (fl)
        s += fmt::format("{:.4f}", x);
      else
        s += fmt::format("{}", static_cast<int64_t>(x));
      return;
    }
    s += "[";
    int64_t n = t.size(d);
    for (int64_t i = 0; i < n; ++i) {
      if (n > max_per_dim && i == max_per_dim / 2) {
        s += "..., ";
        i = n - max_per_dim / 2;
      }
      rec(d + 1, base + i * st[d]);
      if (i + 1 < n) s += d + 1 == t.dim() ? ", " : ",\n" + std::string(static_cast<size_t>(d + 8), ' ');
    }
    s += "]";
  };
  rec(0, 0);
  s += fmt::format(", shape={}, dtype={}", t.shape(), t.dtype());
  if (!t.device().is_cpu()) s += fmt::format(", device={}", t.device());
  if (t.grad_fn())
    s += fmt::format(", grad_fn={}", t.grad_fn()->name());
  else if (t.requires_grad())
    s += ", requires_grad=true";
  return s + ")";
}

// ---- creation ---------------------------------------------------------------------------------------------------

Tensor empty(const Shape& shape, TensorOptions opts) { return Tensor::empty(shape, opts); }

Tensor full(const Shape& shape, double value, TensorOptions opts) {
  bool rg = opts.requires_grad;
  opts.requires_grad = false;
  Tensor t = Tensor::empty(shape, opts);
  ASC_KERNEL(opts.device, "full", fill, t, value);
  if (rg) t.set_requires_grad(true);
  return t;
}
Tensor zeros(const Shape& shape, TensorOptions opts) { return full(shape, 0.0, opts); }
Tensor ones(const Shape& shape, TensorOptions opts) { return full(shape, 1.0, opts); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.options()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.options()); }
Tensor full_like(const Tensor& t, double value) { return full(t.shape(), value, t.options()); }
Tensor scalar_tensor(double value, TensorOptions opts) { return full({}, value, opts); }

namespace {
// A tensor of `shape` whose elements fill(p) writes on the host (p: the element type's pointer, row-major), then
// moved to opts.device: how creation ops with computed contents (arange, eye, tensor(values)) are made.
template <class Fill>
Tensor host_filled(const char* op, const Shape& shape, TensorOptions opts, Fill fill) {
  Tensor host = Tensor::empty(shape, {opts.dtype, Device::cpu()});
  ASC_DISPATCH_ALL(opts.dtype, op, [&] { fill(host.data_ptr<scalar_t>()); });
  Tensor t = host.to(opts.device);
  if (opts.requires_grad) t.set_requires_grad(true);
  return t;
}
}  // namespace

Tensor arange(double start, double end, double step, TensorOptions opts) {
  ASC_CHECK(step != 0 && std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
            "arange: invalid range [{}, {}) step {}", start, end, step);
  const double count = std::ceil((end - start) / step);
  // 2^53: beyond it consecutive values are no longer distinct doubles (and the cast to int64 below would overflow).
  ASC_CHECK(std::isfinite(count) && count <= 9007199254740992.0,
            "arange: range [{}, {}) step {} has {} elements, more than 2^53", start, end, step, count);
  const int64_t n = count > 0 ? static_cast<int64_t>(count) : 0;
  return host_filled("arange", {n}, opts, [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(start + static_cast<double>(i) * step);
  });
}
Tensor arange(int64_t end, TensorOptions opts) { return arange(0.0, static_cast<double>(end), 1.0, opts); }

Tensor eye(int64_t n, TensorOptions opts) {
  ASC_CHECK(n >= 0, "eye: negative size {}", n);
  checked_nbytes(checked_numel({n, n}, "eye"), dtype_size(opts.dtype), "eye");  // n * n, named as eye's
  return host_filled("eye", {n, n}, opts, [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    std::fill(p, p + n * n, T(0));
    for (int64_t i = 0; i < n; ++i) p[i * n + i] = T(1);
  });
}

namespace {
template <class Fill>
Tensor random_tensor(const Shape& shape, TensorOptions opts, Generator* gen, uint64_t per_block, Fill fill) {
  bool rg = opts.requires_grad;
  opts.requires_grad = false;
  Tensor t = Tensor::empty(shape, opts);
  Generator& g = gen ? *gen : default_generator();
  uint64_t n = static_cast<uint64_t>(t.numel());
  const Generator::State s = g.draw((n + per_block - 1) / per_block);
  fill(t, s.seed, s.offset);
  if (rg) t.set_requires_grad(true);
  return t;
}
}  // namespace

Tensor rand(const Shape& shape, TensorOptions opts, Generator* gen) {
  ASC_CHECK(is_floating(opts.dtype), "rand: expected a floating-point dtype, got {}", opts.dtype);
  uint64_t per = opts.dtype == kFloat64 ? 2 : 4;
  return random_tensor(shape, opts, gen, per, [&](Tensor& t, uint64_t seed, uint64_t off) {
    ASC_KERNEL(t.device(), "rand", uniform, t, seed, off, 0.0, 1.0);
  });
}

Tensor randn(const Shape& shape, TensorOptions opts, Generator* gen) {
  ASC_CHECK(is_floating(opts.dtype), "randn: expected a floating-point dtype, got {}", opts.dtype);
  return random_tensor(shape, opts, gen, 2, [&](Tensor& t, uint64_t seed, uint64_t off) {
    ASC_KERNEL(t.device(), "randn", normal, t, seed, off, 0.0, 1.0);
  });
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts, Generator* gen) {
  ASC_CHECK(low < high, "randint: empty range [{}, {})", low, high);
  ASC_CHECK(opts.dtype == kInt64, "randint: dtype must be int64, got {}", opts.dtype);
  return random_tensor(shape, opts, gen, 2, [&](Tensor& t, uint64_t seed, uint64_t off) {
    ASC_KERNEL(t.device(), "randint", randint, t, seed, off, low, high);
  });
}

namespace {
template <class T>
Tensor from_host(const T* data, size_t n, const Shape& shape, TensorOptions opts) {
  const int64_t numel = checked_numel(shape, "tensor");  // numel_of would overflow for a hostile shape
  ASC_CHECK(static_cast<int64_t>(n) == numel, "tensor: {} values given for shape {} ({} elements)", n, shape, numel);
  return host_filled("tensor", shape, opts, [&](auto* p) {
    using E = std::remove_pointer_t<decltype(p)>;
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<E>(data[i]);
  });
}
}  // namespace

Tensor tensor(std::span<const double> values, const Shape& shape, TensorOptions opts) {
  return from_host(values.data(), values.size(), shape, opts);
}
Tensor tensor(std::initializer_list<double> values, const Shape& shape, TensorOptions opts) {
  return from_host(values.begin(), values.size(), shape, opts);
}
Tensor tensor(std::initializer_list<double> values, TensorOptions opts) {
  return from_host(values.begin(), values.size(), {static_cast<int64_t>(values.size())}, opts);
}
Tensor tensor(const std::vector<float>& values, const Shape& shape, TensorOptions opts) {
  return from_host(values.data(), values.size(), shape, opts);
}
Tensor tensor(const std::vector<double>& values, const Shape& shape, TensorOptions opts) {
  return from_host(values.data(), values.size(), shape, opts);
}
Tensor tensor(const std::vector<int64_t>& values, const Shape& shape, TensorOptions opts) {
  return from_host(values.data(), values.size(), shape, opts);
}

}  // namespace asc
