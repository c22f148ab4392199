// CUDA kernels of scaled-dot-product attention (ops/attention.h): cuDNN's flash attention through its graph API
// (cuda/cudnn_sdpa.cpp) for bfloat16 / float16 without a mask or bias. Everything else runs the composed ops.
#include "core/error.h"
#include "core/format.h"
#include "cuda/cudnn_sdpa.h"
#include "ops/kernels.h"

namespace asc::cuda {

void sdpa_unsupported(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep_mask, const Tensor& bias,
                      bool causal, bool needs_backward, std::string& why) {
  if (keep_mask.defined()) why = "a keep_mask";
  else if (bias.defined()) why = "an additive bias";
  else why = cudnn_sdpa_unsupported(q, k, v, causal, needs_backward);
}

void sdpa_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep_mask, const Tensor& bias,
                  bool causal, double scale, Tensor& o, Tensor& stats) {
  ASC_CHECK(!keep_mask.defined() && !bias.defined(), "scaled_dot_product_attention (CUDA): the fused kernel takes no "
            "keep_mask or bias");
  cudnn_sdpa_forward(q, k, v, causal, scale, o, stats);
}

void sdpa_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep_mask, const Tensor& bias,
                   const Tensor& o, const Tensor& dout, const Tensor& stats, bool causal, double scale, Tensor& dq,
                   Tensor& dk, Tensor& dv) {
  ASC_CHECK(!keep_mask.defined() && !bias.defined(), "scaled_dot_product_attention (CUDA): the fused kernel takes no "
            "keep_mask or bias");
  cudnn_sdpa_backward(q, k, v, o, dout, stats, causal, scale, dq, dk, dv);
}

}  // namespace asc::cuda
