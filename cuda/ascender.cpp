// CUDA entry points of fused ASCender attention (ops/ascender.h). The fused CUDA kernels are not written yet:
// ascender_unsupported says so, and the op runs the reference, whose ops all have CUDA kernels. The forward and
// backward entries exist because every backend provides every kernel of ops/kernel_list.inc; the op never calls
// them while ascender_unsupported refuses.
#include "core/error.h"
#include "ops/kernels.h"

namespace asc::cuda {

void ascender_unsupported(const AscenderKernelInputs&, const AscenderKernelConfig&, std::string& why) {
  why = "no fused CUDA kernel yet";
}

void ascender_forward(const AscenderKernelInputs&, const AscenderKernelConfig&, Tensor&) {
  ASC_THROW("ascender_attention (CUDA): no fused CUDA kernel yet (ascender_unsupported refuses every input)");
}

void ascender_backward(const AscenderKernelInputs&, const AscenderKernelConfig&, const Tensor&, TensorList&) {
  ASC_THROW("ascender_attention (CUDA): no fused CUDA kernel yet (ascender_unsupported refuses every input)");
}

}  // namespace asc::cuda
