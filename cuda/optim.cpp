// CUDA entry points of the fused optimizer kernels (declared once in ops/kernel_list.inc, like the CPU ones): check
// the tensors, pass raw pointers and the hyper-parameters to the launchers of cuda/optim.cu, and turn a failed
// launch into an asc::Error.
#include "core/error.h"
#include "core/format.h"
#include "core/tensor.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/optim_launch.h"
#include "ops/kernels.h"

namespace asc::cuda {

namespace {

// param: a contiguous float32/float64 CUDA tensor.
void check_param(const char* op, const Tensor& p) {
  ASC_CHECK(p.defined() && p.device().is_cuda(), "{} (CUDA): the parameter must be a CUDA tensor", op);
  ASC_CHECK(p.dtype() == kFloat32 || p.dtype() == kFloat64,
            "{} (CUDA): the parameter must be float32 or float64, got {}", op, p.dtype());
  ASC_CHECK(p.is_contiguous(), "{} (CUDA): the parameter must be contiguous", op);
}

// A gradient or state tensor that must accompany param (same device, dtype, numel, contiguous). Returns its data.
void* companion(const char* op, const Tensor& p, const Tensor& t, const char* what) {
  ASC_CHECK(t.defined(), "{} (CUDA): {} is undefined", op, what);
  ASC_CHECK(t.device() == p.device() && t.dtype() == p.dtype() && t.numel() == p.numel() && t.is_contiguous(),
            "{} (CUDA): {} must be a contiguous {} tensor of {} elements on {} (got {} with {} elements on {})", op,
            what, p.dtype(), p.numel(), p.device(), t.dtype(), t.numel(), t.device());
  return t.raw_data();
}

RowMask row_mask_of(const char* op, const Tensor& p, const Tensor& mask) {
  RowMask m;
  if (!mask.defined() || p.numel() == 0) return m;
  ASC_CHECK(mask.device() == p.device() && mask.dtype() == kBool && mask.is_contiguous() && p.dim() >= 1 &&
                mask.numel() == p.size(0),
            "{} (CUDA): the row mask must be a contiguous bool tensor of {} elements on {} (got {} {} on {})", op,
            p.dim() >= 1 ? p.size(0) : 0, p.device(), mask.dtype(), mask.shape(), mask.device());
  m.mask = static_cast<const bool*>(mask.raw_data());
  m.rows = mask.numel();
  m.row_size = p.numel() / m.rows;
  return m;
}

}  // namespace

void sgd_update(const optim::SGDKernelArgs& a, const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                const Tensor& row_mask) {
  const char* op = "SGD.step";
  check_param(op, param);
  const void* g = companion(op, param, grad, "grad");
  void* buf = a.momentum != 0 ? companion(op, param, momentum_buf, "momentum_buffer") : nullptr;
  ASC_CUDA_CHECK(launch_sgd_update(a, param.raw_data(), g, buf, param.numel(), row_mask_of(op, param, row_mask),
                                   param.dtype() == kFloat64, current_stream()));
}

void adam_update(const optim::AdamKernelArgs& a, const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                 const Tensor& exp_avg_sq, const Tensor& max_exp_avg_sq, const Tensor& row_mask) {
  const char* op = a.decoupled ? "AdamW.step" : "Adam.step";
  check_param(op, param);
  const void* g = companion(op, param, grad, "grad");
  void* m = companion(op, param, exp_avg, "exp_avg");
  void* v = companion(op, param, exp_avg_sq, "exp_avg_sq");
  void* vmax = a.amsgrad ? companion(op, param, max_exp_avg_sq, "max_exp_avg_sq") : nullptr;
  ASC_CUDA_CHECK(launch_adam_update(a, param.raw_data(), g, m, v, vmax, param.numel(), row_mask_of(op, param, row_mask),
                                    param.dtype() == kFloat64, current_stream()));
}

void rmsprop_update(const optim::RMSpropKernelArgs& a, const Tensor& param, const Tensor& grad,
                    const Tensor& square_avg, const Tensor& momentum_buf, const Tensor& grad_avg,
                    const Tensor& row_mask) {
  const char* op = "RMSprop.step";
  check_param(op, param);
  const void* g = companion(op, param, grad, "grad");
  void* sq = companion(op, param, square_avg, "square_avg");
  void* buf = a.momentum > 0 ? companion(op, param, momentum_buf, "momentum_buffer") : nullptr;
  void* ga = a.centered ? companion(op, param, grad_avg, "grad_avg") : nullptr;
  ASC_CUDA_CHECK(launch_rmsprop_update(a, param.raw_data(), g, sq, buf, ga, param.numel(),
                                       row_mask_of(op, param, row_mask), param.dtype() == kFloat64, current_stream()));
}

void clamp_inplace(const Tensor& t, double lo, double hi) {
  check_param("Optimizer.step (clamp)", t);
  ASC_CUDA_CHECK(launch_clamp_inplace(t.raw_data(), t.numel(), lo, hi, t.dtype() == kFloat64, current_stream()));
}

}  // namespace asc::cuda
