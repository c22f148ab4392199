// CUDA entry points of the reduction kernels: the same signatures and semantics as asc::cpu's
// (ops/kernel_list.inc). Each validates its tensors and calls the launcher of cuda/reduce.cu with raw pointers
// on cuda::current_stream(). Outputs are preallocated by the op, exactly as for the CPU.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"
#include "core/format.h"
#include "core/tensor.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/reduce_launch.h"
#include "ops/kernels.h"

namespace asc::cuda {

namespace {

using reduce_launch::Elem;

Elem elem_of(const char* op, DType t, bool allow_int) {
  switch (t) {
    case kFloat32: return Elem::F32;
    case kFloat64: return Elem::F64;
    case kBFloat16: return Elem::BF16;
    case kFloat16: return Elem::F16;
    case kInt64:
      if (allow_int) return Elem::I64;
      [[fallthrough]];
    default:
      ASC_THROW("{}: dtype {} is not supported on CUDA ({} only)", op, t,
                allow_int ? "float32/float64/bfloat16/float16/int64" : "float32/float64/bfloat16/float16");
  }
}

Device cuda_device_of(const char* op, const Tensor& x) {
  ASC_CHECK(x.defined(), "{} (CUDA): input is an undefined tensor", op);
  ASC_CHECK(x.device().is_cuda(), "{} (CUDA): input is on {}, expected a CUDA tensor", op, x.device());
  return x.device();
}

void check_out(const char* op, const char* what, const Tensor& t, Device dev, DType dt, int64_t numel) {
  ASC_CHECK(t.defined(), "{} (CUDA): {} is an undefined tensor", op, what);
  ASC_CHECK(t.device() == dev, "{} (CUDA): {} is on {}, expected {}", op, what, t.device(), dev);
  ASC_CHECK(t.dtype() == dt, "{} (CUDA): {} has dtype {}, expected {}", op, what, t.dtype(), dt);
  ASC_CHECK(t.is_contiguous(), "{} (CUDA): output {} must be contiguous", op, what);
  ASC_CHECK(t.numel() == numel, "{} (CUDA): output {} has {} elements, expected {}", op, what, t.numel(), numel);
}

void check_launch(const char* op, cudaError_t err) {
  ASC_CHECK(err == cudaSuccess, "{} (CUDA): kernel launch failed: {} ({})", op, cudaGetErrorName(err),
            cudaGetErrorString(err));
}

}  // namespace

void max_min_lastdim(const Tensor& x_in, bool is_max, Tensor& values, Tensor& indices) {
  const char* op = is_max ? "max" : "min";
  const Device dev = cuda_device_of(op, x_in);
  const Elem et = elem_of(op, x_in.dtype(), true);
  ASC_CHECK(x_in.dim() == 2, "{} (CUDA): expected a (rows, n) input, got {} dims", op, x_in.dim());
  const int64_t rows = x_in.size(0), n = x_in.size(1);
  check_out(op, "values", values, dev, x_in.dtype(), rows);
  if (indices.defined()) check_out(op, "indices", indices, dev, kInt64, rows);
  if (rows == 0) return;
  ASC_CHECK(n >= 1, "{} (CUDA): cannot reduce over an empty dimension", op);
  const Tensor x = x_in.contiguous();
  check_launch(
      op, reduce_launch::max_min_lastdim(et, x.raw_data(), is_max, values.raw_data(),
                                         indices.defined() ? static_cast<int64_t*>(indices.raw_data()) : nullptr, rows,
                                         n, current_stream()));
}

void max_min_middim(const Tensor& x_in, bool is_max, Tensor& values, Tensor& indices) {
  const char* op = is_max ? "max" : "min";
  const Device dev = cuda_device_of(op, x_in);
  const Elem et = elem_of(op, x_in.dtype(), true);
  ASC_CHECK(x_in.dim() == 3, "{} (CUDA): expected an (outer, n, inner) input, got {} dims", op, x_in.dim());
  const int64_t outer = x_in.size(0), n = x_in.size(1), inner = x_in.size(2);
  check_out(op, "values", values, dev, x_in.dtype(), outer * inner);
  if (indices.defined()) check_out(op, "indices", indices, dev, kInt64, outer * inner);
  if (outer * inner == 0) return;
  ASC_CHECK(n >= 1, "{} (CUDA): cannot reduce over an empty dimension", op);
  const Tensor x = x_in.contiguous();
  check_launch(
      op, reduce_launch::max_min_middim(et, x.raw_data(), is_max, values.raw_data(),
                                        indices.defined() ? static_cast<int64_t*>(indices.raw_data()) : nullptr, outer,
                                        n, inner, current_stream()));
}

void logsumexp_lastdim(const Tensor& x_in, Tensor& out) {
  const char* op = "logsumexp";
  const Device dev = cuda_device_of(op, x_in);
  const Elem et = elem_of(op, x_in.dtype(), false);
  ASC_CHECK(x_in.dim() == 2, "{} (CUDA): expected a (rows, n) input, got {} dims", op, x_in.dim());
  const int64_t rows = x_in.size(0), n = x_in.size(1);
  check_out(op, "out", out, dev, x_in.dtype(), rows);
  if (rows == 0) return;
  const Tensor x = x_in.contiguous();
  check_launch(op, reduce_launch::logsumexp_lastdim(et, x.raw_data(), out.raw_data(), rows, n, current_stream()));
}

}  // namespace asc::cuda
