#pragma once
// The one place where an op chooses its backend.
//
// The path of an op, e.g. topk (grep the name to find every piece):
//   ops/geometry.h           the public op:     ValuesIndices topk(const Tensor& x, int64_t k, ...)
//   ops/geometry.cpp         validate, allocate outputs, dispatch, record the backward with autograd::record
//   ops/kernel_list.inc      the kernel's signature, declared ONCE: void topk(const Tensor& x, ..., Tensor& indices)
//   ops/cpu/geometry.cpp     asc::cpu::topk, the CPU kernel
//   cuda/geometry.cpp (.cu)  asc::cuda::topk, the CUDA kernel (host side, then a plain-data launcher in the .cu)
// ops/kernels.h includes the list into both namespaces, so each backend must define every kernel (a missing one is a
// link error, not a runtime surprise), and the op calls
//
//   ASC_KERNEL(x.device(), "topk", topk, xc, mask, k, largest, diag_n, values, indices);
//
// which runs cpu::topk(...) for CPU tensors and, inside a DeviceScope for the tensors' device, cuda::topk(...) for
// CUDA tensors. In a build without the CUDA backend a CUDA tensor reaching an op gets a clear error (such a tensor
// cannot normally be created: the CUDA allocator is missing). Nothing here includes a backend header.
#include "core/device.h"
#include "core/error.h"
#include "core/format.h"
#include "core/tensor.h"
#include "ops/checks.h"
#include "ops/kernels.h"

#ifdef ASC_HAVE_CUDA
#define ASC_CUDA_KERNEL_(DEV, OPNAME, FN, ...)          \
  do {                                                  \
    const ::asc::DeviceScope asc_on_device_(DEV);       \
    ::asc::cuda::FN(__VA_ARGS__);                       \
  } while (0)
#else
#define ASC_CUDA_KERNEL_(DEV, OPNAME, FN, ...) \
  ASC_THROW("{}: no kernel for device {} in this build (built without the CUDA backend)", OPNAME, DEV)
#endif

#define ASC_KERNEL(DEVICE, OPNAME, FN, ...)                                           \
  do {                                                                               \
    const ::asc::Device asc_dev_ = (DEVICE);                                         \
    if (asc_dev_.is_cpu()) {                                                         \
      ::asc::cpu::FN(__VA_ARGS__);                                                   \
    } else if (asc_dev_.is_cuda()) {                                                 \
      ASC_CUDA_KERNEL_(asc_dev_, OPNAME, FN, __VA_ARGS__);                           \
    } else {                                                                         \
      ASC_THROW("{}: no kernel for device {} in this build", OPNAME, asc_dev_);      \
    }                                                                                \
  } while (0)
