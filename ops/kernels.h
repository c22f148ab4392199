#pragma once
// The kernel interface of a device backend: every kernel entry point, declared once (ops/kernel_list.inc) and
// provided by each backend in its own namespace, asc::cpu (ops/cpu/) and asc::cuda (cuda/).
// Ops never call these directly: they go through ASC_KERNEL (ops/dispatch.h), the one place that picks a backend.
//
// The CPU kernels are part of the library (libascender). The CUDA kernels live in a library of their own
// (libascender_cuda, CMake target ascender::cuda), which the library never references by name: when it loads, it
// fills a KernelTable with the addresses of asc::cuda::<kernel> and registers it (cuda/backend.cpp). So a program
// that links only ascender::ascender needs no CUDA library to build or run, and one that links ascender::cuda gets
// the GPU path of every op. A backend that lacks a kernel fails to link (the CPU one: the library; the CUDA one: the
// table), so both always offer the same set. C++20 header (takes Tensors): CUDA .cu files never include it; they see
// only their plain-data launchers (cuda/*_launch.h).
#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "ops/kernel_types.h"       // Ascender*, GateBackward, Surrogate, SparsePatternView
#include "ops/math.h"               // math::Unary, math::Binary, math::UnaryParams
#include "ops/optim_kernel_args.h"  // optim::SGDKernelArgs, AdamKernelArgs, RMSpropKernelArgs

#define ASC_DECLARE_KERNEL(NAME, PARAMS) void NAME PARAMS;
namespace asc::cpu {
#include "ops/kernel_list.inc"
}  // namespace asc::cpu

namespace asc::cuda {
#include "ops/kernel_list.inc"
}  // namespace asc::cuda
#undef ASC_DECLARE_KERNEL

namespace asc {

// One function pointer per kernel of the list, named as the kernel: table.topk(x, mask, k, ...).
struct KernelTable {
#define ASC_DECLARE_KERNEL(NAME, PARAMS) void(*NAME) PARAMS = nullptr;
#include "ops/kernel_list.inc"
#undef ASC_DECLARE_KERNEL
};

// The CUDA backend's kernels: nullptr until its library registers them (a program without ascender::cuda).
const KernelTable* cuda_kernels();
// Called once by the CUDA backend library as it loads; `table` must outlive the program.
void register_cuda_kernels(const KernelTable* table);

}  // namespace asc
