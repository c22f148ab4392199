#pragma once
// The one place where an op chooses its backend. Every kernel entry point exists with the same signature in
// namespace asc::cpu (ops/cpu/kernels.h and friends) and, in builds with the CUDA backend (ASC_HAVE_CUDA), in
// asc::cuda (cuda/kernels.h); an op calls
//
//   ASC_KERNEL(x.device(), "exp", unary, op, params, x, out);
//
// which runs cpu::unary(...) for CPU tensors and cuda::unary(...) for CUDA tensors. In a build without CUDA a
// CUDA tensor reaching an op gets a clear error instead of a crash (such a tensor cannot normally be created:
// the CUDA allocator is missing). CUDA entry points not written yet throw "<op>: no CUDA kernel yet".
#include "core/error.h"
#include "core/format.h"
#include "core/tensor.h"
#include "ops/cpu/kernels.h"
#ifdef ASC_HAVE_CUDA
#include "cuda/cuda.h"
#include "cuda/kernels.h"
#endif

#ifdef ASC_HAVE_CUDA
#define ASC_KERNEL(DEVICE, OPNAME, FN, ...)                                                                 \
  do {                                                                                                     \
    const ::asc::Device asc_dev_ = (DEVICE);                                                               \
    if (asc_dev_.is_cpu()) {                                                                               \
      ::asc::cpu::FN(__VA_ARGS__);                                                                         \
    } else if (asc_dev_.is_cuda()) {                                                                       \
      const ::asc::cuda::DeviceScope asc_on_device_(asc_dev_.index);                                       \
      ::asc::cuda::FN(__VA_ARGS__);                                                                        \
    } else {                                                                                               \
      ASC_THROW("{}: no kernel for device {} in this build", OPNAME, asc_dev_);                            \
    }                                                                                                      \
  } while (0)
#else
#define ASC_KERNEL(DEVICE, OPNAME, FN, ...)                                                                 \
  do {                                                                                                     \
    const ::asc::Device asc_dev_ = (DEVICE);                                                               \
    if (asc_dev_.is_cpu()) {                                                                               \
      ::asc::cpu::FN(__VA_ARGS__);                                                                         \
    } else {                                                                                               \
      ASC_THROW("{}: no kernel for device {} in this build (built without the CUDA backend)", OPNAME,      \
                asc_dev_);                                                                                 \
    }                                                                                                      \
  } while (0)
#endif

namespace asc {

// Throws unless every defined tensor is on the same device as the first.
inline void check_same_device(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    if (!first) first = t;
    else
      ASC_CHECK(t->device() == first->device(), "{}: tensors are on different devices ({} and {})", op,
                first->device(), t->device());
  }
}

inline void check_defined(const char* op, const Tensor& t, const char* what = "input") {
  ASC_CHECK(t.defined(), "{}: {} is an undefined tensor", op, what);
}

inline void check_floating(const char* op, const Tensor& t) {
  ASC_CHECK(is_floating(t.dtype()), "{}: expected a floating-point tensor, got {}", op, t.dtype());
}

}  // namespace asc
