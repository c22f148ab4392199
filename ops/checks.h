#pragma once
// Input checks shared by the ops and the kernels of every backend: each throws an asc::Error naming the op.
#include <initializer_list>

#include "core/error.h"
#include "core/format.h"
#include "core/tensor.h"

namespace asc {

// Throws unless every defined tensor is on the same device as the first.
inline void check_same_device(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    if (!first)
      first = t;
    else
      ASC_CHECK(t->device() == first->device(), "{}: tensors are on different devices ({} and {})", op, first->device(),
                t->device());
  }
}

inline void check_defined(const char* op, const Tensor& t, const char* what = "input") {
  ASC_CHECK(t.defined(), "{}: {} is an undefined tensor", op, what);
}

// Any floating dtype (float32/float64/bfloat16/float16).
inline void check_floating(const char* op, const Tensor& t) {
  ASC_CHECK(is_floating(t.dtype()), "{}: expected a floating-point tensor, got {}", op, t.dtype());
}

// A floating dtype the tensor's device computes in: float32 / float64 everywhere, bfloat16 / float16 on CUDA (the
// CPU stores 16-bit floats and converts them, but has no 16-bit kernels).
inline void check_float(const char* op, const Tensor& t, const char* what = "input") {
  ASC_CHECK(t.dtype() == kFloat32 || t.dtype() == kFloat64 || (is_reduced_float(t.dtype()) && t.device().is_cuda()),
            "{}: {} must be float32 or float64 (or bfloat16 / float16 on CUDA), got {} on {}", op, what, t.dtype(),
            t.device());
}

}  // namespace asc
