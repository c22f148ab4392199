#pragma once
// Tensor: a reference-counted handle to a TensorImpl (shape, strides, offset, dtype) over a shared Storage.
// Copying a Tensor copies the handle, not the data; views (reshape, permute, narrow, expand, ...) share the
// storage. Every differentiable op records a graph node when one of its inputs requires grad.
//
//   asc::Tensor w = asc::randn({3, 4}, {.requires_grad = true});   // (3, 4) leaf
//   asc::Tensor x = asc::ones({2, 3});                              // (2, 3)
//   asc::Tensor loss = x.matmul(w).relu().sum();                    // ()
//   loss.backward();
//   fmt::print("{}\n", w.grad());                                   // d loss / d w, (3, 4)
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/shape.h"
#include "core/storage.h"

namespace asc {

class Tensor;
class Generator;
namespace autograd {
class Node;
}

using TensorList = std::vector<Tensor>;

// Options for creation ops; designated initializers read well: asc::zeros({2, 3}, {.dtype = kFloat64}).
struct TensorOptions {
  DType dtype = kFloat32;
  Device device = Device::cpu();
  bool requires_grad = false;
};

// The shared state behind a Tensor handle. Op implementers use Tensor's accessors, not this struct.
struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Strides strides;     // in elements
  int64_t offset = 0;  // in elements
  DType dtype = kFloat32;

  // --- autograd metadata ---
  bool requires_grad = false;                        // set on leaves; non-leaves have a grad_fn
  std::shared_ptr<autograd::Node> grad_fn;           // the node that produced this tensor (non-leaf)
  uint32_t output_nr = 0;                            // which output of grad_fn this is
  std::shared_ptr<TensorImpl> grad;                  // accumulated .grad (leaves, or retain_grad)
  std::shared_ptr<autograd::Node> grad_accumulator;  // leaves requiring grad: their AccumulateGrad node
  bool retains_grad = false;
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor (no storage); .defined() is false
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Allocates an uninitialised contiguous tensor.
  static Tensor empty(const Shape& shape, TensorOptions opts = {});

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  // ---- metadata ---------------------------------------------------------------------------------------------
  const Shape& shape() const { return checked("shape").shape; }
  const Strides& strides() const { return checked("strides").strides; }
  int dim() const { return checked("dim").shape.size(); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const { return numel_of(checked("numel").shape); }
  int64_t offset() const { return checked("offset").offset; }
  DType dtype() const { return checked("dtype").dtype; }
  Device device() const { return checked("device").storage->device(); }
  size_t element_size() const { return dtype_size(checked("element_size").dtype); }
  bool is_contiguous() const;
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }
  bool shares_storage(const Tensor& o) const {
    return checked("shares_storage").storage == o.checked("shares_storage").storage;
  }
  TensorOptions options() const { return {dtype(), device(), false}; }

  // Raw element pointer (already offset). CPU kernels only; checks the dtype.
  template <class T>
  T* data_ptr() const {
    ASC_CHECK(dtype() == dtype_of<T>::value, "data_ptr: tensor has dtype {}, requested {}", dtype_name(dtype()),
              dtype_name(dtype_of<T>::value));
    return static_cast<T*>(impl_->storage->data()) + impl_->offset;  // dtype() checked impl_
  }
  void* raw_data() const {
    const TensorImpl& t = checked("raw_data");
    return static_cast<char*>(t.storage->data()) + t.offset * static_cast<int64_t>(dtype_size(t.dtype));
  }
  // The value of a one-element tensor, converted to T (copies from the device if needed).
  template <class T>
  T item() const;
  // All elements in row-major order, converted to T (copies from the device if needed). Handy in tests.
  template <class T>
  std::vector<T> to_vector() const;

  // ---- autograd ---------------------------------------------------------------------------------------------
  bool requires_grad() const { return impl_ && (impl_->requires_grad || impl_->grad_fn); }
  // Marks a leaf as requiring grad (floating dtypes only). Returns *this for chaining.
  Tensor& set_requires_grad(bool r = true);
  bool is_leaf() const { return !checked("is_leaf").grad_fn; }
  const std::shared_ptr<autograd::Node>& grad_fn() const { return checked("grad_fn").grad_fn; }
  Tensor grad() const { return Tensor(checked("grad").grad); }
  void set_grad(const Tensor& g) { checked("set_grad").grad = g.impl_; }
  void zero_grad() { checked("zero_grad").grad.reset(); }
  // Also keep .grad for this non-leaf tensor during backward.
  void retain_grad();
  // Runs backward from this tensor. `grad` defaults to ones for a one-element tensor.
  void backward(const Tensor& grad = {}, bool retain_graph = false) const;
  // A new tensor sharing storage, cut from the graph (requires_grad false).
  Tensor detach() const;
  // Makes this handle (and every other handle to the same impl) refer to `src`'s data, shape and dtype, keeping
  // its own requires_grad flag and dropping its .grad. How Module::to(device/dtype) moves parameters without
  // invalidating the Tensor members layers hold. Leaves only; not recorded by autograd.
  void set_data(const Tensor& src);
  // Calls `hook(grad)` when the gradient w.r.t. this tensor is computed; a defined return value replaces it.
  void register_hook(std::function<Tensor(const Tensor&)> hook);

  // ---- views (share storage; differentiable) ----------------------------------------------------------------
  Tensor reshape(const Shape& shape) const;  // view when possible, else a copy; one dimension may be -1
  Tensor view(const Shape& shape) const;     // always a view; error if the strides do not allow it
  Tensor flatten(int64_t start = 0, int64_t end = -1) const;
  Tensor permute(const Dims& order) const;
  Tensor transpose(int64_t a, int64_t b) const;
  Tensor t() const;  // transpose of the last two dims
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;  // removes `dim`
  Tensor squeeze(std::optional<int64_t> dim = std::nullopt) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor expand(const Shape& shape) const;                      // -1 keeps a size
  Tensor contiguous() const;                                    // *this when already contiguous, else a copy
  Tensor clone() const;                                         // always a copy (differentiable)
  Tensor to(DType dtype) const;                                 // cast (differentiable between float types)
  Tensor to(Device device) const { return to(device, false); }  // copy to another device (differentiable)
  // non_blocking: a host->device copy from a pinned tensor is queued on the destination device's current stream
  // and returns at once (ops on that stream see the data; do not write the source before cuda::synchronize()).
  // Any other copy blocks as without it.
  Tensor to(Device device, bool non_blocking) const;
  Tensor cpu() const { return to(Device::cpu()); }
  // A detached copy of this CPU tensor in page-locked host memory (a caching pool; error without a CUDA device).
  // Host->device copies from it run at full DMA bandwidth and may be non_blocking.
  //   asc::Tensor batch = next_batch().pin_memory();
  //   asc::Tensor x = batch.to(asc::Device::cuda(), /*non_blocking=*/true);  // overlaps with the host's work
  Tensor pin_memory() const;
  bool is_pinned() const;  // CPU tensor whose storage is pinned host memory

  // ---- in-place (not allowed on tensors that require grad; they bump the version counter) --------------------
  Tensor& copy_(const Tensor& src);  // broadcasting copy with dtype conversion
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& add_(double value);  // every element += value (PyTorch's x.add_(number))
  Tensor& mul_(double value);

  // ---- common ops as methods (the free functions in ops/ are the full API) -----------------------------------
  Tensor operator-() const;
  Tensor add(const Tensor& o) const;
  Tensor sub(const Tensor& o) const;
  Tensor mul(const Tensor& o) const;
  Tensor div(const Tensor& o) const;
  Tensor pow(double e) const;
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor abs() const;
  Tensor relu() const;
  Tensor sigmoid() const;
  Tensor tanh() const;
  Tensor sum() const;
  Tensor sum(const Dims& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const Dims& dims, bool keepdim = false) const;
  Tensor matmul(const Tensor& o) const;

 private:
  // The impl, or asc::Error naming `method` for an undefined (default-constructed) tensor: every method checks,
  // as the free functions do, instead of dereferencing null.
  TensorImpl& checked(const char* method) const {
    if (!impl_) [[unlikely]]
      throw_undefined(method);
    return *impl_;
  }
  [[noreturn]] static void throw_undefined(const char* method);

  std::shared_ptr<TensorImpl> impl_;
};

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);

// A tensor viewing `base`'s storage with the given geometry (no autograd; used by view ops and kernels).
Tensor make_view(const Tensor& base, const Shape& shape, const Strides& strides, int64_t offset);

// ---- creation ops -----------------------------------------------------------------------------------------------
Tensor empty(const Shape& shape, TensorOptions opts = {});
Tensor zeros(const Shape& shape, TensorOptions opts = {});
Tensor ones(const Shape& shape, TensorOptions opts = {});
Tensor full(const Shape& shape, double value, TensorOptions opts = {});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
Tensor scalar_tensor(double value, TensorOptions opts = {});
// [start, end) with `step`; dtype defaults to int64 when not given.
Tensor arange(double start, double end, double step = 1.0, TensorOptions opts = {.dtype = kInt64});
Tensor arange(int64_t end, TensorOptions opts = {.dtype = kInt64});
Tensor eye(int64_t n, TensorOptions opts = {});
Tensor eye(int64_t n, int64_t m, TensorOptions opts = {});  // (n, m): ones where i == j
// Random tensors from `gen` (the default generator when null); see core/generator.h.
Tensor rand(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);   // U[0, 1)
Tensor randn(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);  // N(0, 1)
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts = {.dtype = kInt64},
               Generator* gen = nullptr);  // integers in [low, high)
// rand / randn of t's shape, dtype and device (t must be floating point).
Tensor rand_like(const Tensor& t, Generator* gen = nullptr);
Tensor randn_like(const Tensor& t, Generator* gen = nullptr);
// torch.multinomial: `num_samples` category indices per row of `weights` ((C) or (N, C); non-negative, finite, not
// all zero in a row; they need not sum to 1), each drawn with probability proportional to its weight. Without
// replacement a row's samples are distinct and num_samples may not exceed its non-zero weights. int64 (num_samples)
// or (N, num_samples) on weights' device; not differentiable. The draws are made on the host from `gen`.
//   asc::Tensor next = asc::multinomial(asc::softmax(logits / 0.8, -1), 1);  // (B, 1): one token per row
Tensor multinomial(const Tensor& weights, int64_t num_samples, bool replacement = false, Generator* gen = nullptr);
// From host data in row-major order: asc::tensor({1, 2, 3, 4}, {2, 2}).
Tensor tensor(std::span<const double> values, const Shape& shape, TensorOptions opts = {});
Tensor tensor(std::initializer_list<double> values, const Shape& shape, TensorOptions opts = {});
Tensor tensor(std::initializer_list<double> values, TensorOptions opts = {});  // 1-D
Tensor tensor(const std::vector<float>& values, const Shape& shape, TensorOptions opts = {});
Tensor tensor(const std::vector<double>& values, const Shape& shape, TensorOptions opts = {.dtype = kFloat64});
Tensor tensor(const std::vector<int64_t>& values, const Shape& shape, TensorOptions opts = {.dtype = kInt64});

}  // namespace asc
