#pragma once
// Fused scaled-dot-product attention (flash attention) through cuDNN's graph API, the CUDA fast path of
// nn::scaled_dot_product_attention for bfloat16/float16 inputs. See cuda/cudnn_sdpa.cpp for the graphs.
//
//   std::string why = asc::cuda::cudnn_sdpa_unsupported(q, k, v, causal, needs_backward);
//   if (why.empty()) asc::cuda::cudnn_sdpa_forward(q, k, v, causal, scale, o, stats);
//
// Shapes: q (B, H, T, D), k and v (B, H, S, D), each with a unit stride in D; o (B, H, T, D) in q's dtype;
// stats (B, H, T, 1) float32, the log-sum-exp of each row of scaled (masked) scores, which the backward uses to
// recompute the probabilities. `causal`: query t sees keys s <= t (T == S is required by the callers).
// In builds without cuDNN (or without CUDA) cudnn_sdpa_unsupported says so and the others throw.
#include <string>

#include "core/tensor.h"

namespace asc::cuda {

// Empty when the fused kernels can run these inputs (and the backward too, with needs_backward); otherwise why
// not: a build without cuDNN, a dtype, head dim, stride or alignment cuDNN does not take, or no cuDNN engine
// for the graph on this device. Builds (and caches) the execution plans it answers for.
std::string cudnn_sdpa_unsupported(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, bool needs_backward);

// Writes o: (B, H, T, D) like q, in the heads-last layout (B, T, H, D) viewed as (B, H, T, D), and stats:
// (B, H, T, 1) float32 contiguous, both allocated by the caller.
void cudnn_sdpa_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, Tensor& o,
                        Tensor& stats);

// Gradients of the forward's o w.r.t. q, k, v given dout (any strides; copied to o's layout when they differ), written
// into dq, dk, dv: contiguous, the shapes and dtype of q, k, v, allocated by the caller.
void cudnn_sdpa_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& dout,
                         const Tensor& stats, bool causal, double scale, Tensor& dq, Tensor& dk, Tensor& dv);

// Whether cuDNN accepts the forward and backward graphs for a device it is only told about (its JSON device
// properties), without a GPU: heuristics are asked for engine configs and plans are finalized. Run by
// tools/cudnn_sdpa_check. With the CUDA driver's stub library, plan finalization fails at module load (status
// 5001) after the engine has accepted the graph, so "N engine configs" with N > 0 is the answer. Real cuDNN only.
std::string cudnn_sdpa_offline_check(const std::string& device_json, DType dtype, int64_t B, int64_t H, int64_t T,
                                     int64_t S, int64_t D, bool causal, bool heads_last);

}  // namespace asc::cuda
