#pragma once
// Launchers of the fused CUDA optimizer kernels (cuda/optim.cu), called by cuda/optim.cpp with plain data. All
// tensors are contiguous with `numel` elements of float32 (f64 = false) or float64. row_mask: nullptr, or `rows`
// bools (numel = rows * row_size): a row whose entry is false is neither read nor written. C++17-clean; each
// launcher returns the launch's cudaError_t. The hyper-parameters are ops/optim_kernel_args.h's *KernelArgs.
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/optim_kernel_args.h"

namespace asc::cuda {

using optim::AdamKernelArgs;
using optim::RMSpropKernelArgs;
using optim::SGDKernelArgs;

struct RowMask {
  const bool* mask = nullptr;  // nullptr: every row moves
  int64_t rows = 1, row_size = 0;
};

// buf: nullptr unless momentum != 0.
cudaError_t launch_sgd_update(const SGDKernelArgs& a, void* param, const void* grad, void* buf, int64_t numel,
                              RowMask mask, bool f64, cudaStream_t stream);

// vmax: nullptr unless amsgrad.
cudaError_t launch_adam_update(const AdamKernelArgs& a, void* param, const void* grad, void* m, void* v, void* vmax,
                               int64_t numel, RowMask mask, bool f64, cudaStream_t stream);

// buf: nullptr unless momentum > 0; grad_avg: nullptr unless centered.
cudaError_t launch_rmsprop_update(const RMSpropKernelArgs& a, void* param, const void* grad, void* square_avg,
                                  void* buf, void* grad_avg, int64_t numel, RowMask mask, bool f64,
                                  cudaStream_t stream);

// t = min(max(t, lo), hi) in place; NaN stays NaN.
cudaError_t launch_clamp_inplace(void* t, int64_t numel, double lo, double hi, bool f64, cudaStream_t stream);

}  // namespace asc::cuda
