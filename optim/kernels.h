#pragma once
// Fused optimizer update kernels: one pass over parameter, gradient and state per element, in place. Reached
// through ASC_KERNEL (ops/dispatch.h), so a CUDA backend adds the same signatures in namespace asc::cuda:
//
//   ASC_KERNEL(p.device(), "Adam.step", adam_update, params, p, grad, exp_avg, exp_avg_sq, max_sq, row_mask);
//
// Every kernel takes an optional per-row mask: a bool tensor of shape (p.size(0),) (undefined = every row
// moves). A row whose mask entry is false is skipped entirely: neither the parameter nor any state tensor is read
// or written there, so it stays bit-for-bit unchanged. Kernels assume validated inputs: param, grad and state
// tensors contiguous, same shape, same floating dtype (float32 or float64), same device. The arithmetic runs in
// the parameter's dtype, in the order of torch.optim's single-tensor implementations.
#include "core/tensor.h"
#include "optim/kernel_args.h"

namespace asc::cpu {

// Tensors passed as const& are handles; param and the state tensors are written in place.
// momentum_buf is undefined when momentum == 0.
void sgd_update(const optim::SGDKernelArgs& a, const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                const Tensor& row_mask);
// max_exp_avg_sq is undefined unless amsgrad.
void adam_update(const optim::AdamKernelArgs& a, const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                 const Tensor& exp_avg_sq, const Tensor& max_exp_avg_sq, const Tensor& row_mask);
// momentum_buf undefined unless momentum > 0; grad_avg undefined unless centered.
void rmsprop_update(const optim::RMSpropKernelArgs& a, const Tensor& param, const Tensor& grad,
                    const Tensor& square_avg, const Tensor& momentum_buf, const Tensor& grad_avg,
                    const Tensor& row_mask);
// t = min(max(t, lo), hi) in place (t contiguous, float32/float64); NaN stays NaN.
void clamp_inplace(const Tensor& t, double lo, double hi);

}  // namespace asc::cpu
