// The FLOP counter (models/flops.h; formulas in docs/flops.md).
#include "models/flops.h"

#include <algorithm>
#include <chrono>

#include "autograd/grad_mode.h"
#include "models/decoder_lm.h"
#include "models/firing_net.h"
#include "models/transformer_classifier.h"
#include "ops/flops.h"
#include "ops/ops.h"

namespace asc::models {

namespace {

double d(int64_t v) { return static_cast<double>(v); }

FlopCount block_flops(nn::TransformerEncoderBlock& block, int64_t T, bool causal) {
  FlopCount c = attention_flops(*block.attn, T, causal);
  c.forward += linear_flops(*block.linear1, T) + linear_flops(*block.linear2, T);
  return c;
}

}  // namespace

double linear_flops(const nn::Linear& layer, int64_t rows) {
  return flops::gemm(1, rows, layer.weight.size(0), layer.weight.size(1));
}

FlopCount attention_flops(nn::Attention& attention, int64_t T, bool causal) {
  ASC_CHECK(T >= 1, "attention_flops: T must be >= 1, got {}", T);
  FlopCount c;
  const double t = d(T);
  if (auto* mha = dynamic_cast<nn::MultiHeadAttention*>(&attention)) {
    c.forward = linear_flops(*mha->q_proj, T) + linear_flops(*mha->k_proj, T) + linear_flops(*mha->v_proj, T) +
                linear_flops(*mha->out_proj, T) + flops::attention(1, flops::dense_pairs(T, T), mha->options.d_model());
  } else if (auto* asc = dynamic_cast<nn::AscenderAttention*>(&attention)) {
    const double H = d(asc->options.heads());
    const auto mode = asc->options.mode();
    const double P = mode == nn::AscenderMode::Windowed
                         ? flops::windowed_pairs(T, asc->options.window(), asc->options.global_tokens())
                         : t * t;
    const double per_head = flops::ascender_head(P, asc->d_head, asc->d_z, asc->d_a, mode == nn::AscenderMode::Reuse);
    c.forward = linear_flops(*asc->q_proj, T) + linear_flops(*asc->k_proj, T) + linear_flops(*asc->v_proj, T) +
                linear_flops(*asc->out_proj, T) + linear_flops(*asc->z_proj, T) + linear_flops(*asc->e_proj, T) +
                H * per_head;
  } else if (auto* asam = dynamic_cast<nn::AsamAttention*>(&attention)) {
    const auto& o = asam->options;
    const double H = d(o.heads()), D = d(o.d_model()), dh = D / H;
    const auto& pats = o.patterns();
    const bool clustered = std::find(pats.begin(), pats.end(), "clustered") != pats.end();
    // Pairs per head of the fixed patterns (one shared pattern, or one per head: nnz over its groups).
    const SparsePattern pattern = asam->pattern(T, causal);
    double sparse = 4 * dh * d(pattern.nnz()) / std::max<double>(1, d(pattern.groups()));
    if (clustered) sparse += 4 * dh * t * t / d(o.clusters()) + 2 * t * d(o.clusters()) * dh;  // buckets + assignment
    double scales = 0;
    for (int64_t s : o.pool_scales()) scales += d(s);
    c.forward = linear_flops(*asam->q_proj, T) + linear_flops(*asam->k_proj, T) + linear_flops(*asam->v_proj, T) +
                linear_flops(*asam->out_proj, T) + H * sparse + t * D + 2 * scales * D * H;
    if (o.fixed_gate() != 1.0) c.forward += H * 4 * t * t * dh;  // the dense branch
  } else {
    ASC_THROW("attention_flops: no FLOP formula for attention type {}", attention.type_name());
  }
  c.attention = c.forward;
  return c;
}

FlopCount count_flops(nn::Module& model, int64_t T) {
  ASC_CHECK(T >= 1, "count_flops: T must be >= 1, got {}", T);
  FlopCount c;
  if (auto* m = dynamic_cast<TransformerClassifier*>(&model)) {
    for (auto& b : *m->blocks) c += block_flops(static_cast<nn::TransformerEncoderBlock&>(*b), T, false);
    c.forward += linear_flops(*m->head, 1);  // on the pooled vector
  } else if (auto* m = dynamic_cast<DecoderLM*>(&model)) {
    for (auto& b : *m->blocks) c += block_flops(static_cast<nn::TransformerEncoderBlock&>(*b), T, true);
    c.forward += 2.0 * d(T) * d(m->options.d_model()) * d(m->options.vocab());  // the head (tied or not)
  } else if (auto* m = dynamic_cast<FiringClassifier*>(&model)) {
    c += count_flops(*m->hidden, T);
    c += count_flops(*m->second, T);
    c.forward += linear_flops(*m->readout, 1);
  } else if (auto* m = dynamic_cast<nn::FiringLinear*>(&model)) {
    const auto& o = m->options;
    const double P = d(o.neurons()), in = d(o.in_features()), a = d(o.fan_out());
    // Dense: Z = x Wᵀ (2 d P); channels: neuron p reads its own channel (2 d P as well); then gate and messages.
    c.forward = 2 * in * P + P + P * a;
  } else if (auto* m = dynamic_cast<nn::Linear*>(&model)) {
    c.forward = linear_flops(*m, 1);
  } else if (auto* m = dynamic_cast<nn::Sequential*>(&model)) {  // and nn::MLP: its Linear layers
    for (size_t i = 0; i < m->size(); ++i) {
      nn::Module& child = *(*m)[i];
      const std::string& t = child.type_name();
      // Activations and dropout are element-wise over the width: left out (the conventions above).
      if (t == "ReLU" || t == "GELU" || t == "SiLU" || t == "Tanh" || t == "Sigmoid" || t == "Dropout") continue;
      c += count_flops(child, T);
    }
  } else {
    ASC_THROW("count_flops: no FLOP formula for module type {}", model.type_name());
  }
  return c;
}

double measured_gemm_peak(int64_t n) {
  ASC_CHECK(n >= 16 && n <= 8192, "measured_gemm_peak: n must be in [16, 8192], got {}", n);
  NoGradGuard no_grad;
  Generator gen(1);
  Tensor a = randn({n, n}, {}, &gen), b = randn({n, n}, {}, &gen);
  matmul(a, b);  // warm-up: threads started, caches filled
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    Tensor c = matmul(a, b);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * d(n) * d(n) * d(n) / best;
}

}  // namespace asc::models
