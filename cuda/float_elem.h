#pragma once
// The element type of a floating-point CUDA tensor as the launchers see it, and the one switch that turns it into the
// storage type kernels are instantiated for:
//
//   return visit_float_elem(t, [&](auto tag) { using T = decltype(tag); launch_kernel(k<T>, ...); return ...; });
//
// C++17 and CUDA headers only: included by launcher headers (so by .cu files) and by the cuda/*.cpp entry points,
// which get a FloatElem from a DType through float_elem_of (cuda/context.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace asc::cuda {

enum class FloatElem : uint8_t { F32, F64, BF16, F16 };

// f(T{}) with T the storage type of t: float, double, __nv_bfloat16 or __half.
template <class F>
cudaError_t visit_float_elem(FloatElem t, F&& f) {
  switch (t) {
    case FloatElem::F32: return f(float{});
    case FloatElem::F64: return f(double{});
    case FloatElem::BF16: return f(__nv_bfloat16{});
    case FloatElem::F16: return f(__half{});
  }
  return cudaErrorInvalidValue;
}

// The same for the storage types the tensor-core kernels take (cuda/mma.cuh): float (as TF32), __nv_bfloat16 and
// __half; cudaErrorInvalidValue for float64.
template <class F>
cudaError_t visit_mma_elem(FloatElem t, F&& f) {
  switch (t) {
    case FloatElem::F32: return f(float{});
    case FloatElem::BF16: return f(__nv_bfloat16{});
    case FloatElem::F16: return f(__half{});
    case FloatElem::F64: break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace asc::cuda
