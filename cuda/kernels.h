#pragma once
// CUDA kernel entry points: the same names and signatures as every CPU entry point (ops/cpu/kernels.h,
// ops/cpu/*_kernels.h, optim/kernels.h), in namespace asc::cuda. ASC_KERNEL (ops/dispatch.h) calls these for CUDA
// tensors in builds with ASC_HAVE_CUDA. Inputs are validated by the op (same device, shapes, dtypes), outputs
// preallocated on the device. C++20 header (takes Tensors): include it from .cpp files only, never from a .cu.
//
// Where they are defined:
//   cuda/elementwise.cpp  unary, unary_backward, binary, where, copy, fill, isnan, sum, uniform, dropout_mask,
//                         normal, randint
//   cuda/matmul.cpp       matmul (cuBLAS)
//   cuda/nn.cpp, cuda/reduce.cpp        softmax, layer/rms norm, cross-entropy; max/min, logsumexp
//   cuda/index.cpp, cuda/geometry.cpp   indexing; topk, row norms, surrogate gate
//   cuda/optim.cpp        SGD / Adam / RMSprop updates, clamp
// Each .cpp validates and calls launchers (cuda/*_launch.h, plain data) implemented in the matching .cu.
#include <cstdint>

#include "core/tensor.h"
#include "ops/geometry.h"
#include "ops/math.h"
#include "optim/kernels.h"

namespace asc::cuda {

// ---- ops/cpu/kernels.h ------------------------------------------------------------------------------------------
void unary(math::Unary op, const math::UnaryParams& p, const Tensor& x, Tensor& out);
void unary_backward(math::Unary op, const math::UnaryParams& p, const Tensor& g, const Tensor& x, const Tensor& y,
                    Tensor& gx);
void binary(math::Binary op, const Tensor& a, const Tensor& b, Tensor& out);
void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out);
void copy(const Tensor& src, Tensor& dst);
void fill(Tensor& dst, double value);
void isnan(const Tensor& x, Tensor& out);
void sum(const Tensor& x, Tensor& out);
void matmul(const Tensor& a, const Tensor& b, Tensor& out);
void uniform(Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi);
void dropout_mask(Tensor& out, uint64_t seed, uint64_t offset, double p, double scale);
void normal(Tensor& out, uint64_t seed, uint64_t offset, double mean, double stddev);
void randint(Tensor& out, uint64_t seed, uint64_t offset, int64_t low, int64_t high);

// ---- ops/cpu/reduce_kernels.h -----------------------------------------------------------------------------------
void max_min_lastdim(const Tensor& x, bool is_max, Tensor& values, Tensor& indices);
void max_min_middim(const Tensor& x, bool is_max, Tensor& values, Tensor& indices);
void logsumexp_lastdim(const Tensor& x, Tensor& out);

// ---- ops/cpu/nn_kernels.h ---------------------------------------------------------------------------------------
void softmax_forward(const Tensor& x, const Tensor& mask, bool log, Tensor& y);
void softmax_backward(const Tensor& g, const Tensor& y, const Tensor& mask, bool log, Tensor& gx);
void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, bool rms, Tensor& y,
                        Tensor& mean, Tensor& rstd);
void layer_norm_backward(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, bool rms, Tensor& gx, Tensor& gw, Tensor& gb);
void cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,
                           Tensor& loss, Tensor& stats);
void cross_entropy_backward(const Tensor& gloss, double scale, const Tensor& logits, const Tensor& target,
                            const Tensor& stats, int64_t ignore_index, double smoothing, Tensor& gx);

// ---- ops/cpu/geometry_kernels.h ---------------------------------------------------------------------------------
void topk(const Tensor& x, const Tensor& mask, int64_t k, bool largest, int64_t diag_n, Tensor& values,
          Tensor& indices);
void topk_count(const Tensor& mask, int64_t diag_n, Tensor& counts);
void topk_backward(const Tensor& g, const Tensor& indices, Tensor& gx);
void normalize_rows(const Tensor& x, double eps, Tensor& y, Tensor& norm);
void row_standardize(const Tensor& x, const Tensor& mask, double eps, Tensor& y, Tensor& sd);
void apply_surrogate(const Surrogate& s, double width, const Tensor& u, Tensor& out);

// ---- ops/cpu/index_kernels.h ------------------------------------------------------------------------------------
void index_minmax(const Tensor& index, int64_t& lo, int64_t& hi);
void index_select(const Tensor& x, int dim, const Tensor& index, Tensor& out);
void index_add(Tensor& out, int dim, const Tensor& index, const Tensor& src, int64_t skip);
void gather(const Tensor& x, int dim, const Tensor& index, Tensor& out);
void scatter_add(Tensor& out, int dim, const Tensor& index, const Tensor& src);
void one_hot(const Tensor& index, Tensor& out);

// ---- optim/kernels.h --------------------------------------------------------------------------------------------
void sgd_update(const optim::SGDKernelArgs& a, const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                const Tensor& row_mask);
void adam_update(const optim::AdamKernelArgs& a, const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                 const Tensor& exp_avg_sq, const Tensor& max_exp_avg_sq, const Tensor& row_mask);
void rmsprop_update(const optim::RMSpropKernelArgs& a, const Tensor& param, const Tensor& grad,
                    const Tensor& square_avg, const Tensor& momentum_buf, const Tensor& grad_avg,
                    const Tensor& row_mask);
void clamp_inplace(const Tensor& t, double lo, double hi);

}  // namespace asc::cuda
