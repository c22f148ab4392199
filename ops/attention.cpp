// scaled_dot_product_attention: validate, then either the device's fused kernel (one dispatch for the forward, one
// graph node whose backward is the device's fused backward) or the composed ops, which autograd differentiates.
#include "ops/attention.h"

#include <atomic>
#include <cmath>
#include <optional>

#include "autograd/node.h"
#include "core/autocast.h"
#include "core/format.h"
#include "ops/cpu/gemm.h"
#include "ops/dispatch.h"
#include "ops/flops.h"
#include "ops/linalg.h"
#include "ops/ops.h"

namespace asc {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

std::atomic<SdpaBackend> g_sdpa_backend{SdpaBackend::Auto};

bool broadcasts_to(const Shape& s, const Shape& target) {
  if (s.size() > target.size()) return false;
  for (int i = 0; i < s.size(); ++i) {
    const int64_t a = s[s.size() - 1 - i], b = target[target.size() - 1 - i];
    if (a != b && a != 1) return false;
  }
  return true;
}

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& o) {
  ASC_CHECK(q.defined() && k.defined() && v.defined(), "{}: undefined q, k or v", kOp);
  ASC_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
            "{}: expected q, k, v of rank 4 (B, H, T, Dh), got {}, {}, {}", kOp, q.shape(), k.shape(), v.shape());
  ASC_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3) && k.shape() == v.shape(),
            "{}: incompatible q {}, k {}, v {}", kOp, q.shape(), k.shape(), v.shape());
  ASC_CHECK(q.dtype() == k.dtype() && k.dtype() == v.dtype(), "{}: q, k, v have dtypes {}, {}, {}", kOp, q.dtype(),
            k.dtype(), v.dtype());
  check_same_device(kOp, {&q, &k, &v, &o.keep_mask, &o.bias});
  const Shape scores{q.size(0), q.size(1), q.size(2), k.size(2)};
  if (o.keep_mask.defined())
    ASC_CHECK(o.keep_mask.dtype() == kBool && broadcasts_to(o.keep_mask.shape(), scores),
              "{}: keep_mask must be bool and broadcastable to the scores {}, got {} {}", kOp, scores,
              o.keep_mask.dtype(), o.keep_mask.shape());
  if (o.bias.defined())
    ASC_CHECK(is_floating(o.bias.dtype()) && broadcasts_to(o.bias.shape(), scores),
              "{}: bias must be floating and broadcastable to the scores {}, got {} {}", kOp, scores, o.bias.dtype(),
              o.bias.shape());
  ASC_CHECK(o.dropout >= 0 && o.dropout < 1, "{}: dropout {} not in [0, 1)", kOp, o.dropout);
}

// The mask and bias as the kernels read them: (B, H, T, S) views (stride 0 on broadcast dims), bias in q's dtype.
struct KernelMasks {
  Tensor keep, bias;
};
KernelMasks kernel_masks(const Tensor& q, const Tensor& k, const SdpaOptions& o) {
  const Shape scores{q.size(0), q.size(1), q.size(2), k.size(2)};
  KernelMasks m;
  if (o.keep_mask.defined()) m.keep = o.keep_mask.expand(scores);
  if (o.bias.defined()) m.bias = (o.bias.dtype() == q.dtype() ? o.bias : o.bias.to(q.dtype())).detach().expand(scores);
  return m;
}

// Empty when the device's fused kernel runs these inputs, else why not: the op's own reasons first, then the
// kernel's (dtype, shapes, strides, a cuDNN without an engine for them, ...). `engine`: which kernels run them.
std::string fused_unsupported(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& o,
                              std::string* engine = nullptr) {
  if (o.training && o.dropout > 0) return "dropout";
  if (o.weights) return "the probabilities were requested";
  if (o.bias.defined() && autograd::needs_grad(o.bias)) return "a bias that needs a gradient";
  if (!is_floating(q.dtype())) return fmt::format("dtype {}", q.dtype());
  const KernelMasks m = kernel_masks(q, k, o);
  std::string why, name;
  ASC_KERNEL(q.device(), kOp, sdpa_unsupported, q, k, v, m.keep, m.bias, o.causal, autograd::needs_grad({&q, &k, &v}),
             why, name);
  if (engine) *engine = name;
  return why;
}

// Under CpuAutocast, float32 CPU attention multiplies in bfloat16 (float32 sums), as torch.autocast("cpu") runs
// scaled_dot_product_attention: the fused kernel's products (ops/cpu/attention_bf16.cpp), or the composed path's two
// products by matmul_bf16. Softmax and everything between the products stay float32.
bool autocast_bf16(const Tensor& q) { return cpu_autocast_enabled() && q.device().is_cpu() && q.dtype() == kFloat32; }

// The composed path: explicit scores, masked softmax, and the product with v.
Tensor sdpa_math(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& o) {
  const int64_t T = q.size(2), S = k.size(2);
  Tensor keep = o.keep_mask;
  if (o.causal) {
    Tensor causal = causal_keep_mask(T, S, q.device()).view({1, 1, T, S});
    keep = keep.defined() ? logical_and(keep, causal) : causal;
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  const bool bf16 = autocast_bf16(q);
  const auto product = [bf16](const Tensor& a, const Tensor& b) { return bf16 ? matmul_bf16(a, b) : matmul(a, b); };
  Tensor scores = product(q, k.transpose(-2, -1)) * scale;  // (B, H, T, S)
  if (o.bias.defined()) scores = scores + o.bias;
  Tensor probs = softmax(scores, -1, keep);  // masked entries 0; fully masked rows all 0
  if (o.weights) *o.weights = probs.detach();
  if (o.training && o.dropout > 0) probs = asc::dropout(probs, o.dropout, true);
  return product(probs, v);  // (B, H, T, Dh)
}

// The fused path: the device's forward kernel; its backward (recorded when q, k or v needs a gradient) recomputes
// the probabilities from the saved log-sum-exp.
Tensor sdpa_fused(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& opts) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  const KernelMasks m = kernel_masks(q, k, opts);
  const bool causal = opts.causal;
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  // o (B, H, T, D) stored heads-last, (B, T, H, D), the layout the kernels write and the output projection reads;
  // stats (B, H, T, 1), the rows' log-sum-exp in the kernels' compute type (float32 for 16-bit inputs)
  Tensor o = Tensor::empty({B, T, H, D}, q.options()).permute({0, 2, 1, 3});
  Tensor stats = Tensor::empty({B, H, T, 1}, {accumulate_dtype(q.dtype()), q.device()});
  const bool needs_backward = autograd::needs_grad({&q, &k, &v});
  // Under CpuAutocast the CPU kernels multiply in bfloat16 (the scope tells them; the backward too, whenever it runs).
  // The profiler shows those kernels under their own name.
  const bool bf16 = autocast_bf16(q);
  const char* event = bf16 ? "scaled_dot_product_attention_bf16" : kOp;
  std::optional<cpu::Bf16ProductsScope> bf16_scope;
  if (bf16) bf16_scope.emplace();
  // FLOPs over the pairs causality keeps (the kernels skip the others); a keep mask's holes are counted
  const double pairs = causal ? flops::causal_pairs(T, k.size(2)) : flops::dense_pairs(T, k.size(2));
  ASC_KERNEL_COUNTED(q.device(), event, flops::attention(B * H, pairs, D), sdpa_forward, q, k, v, m.keep, m.bias,
                     causal, needs_backward, scale, o, stats);
  if (needs_backward) {
    autograd::record(kOp, {q, k, v}, {o},
                     [qs = autograd::SavedTensor(q, kOp), ks = autograd::SavedTensor(k, kOp),
                      vs = autograd::SavedTensor(v, kOp), os = autograd::SavedTensor(o, kOp), stats, m, causal, scale,
                      bf16, event, fwd_flops = flops::attention(B * H, pairs, D)](const TensorList& g) -> TensorList {
                       const Tensor q = qs.get(), k = ks.get(), v = vs.get();
                       Tensor dq = Tensor::empty(q.shape(), q.options()), dk = Tensor::empty(k.shape(), q.options()),
                              dv = Tensor::empty(v.shape(), q.options());  // the kernels write every element
                       std::optional<cpu::Bf16ProductsScope> bf16_scope;
                       if (bf16) bf16_scope.emplace();
                       ASC_KERNEL_COUNTED(g[0].device(), event, 2 * fwd_flops, sdpa_backward, q, k, v, m.keep, m.bias,
                                          os.get(), g[0], stats, causal, scale, dq, dk, dv);
                       return {dq, dk, dv};
                     });
  }
  return o;
}

}  // namespace

Tensor causal_keep_mask(int64_t t_q, int64_t s_k, Device device) {
  // Query t sits at absolute position t + (S - T), so with S == T this is the usual lower triangle.
  Tensor qpos = arange(0, static_cast<double>(t_q), 1.0, {.dtype = kInt64, .device = device}).view({t_q, 1});
  Tensor kpos = arange(0, static_cast<double>(s_k), 1.0, {.dtype = kInt64, .device = device}).view({1, s_k});
  return le(kpos, qpos + static_cast<double>(s_k - t_q));  // (T, S)
}

void set_sdpa_backend(SdpaBackend backend) { g_sdpa_backend = backend; }
SdpaBackend sdpa_backend() { return g_sdpa_backend; }

std::string sdpa_choice(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& options) {
  check_inputs(q, k, v, options);
  if (sdpa_backend() == SdpaBackend::Math) return "math: the Math backend is selected";
  std::string engine;
  const std::string why = fused_unsupported(q, k, v, options, &engine);
  if (why.empty() && autocast_bf16(q)) engine += ", bfloat16 products";
  return why.empty() ? "fused (" + engine + ")" : "math: " + why;
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& o) {
  check_inputs(q, k, v, o);
  const SdpaBackend backend = sdpa_backend();
  if (backend != SdpaBackend::Math) {
    const std::string why = fused_unsupported(q, k, v, o);
    if (why.empty()) return sdpa_fused(q, k, v, o);
    ASC_CHECK(backend == SdpaBackend::Auto, "{}: the Fused backend cannot run q {} {} k {} v {}: {}", kOp, q.shape(),
              q.dtype(), k.shape(), v.shape(), why);
  }
  return sdpa_math(q, k, v, o);
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keep_mask,
                                    const Tensor& bias, double dropout_p, bool training, Tensor* weights) {
  return scaled_dot_product_attention(
      q, k, v,
      SdpaOptions{
          .keep_mask = keep_mask, .bias = bias, .dropout = dropout_p, .training = training, .weights = weights});
}

}  // namespace asc
