// Tensor's construction, metadata and host access (core/tensor.h). A Tensor's methods that are ops — views, copies,
// conversions, in-place updates, creation — live with the other ops in ops/ (ops/views.cpp, ops/copy.cpp,
// ops/creation.cpp, ops/tensor_methods.cpp): core dispatches no kernel and records no autograd node.
#include "core/tensor.h"

#include "core/format.h"

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

bool Tensor::is_pinned() const {
  return defined() && device().is_cpu() && pinned_allocator() && impl_->storage->allocator() == pinned_allocator();
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

}  // namespace asc
