#pragma once
// Positional information for sequence models: sinusoidal and learned absolute encodings (added to x), rotary
// embeddings (RoPE, applied to queries/keys) and ALiBi (an additive attention-score bias).
//
//   auto pe = std::make_shared<asc::nn::SinusoidalPositionalEncoding>(/*dim=*/64, /*max_len=*/512);
//   x = (*pe)(x);                                                      // (B, T, 64) + PE[0:T]
//   auto rope = std::make_shared<asc::nn::RotaryEmbedding>(/*head_dim=*/32, /*max_len=*/2048);
//   q = rope->forward(q, /*offset=*/past_len);  k = rope->forward(k, past_len);   // (B, H, T, 32)
//   auto alibi = std::make_shared<asc::nn::ALiBi>(asc::nn::ALiBiOptions(/*heads=*/6).causal(true));
//   asc::Tensor bias = alibi->bias(/*tq=*/T, /*tk=*/T);                // (6, T, T), added to q k^T / sqrt(d)
//
// RoPE uses the rotate-half (GPT-NeoX / LLaMA-HF) convention: with Dh = 2m, x = (x1, x2) halves of the last dim,
// theta_i = base^(-2i/Dh) and angle = pos * theta_i (i < m),
//   rope(x)[..., i]     = x1_i cos(angle) - x2_i sin(angle)
//   rope(x)[..., m + i] = x2_i cos(angle) + x1_i sin(angle)
// so that <rope(q, m), rope(k, n)> depends on m - n only.
#include <optional>
#include <vector>

#include "nn/module.h"

namespace asc::nn {

// ---- sinusoidal / learned absolute positions ---------------------------------------------------------------------

// (len, dim) table PE[pos, 2i] = sin(pos / base^(2i/dim)), PE[pos, 2i+1] = cos(pos / base^(2i/dim)), positions
// offset .. offset + len - 1 (an odd dim ends with a sin column). Computed in float64, returned in `dtype`.
Tensor sinusoidal_encoding(int64_t len, int64_t dim, int64_t offset = 0, double base = 10000.0, DType dtype = kFloat32);

// x + PE[offset : offset + T] for x (..., T, dim), in x's dtype. The table (max_len, dim) is a non-persistent
// float64 buffer "pe".
class SinusoidalPositionalEncoding : public Module {
 public:
  SinusoidalPositionalEncoding(int64_t dim, int64_t max_len = 4096, double base = 10000.0);
  Tensor forward(const Tensor& x) override { return forward(x, 0); }
  Tensor forward(const Tensor& x, int64_t offset);
  std::string extra_repr() const override;
  int64_t dim, max_len;
  double base;
  Tensor pe;  // (max_len, dim)
};

// x + weight[offset : offset + T] for x (..., T, dim); weight (max_len, dim) ~ N(0, init_std^2) (GPT-2: 0.02).
class LearnedPositionalEmbedding : public Module {
 public:
  LearnedPositionalEmbedding(int64_t max_len, int64_t dim, double init_std = 0.02);
  Tensor forward(const Tensor& x) override { return forward(x, 0); }
  Tensor forward(const Tensor& x, int64_t offset);
  std::string extra_repr() const override;
  void reset_parameters();
  int64_t max_len, dim;
  double init_std;
  Tensor weight;  // (max_len, dim)
};

// ---- RoPE --------------------------------------------------------------------------------------------------------

// cos / sin tables (len, Dh) for positions offset .. offset + len - 1, each half repeated (cat(c, c)), in float64
// arithmetic, returned in `dtype`.
std::pair<Tensor, Tensor> rope_cos_sin(int64_t len, int64_t head_dim, int64_t offset = 0, double base = 10000.0,
                                       DType dtype = kFloat32);
// x (..., T, Dh) (e.g. (B, H, T, Dh)), Dh even: rotates position t by angle (offset + t) * theta. Differentiable.
Tensor apply_rope(const Tensor& x, int64_t offset = 0, double base = 10000.0);
// The same with precomputed tables cos, sin (T, Dh) for x's T positions (converted to x's dtype when needed).
Tensor apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin);

// RoPE with cos/sin caches (max_len, head_dim) held as non-persistent float64 buffers "cos" and "sin" (so they move
// with to(device) and stay out of checkpoints); each call converts the T rows it uses to x's dtype.
class RotaryEmbedding : public Module {
 public:
  RotaryEmbedding(int64_t head_dim, int64_t max_len = 4096, double base = 10000.0);
  Tensor forward(const Tensor& x) override { return forward(x, 0); }
  // x (..., T, head_dim); positions offset .. offset + T - 1 must lie below max_len.
  Tensor forward(const Tensor& x, int64_t offset);
  std::string extra_repr() const override;
  int64_t head_dim, max_len;
  double base;
  Tensor cos_cache, sin_cache;  // (max_len, head_dim)
};

// ---- ALiBi -------------------------------------------------------------------------------------------------------

// The ALiBi head slopes (Press et al.): for H a power of two, slope_h = 2^(-8h/H), h = 1..H; otherwise the slopes
// of the closest lower power of two P followed by every other slope of 2P, up to H in total.
std::vector<double> alibi_slopes(int64_t heads);

struct ALiBiOptions {
  ALiBiOptions(int64_t heads) : heads_(heads) {}
  ASC_ARG(int64_t, heads);
  // false: bias -slope * |i - j| (bidirectional); true: -slope * (i - j) for j <= i and -inf for j > i.
  ASC_ARG(bool, causal) = false;
};

// Additive attention bias (H, Tq, Tk). Query row i sits at key position i + q_offset; q_offset defaults to
// Tk - Tq (the queries are the last Tq positions, as with a KV cache). Slopes are a non-persistent buffer.
class ALiBi : public Module {
 public:
  explicit ALiBi(const ALiBiOptions& options);
  Tensor bias(int64_t tq, int64_t tk, std::optional<int64_t> q_offset = std::nullopt) const;
  Tensor bias(int64_t t) const { return bias(t, t); }
  // scores (..., H, Tq, Tk) + bias(Tq, Tk) in the scores' dtype.
  Tensor forward(const Tensor& scores) override;
  std::string extra_repr() const override;
  ALiBiOptions options;
  Tensor slopes;  // (H); float32 until the module is converted with to(dtype)
};

}  // namespace asc::nn
