// CUDA kernels of scaled-dot-product attention (ops/attention.h), two engines:
//   cuDNN  flash attention through its graph API (cuda/cudnn_sdpa.cpp): bfloat16 / float16 without a mask or bias;
//   flash  our tiled kernels (cuda/flash_attention.cu): everything else up to a head dim of 128 (64 in float64) —
//          float32 / float64, a keep-mask, an additive bias, causal with T != S.
// The backward runs the engine that ran the forward: both decide the same way from the same inputs (with
// needs_backward, which is true whenever a backward follows).
#include <algorithm>

#include "core/error.h"
#include "core/format.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/cudnn_sdpa.h"
#include "cuda/flash_attention_launch.h"
#include "ops/kernels.h"

namespace asc::cuda {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

// Empty when cuDNN runs these inputs, else why not.
std::string cudnn_why(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep_mask, const Tensor& bias,
                      bool causal, bool needs_backward) {
  if (keep_mask.defined()) return "a keep_mask";
  if (bias.defined()) return "an additive bias";
  return cudnn_sdpa_unsupported(q, k, v, causal, needs_backward);
}

// Empty when the flash kernels run these inputs, else why not.
std::string flash_why(const Tensor& q) {
  const int64_t D = q.size(3), max_d = flash_launch::max_head_dim(float_elem_of(kOp, q.dtype()));
  if (D > max_d) return fmt::format("head dim {} (the flash kernel takes up to {} in {})", D, max_d, q.dtype());
  if (q.size(0) * q.size(1) > 65535)
    return fmt::format("{} heads (the flash kernel's grid takes 65535)", q.size(0) * q.size(1));
  return {};
}

flash_launch::View4 view_of(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}; }

flash_launch::Problem problem_of(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep_mask,
                                 const Tensor& bias, bool causal, double scale) {
  flash_launch::Problem p{q.size(0),    q.size(1),    q.size(2),  k.size(2),  q.size(3),  q.raw_data(),
                          k.raw_data(), v.raw_data(), view_of(q), view_of(k), view_of(v), nullptr,
                          {},           nullptr,      {},         causal,     scale};
  if (keep_mask.defined()) p.keep = keep_mask.data_ptr<bool>(), p.sm = view_of(keep_mask);
  if (bias.defined()) p.bias = bias.raw_data(), p.sb = view_of(bias);
  p.allow_tf32 = allow_tf32();
  return p;
}

DType acc_of(const Tensor& q) { return q.dtype() == kFloat64 ? kFloat64 : kFloat32; }  // the kernels' compute type

}  // namespace

void sdpa_unsupported(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep_mask, const Tensor& bias,
                      bool causal, bool needs_backward, std::string& why, std::string& engine) {
  const std::string no_cudnn = cudnn_why(q, k, v, keep_mask, bias, causal, needs_backward);
  if (no_cudnn.empty()) {
    why.clear(), engine = "cuDNN";
    return;
  }
  why = flash_why(q);
  flash_launch::Problem shape{};
  shape.D = q.size(3), shape.allow_tf32 = allow_tf32();
  if (why.empty())
    engine = flash_launch::mma_takes(shape, float_elem_of(kOp, q.dtype())) ? "CUDA flash kernel on tensor cores"
                                                                           : "CUDA flash kernel";
  else
    why = fmt::format("{}; cuDNN: {}", why, no_cudnn);
}

void sdpa_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep_mask, const Tensor& bias,
                  bool causal, bool needs_backward, double scale, Tensor& o, Tensor& stats) {
  if (cudnn_why(q, k, v, keep_mask, bias, causal, needs_backward).empty()) {
    cudnn_sdpa_forward(q, k, v, causal, scale, o, stats);
    return;
  }
  const std::string why = flash_why(q);
  ASC_CHECK(why.empty(), "{} (CUDA): the flash kernel cannot run q {}: {}", kOp, q.shape(), why);
  ASC_CUDA_CHECK(flash_launch::forward(problem_of(q, k, v, keep_mask, bias, causal, scale), o.raw_data(), view_of(o),
                                       stats.raw_data(), float_elem_of(kOp, q.dtype()), current_stream()));
}

void sdpa_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep_mask, const Tensor& bias,
                   const Tensor& o, const Tensor& dout, const Tensor& stats, bool causal, double scale, Tensor& dq,
                   Tensor& dk, Tensor& dv) {
  if (cudnn_why(q, k, v, keep_mask, bias, causal, true).empty()) {
    cudnn_sdpa_backward(q, k, v, o, dout, stats, causal, scale, dq, dk, dv);
    return;
  }
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2);
  const Tensor delta = Tensor::empty({B, H, T}, {acc_of(q), q.device(), false});
  ASC_CUDA_CHECK(flash_launch::backward(problem_of(q, k, v, keep_mask, bias, causal, scale), o.raw_data(), view_of(o),
                                        dout.raw_data(), view_of(dout), stats.raw_data(), delta.raw_data(),
                                        dq.raw_data(), dk.raw_data(), dv.raw_data(), float_elem_of(kOp, q.dtype()),
                                        current_stream()));
}

}  // namespace asc::cuda
