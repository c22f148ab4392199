#pragma once
// The kernel interface of a device backend: every kernel entry point, declared once (ops/kernel_list.inc) and
// provided by each backend in its own namespace, asc::cpu (ops/cpu/, optim/kernels_cpu.cpp) and asc::cuda (cuda/).
// Ops never call these directly: they go through ASC_KERNEL (ops/dispatch.h), the one place that picks a backend.
// A backend that lacks a kernel fails to link, so both backends always offer the same set. C++20 header (takes
// Tensors): CUDA .cu files never include it; they see only their plain-data launchers (cuda/*_launch.h).
#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "ops/ascender.h"  // AscenderKernelInputs, AscenderKernelConfig
#include "ops/geometry.h"      // Surrogate
#include "ops/math.h"              // math::Unary, math::Binary, math::UnaryParams
#include "ops/sparse_attention.h"  // SparsePattern
#include "optim/kernel_args.h" // optim::SGDKernelArgs, AdamKernelArgs, RMSpropKernelArgs

namespace asc::cpu {
#include "ops/kernel_list.inc"
}  // namespace asc::cpu

namespace asc::cuda {
#include "ops/kernel_list.inc"
}  // namespace asc::cuda
