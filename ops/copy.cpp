// Tensor's copying methods (core/tensor.h): contiguous, clone, to (a dtype, a device), pin_memory, and the in-place
// copy_, fill_, add_, mul_. Ops like any other: they allocate, dispatch the copy / fill kernels and record.
#include <cmath>

#include "autograd/node.h"
#include "core/format.h"
#include "core/overlap.h"
#include "core/tensor.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"

namespace asc {

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

Tensor& Tensor::add_(double value) {
  check_inplace(*this, "add_");
  check_no_internal_overlap(*this, "add_");
  ASC_CHECK(is_floating(dtype()) || (dtype() != kBool && std::trunc(value) == value),
            "add_: {} added to a {} tensor (an integer tensor takes whole numbers)", value, dtype());
  // the number as a 0-d tensor of this dtype: an int64 tensor adds exactly (a double scalar would go through float)
  return copy_(asc::add(*this, full({}, value, {.dtype = dtype(), .device = device()})));
}

Tensor& Tensor::mul_(double value) {
  check_inplace(*this, "mul_");
  check_no_internal_overlap(*this, "mul_");
  return copy_(asc::mul(*this, value));
}

}  // namespace asc
