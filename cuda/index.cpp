// CUDA entry points of the indexing kernels (same signatures and semantics as ops/kernel_list.inc): check the
// tensors, describe them as plain data for the launchers of cuda/index.cu, and turn a failed launch into an
// asc::Error. Inputs arrive validated by the ops (int64 indices, bounds already checked, shapes consistent).
#include "core/determinism.h"
#include "core/error.h"
#include "core/format.h"
#include "core/tensor.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/index_launch.h"
#include "ops/kernels.h"
#include "ops/layout.h"

namespace asc::cuda {

namespace {

void check_cuda(const char* op, const Tensor& t, const char* what) {
  ASC_CHECK(t.defined() && t.device().is_cuda(), "{} (CUDA): {} must be a CUDA tensor", op, what);
}

void check_index(const char* op, const Tensor& index) {
  check_cuda(op, index, "index");
  ASC_CHECK(index.dtype() == kInt64, "{} (CUDA): index must be int64, got {}", op, index.dtype());
}

IdxDtype idx_dtype(DType t) {
  switch (t) {
    case kFloat32: return IdxDtype::F32;
    case kFloat64: return IdxDtype::F64;
    case kInt64: return IdxDtype::I64;
    case kBool: return IdxDtype::Bool;
    case kBFloat16: return IdxDtype::BF16;
    case kFloat16: return IdxDtype::F16;
  }
  return IdxDtype::F32;
}

// The walk over `shape` with up to three operands' strides.
IdxLayout layout_of(const Shape& shape, std::initializer_list<const Strides*> strides) {
  IdxLayout L;
  L.ndim = shape.size();
  for (int d = 0; d < shape.size(); ++d) L.sizes[d] = shape[d];
  int k = 0;
  for (const Strides* s : strides) {
    for (int d = 0; d < shape.size(); ++d) L.strides[k][d] = (*s)[d];
    ++k;
  }
  return L;
}

// Element stride of a 0-D or 1-D index tensor.
int64_t index_stride(const Tensor& index) { return index.dim() == 0 ? 1 : index.stride(0); }

}  // namespace

void index_minmax(const Tensor& index, int64_t& lo, int64_t& hi) {
  check_index("index_minmax", index);
  ASC_CHECK(index.numel() > 0, "index_minmax (CUDA): empty index tensor");
  Tensor scratch = Tensor::empty({2}, {kInt64, index.device()});
  const IdxLayout L = layout_of(index.shape(), {&index.strides()});
  const WaitScope wait;  // the bounds come back to the host
  ASC_CUDA_CHECK(launch_index_minmax(static_cast<const int64_t*>(index.raw_data()), L, index.numel(),
                                     static_cast<int64_t*>(scratch.raw_data()), &lo, &hi, current_stream()));
}

void index_select(const Tensor& x_in, int dim, const Tensor& index, Tensor& out) {
  check_cuda("index_select", x_in, "x");
  check_cuda("index_select", out, "out");
  check_index("index_select", index);
  ASC_CHECK(out.is_contiguous() && out.dtype() == x_in.dtype(),
            "index_select (CUDA): out must be contiguous with x's dtype");
  Tensor x = x_in.contiguous();
  const int64_t k = index.numel();
  const int64_t n = x.dim() == 0 ? 1 : x.size(dim);
  const auto [outer, inner] = x.dim() == 0 ? OuterInner{} : split_at(x.shape(), dim);
  ASC_CUDA_CHECK(launch_index_select(x.raw_data(), out.raw_data(), x.element_size(), outer, n, inner,
                                     static_cast<const int64_t*>(index.raw_data()), index_stride(index), k,
                                     current_stream()));
}

void index_add(Tensor& out, int dim, const Tensor& index, const Tensor& src_in, int64_t skip) {
  check_cuda("index_add", out, "out");
  check_cuda("index_add", src_in, "src");
  check_index("index_add", index);
  ASC_CHECK(is_floating(out.dtype()), "index_add (CUDA): expected a floating-point output, got {}", out.dtype());
  ASC_CHECK(out.is_contiguous() && src_in.dtype() == out.dtype(),
            "index_add (CUDA): out must be contiguous and src must share its dtype ({} vs {})", out.dtype(),
            src_in.dtype());
  Tensor src = src_in.contiguous();
  const int64_t k = index.numel();
  const int64_t n = out.size(dim);
  const auto [outer, inner] = split_at(out.shape(), dim);
  ASC_CUDA_CHECK(launch_index_add(out.raw_data(), src.raw_data(), idx_dtype(out.dtype()), outer, n, inner,
                                  static_cast<const int64_t*>(index.raw_data()), index_stride(index), k, skip,
                                  deterministic_algorithms_enabled(), current_stream()));
}

void gather(const Tensor& x, int dim, const Tensor& index, Tensor& out) {
  check_cuda("gather", x, "x");
  check_cuda("gather", out, "out");
  check_index("gather", index);
  ASC_CHECK(out.dtype() == x.dtype(), "gather (CUDA): out must have x's dtype");
  Strides xs = x.strides();
  const int64_t xstep = xs[dim];
  xs[dim] = 0;  // the index supplies the position along dim
  const IdxLayout L = layout_of(index.shape(), {&out.strides(), &index.strides(), &xs});
  ASC_CUDA_CHECK(launch_gather(x.raw_data(), static_cast<const int64_t*>(index.raw_data()), out.raw_data(),
                               x.element_size(), L, index.numel(), xstep, current_stream()));
}

void scatter_add(Tensor& out, int dim, const Tensor& index, const Tensor& src) {
  check_cuda("scatter_add", out, "out");
  check_cuda("scatter_add", src, "src");
  check_index("scatter_add", index);
  ASC_CHECK(out.dtype() != kBool, "scatter_add (CUDA): dtype bool is not supported");
  ASC_CHECK(src.dtype() == out.dtype(), "scatter_add (CUDA): src ({}) must have out's dtype ({})", src.dtype(),
            out.dtype());
  Strides os = out.strides();
  const int64_t ostep = os[dim];
  os[dim] = 0;
  if (deterministic_algorithms_enabled() && is_floating(out.dtype()) && index.dim() > 0) {
    // atomicAdd's order of floating-point additions varies from run to run: sum each fibre in order instead.
    Shape fibre_shape = index.shape();
    const int64_t len = fibre_shape[dim];
    fibre_shape[dim] = 1;
    const IdxLayout F = layout_of(fibre_shape, {&os, &index.strides(), &src.strides()});
    ASC_CUDA_CHECK(launch_scatter_add_fibres(out.raw_data(), static_cast<const int64_t*>(index.raw_data()),
                                             src.raw_data(), idx_dtype(out.dtype()), F, numel_of(fibre_shape), len,
                                             index.stride(dim), src.stride(dim), ostep, current_stream()));
    return;
  }
  const IdxLayout L = layout_of(index.shape(), {&os, &index.strides(), &src.strides()});
  ASC_CUDA_CHECK(launch_scatter_add(out.raw_data(), static_cast<const int64_t*>(index.raw_data()), src.raw_data(),
                                    idx_dtype(out.dtype()), L, index.numel(), ostep, current_stream()));
}

void scatter(Tensor& out, int dim, const Tensor& index, const Tensor& src) {
  check_cuda("scatter", out, "out");
  check_cuda("scatter", src, "src");
  check_index("scatter", index);
  ASC_CHECK(src.dtype() == out.dtype(), "scatter (CUDA): src ({}) must have out's dtype ({})", src.dtype(),
            out.dtype());
  Strides os = out.strides();
  const int64_t ostep = os[dim];
  os[dim] = 0;
  Shape fibre_shape = index.shape();  // one thread per fibre along dim: its writes in order, the last one winning
  const int64_t len = fibre_shape[dim];
  fibre_shape[dim] = 1;
  const IdxLayout F = layout_of(fibre_shape, {&os, &index.strides(), &src.strides()});
  ASC_CUDA_CHECK(launch_scatter_fibres(out.raw_data(), static_cast<const int64_t*>(index.raw_data()), src.raw_data(),
                                       out.element_size(), F, numel_of(fibre_shape), len, index.stride(dim),
                                       src.stride(dim), ostep, current_stream()));
}

void one_hot(const Tensor& index, Tensor& out) {
  check_index("one_hot", index);
  check_cuda("one_hot", out, "out");
  ASC_CHECK(out.is_contiguous(), "one_hot (CUDA): out must be contiguous");
  const IdxLayout L = layout_of(index.shape(), {&index.strides()});
  ASC_CUDA_CHECK(launch_one_hot(static_cast<const int64_t*>(index.raw_data()), L, index.numel(), out.raw_data(),
                                idx_dtype(out.dtype()), out.size(-1), current_stream()));
}

}  // namespace asc::cuda
