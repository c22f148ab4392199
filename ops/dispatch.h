#pragma once
// The one place where an op chooses its backend.
//
// The path of an op, e.g. topk (grep the name to find every piece):
//   ops/geometry.h           the public op:     ValuesIndices topk(const Tensor& x, int64_t k, ...)
//   ops/geometry.cpp         validate, allocate outputs, dispatch, record the backward with autograd::record
//   ops/kernel_list.inc      the kernel's signature, declared ONCE: ASC_DECLARE_KERNEL(topk, (const Tensor& x, ...))
//   ops/cpu/geometry.cpp     asc::cpu::topk, the CPU kernel
//   cuda/geometry.cpp (.cu)  asc::cuda::topk, the CUDA kernel (host side, then a plain-data launcher in the .cu)
// One pattern for every op: ops validate, allocate every output, dispatch once and record the backward; kernels are
// leaves: they write into the outputs they are given, record nothing and compose no ops (a contiguous copy of an
// input, or scratch space, is theirs to take).
// ops/kernels.h declares the list in both namespaces, so each backend must define every kernel (a missing one is a
// link error, not a runtime surprise), and the op calls
//
//   ASC_KERNEL(x.device(), "topk", topk, xc, mask, k, largest, diag_n, values, indices);
//
// which runs cpu::topk(...) for CPU tensors and, inside a DeviceScope for the tensors' device, the CUDA backend's
// topk for CUDA tensors — through the KernelTable that backend's library registered when it loaded (ops/kernels.h),
// so the library itself never names a CUDA symbol. A program that does not link the CUDA backend gets a clear error
// (such a tensor cannot normally be created there: no CUDA allocator is registered). Nothing here includes a backend
// header.
#include "core/device.h"
#include "core/error.h"
#include "core/format.h"
#include "core/profiler.h"
#include "core/tensor.h"
#include "ops/checks.h"
#include "ops/kernels.h"

#define ASC_CUDA_KERNEL_(DEV, OPNAME, FN, ...)                                                                     \
  do {                                                                                                             \
    const ::asc::KernelTable* asc_cuda_ = ::asc::cuda_kernels();                                                   \
    ASC_CHECK(asc_cuda_ != nullptr,                                                                                \
              "{}: no kernel for device {}: this program does not link the CUDA backend (ascender::cuda)", OPNAME, \
              DEV);                                                                                                \
    const ::asc::DeviceScope asc_on_device_(DEV);                                                                  \
    asc_cuda_->FN(__VA_ARGS__);                                                                                    \
  } while (0)

// Every dispatch is a kernel event of the profiler (core/profiler.h) named after the op and the kernel; FLOPS
// (ops/flops.h), for a kernel whose FLOPs the op knows, is evaluated only while a profile records (-1: not known).
#define ASC_KERNEL(DEVICE, OPNAME, FN, ...) ASC_KERNEL_COUNTED(DEVICE, OPNAME, -1.0, FN, __VA_ARGS__)

#define ASC_KERNEL_COUNTED(DEVICE, OPNAME, FLOPS, FN, ...)                            \
  do {                                                                                \
    ::asc::profiler::KernelScope asc_event_(OPNAME, #FN);                             \
    if (asc_event_.open()) {                                                          \
      asc_event_.set_flops(FLOPS);                                                    \
      const ::asc::Device asc_event_dev_ = (DEVICE);                                  \
      if (asc_event_dev_.is_cuda()) asc_event_.set_cuda_device(asc_event_dev_.index); \
    }                                                                                 \
    ASC_KERNEL_DISPATCH_(DEVICE, OPNAME, FN, __VA_ARGS__);                            \
  } while (0)

#define ASC_KERNEL_DISPATCH_(DEVICE, OPNAME, FN, ...)                           \
  do {                                                                          \
    const ::asc::Device asc_dev_ = (DEVICE);                                    \
    if (asc_dev_.is_cpu()) {                                                    \
      ::asc::cpu::FN(__VA_ARGS__);                                              \
    } else if (asc_dev_.is_cuda()) {                                            \
      ASC_CUDA_KERNEL_(asc_dev_, OPNAME, FN, __VA_ARGS__);                      \
    } else {                                                                    \
      ASC_THROW("{}: no kernel for device {} in this build", OPNAME, asc_dev_); \
    }                                                                           \
  } while (0)
