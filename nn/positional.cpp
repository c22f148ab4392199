#include "nn/positional.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/format.h"
#include "nn/init.h"
#include "ops/ops.h"

namespace asc::nn {

namespace {
Shape shape_of(const Tensor& x) { return x.defined() ? x.shape() : Shape{}; }
}  // namespace

// ---- sinusoidal / learned ------------------------------------------------------------------------------------------

Tensor sinusoidal_encoding(int64_t len, int64_t dim, int64_t offset, double base, DType dtype) {
  ASC_CHECK(len >= 0 && dim > 0 && offset >= 0,
            "sinusoidal_encoding: need len >= 0, dim > 0, offset >= 0; got {}, {}, {}", len, dim, offset);
  ASC_CHECK(base > 0, "sinusoidal_encoding: base must be positive, got {}", base);
  ASC_CHECK(is_floating(dtype), "sinusoidal_encoding: dtype must be floating, got {}", dtype);
  std::vector<double> pe(static_cast<size_t>(len * dim));
  for (int64_t t = 0; t < len; ++t) {
    const double pos = static_cast<double>(offset + t);
    for (int64_t c = 0; c < dim; c += 2) {
      const double angle = pos / std::pow(base, static_cast<double>(c) / static_cast<double>(dim));
      pe[t * dim + c] = std::sin(angle);
      if (c + 1 < dim) pe[t * dim + c + 1] = std::cos(angle);
    }
  }
  return tensor(pe, {len, dim}, {.dtype = dtype});
}

SinusoidalPositionalEncoding::SinusoidalPositionalEncoding(int64_t dim_, int64_t max_len_, double base_)
    : Module("SinusoidalPositionalEncoding"), dim(dim_), max_len(max_len_), base(base_) {
  ASC_CHECK(dim_ > 0 && max_len_ > 0, "SinusoidalPositionalEncoding: dim and max_len must be positive, got {} and {}",
            dim_, max_len_);
  // Kept in float64 (converted per call to the input dtype, a (T, dim) copy) so float64 models get exact tables.
  pe = register_buffer("pe", sinusoidal_encoding(max_len_, dim_, 0, base_, kFloat64), /*persistent=*/false);
}

Tensor SinusoidalPositionalEncoding::forward(const Tensor& x, int64_t offset) {
  ASC_CHECK(x.defined() && x.dim() >= 2 && x.size(-1) == dim,
            "SinusoidalPositionalEncoding: expected input (..., T, {}), got {}", dim, shape_of(x));
  ASC_CHECK(is_floating(x.dtype()), "SinusoidalPositionalEncoding: expected a floating input, got {}", x.dtype());
  const int64_t t = x.size(-2);
  ASC_CHECK(offset >= 0 && offset + t <= max_len, "SinusoidalPositionalEncoding: positions [{}, {}) exceed max_len {}",
            offset, offset + t, max_len);
  Tensor table = pe.narrow(0, offset, t);  // (T, dim)
  if (table.dtype() != x.dtype()) table = table.to(x.dtype());
  return x + table;
}

std::string SinusoidalPositionalEncoding::extra_repr() const {
  return fmt::format("dim={}, max_len={}, base={}", dim, max_len, base);
}

LearnedPositionalEmbedding::LearnedPositionalEmbedding(int64_t max_len_, int64_t dim_, double init_std_)
    : Module("LearnedPositionalEmbedding"), max_len(max_len_), dim(dim_), init_std(init_std_) {
  ASC_CHECK(dim_ > 0 && max_len_ > 0, "LearnedPositionalEmbedding: max_len and dim must be positive, got {} and {}",
            max_len_, dim_);
  ASC_CHECK(init_std_ >= 0, "LearnedPositionalEmbedding: init_std must be >= 0, got {}", init_std_);
  weight = register_parameter("weight", empty({max_len_, dim_}));
  reset_parameters();
}

void LearnedPositionalEmbedding::reset_parameters() { init::normal_(weight, 0.0, init_std); }

Tensor LearnedPositionalEmbedding::forward(const Tensor& x, int64_t offset) {
  ASC_CHECK(x.defined() && x.dim() >= 2 && x.size(-1) == dim,
            "LearnedPositionalEmbedding: expected input (..., T, {}), got {}", dim, shape_of(x));
  const int64_t t = x.size(-2);
  ASC_CHECK(offset >= 0 && offset + t <= max_len, "LearnedPositionalEmbedding: positions [{}, {}) exceed max_len {}",
            offset, offset + t, max_len);
  return x + weight.narrow(0, offset, t);
}

std::string LearnedPositionalEmbedding::extra_repr() const { return fmt::format("max_len={}, dim={}", max_len, dim); }

// ---- RoPE --------------------------------------------------------------------------------------------------------

std::pair<Tensor, Tensor> rope_cos_sin(int64_t len, int64_t head_dim, int64_t offset, double base, DType dtype) {
  ASC_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope: head_dim must be positive and even, got {}", head_dim);
  ASC_CHECK(len >= 0 && offset >= 0, "rope: need len >= 0 and offset >= 0, got {} and {}", len, offset);
  ASC_CHECK(base > 0, "rope: base must be positive, got {}", base);
  ASC_CHECK(is_floating(dtype), "rope: dtype must be floating, got {}", dtype);
  const int64_t m = head_dim / 2;
  std::vector<double> c(static_cast<size_t>(len * head_dim)), s(c.size());
  for (int64_t i = 0; i < m; ++i) {
    const double theta = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    for (int64_t t = 0; t < len; ++t) {
      const double a = static_cast<double>(offset + t) * theta;
      c[t * head_dim + i] = c[t * head_dim + m + i] = std::cos(a);
      s[t * head_dim + i] = s[t * head_dim + m + i] = std::sin(a);
    }
  }
  return {tensor(c, {len, head_dim}, {.dtype = dtype}), tensor(s, {len, head_dim}, {.dtype = dtype})};
}

Tensor apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  ASC_CHECK(x.defined() && x.dim() >= 2, "apply_rope: expected x (..., T, Dh), got {}", shape_of(x));
  ASC_CHECK(is_floating(x.dtype()), "apply_rope: expected a floating x, got {}", x.dtype());
  const int64_t t = x.size(-2), dh = x.size(-1);
  ASC_CHECK(dh % 2 == 0, "apply_rope: the head dim must be even, got x {}", x.shape());
  ASC_CHECK(cos.defined() && sin.defined() && cos.shape() == Shape({t, dh}) && sin.shape() == Shape({t, dh}),
            "apply_rope: cos and sin must be (T, Dh) = ({}, {}), got {} and {}", t, dh, shape_of(cos), shape_of(sin));
  const Tensor c = cos.dtype() == x.dtype() ? cos : cos.to(x.dtype());
  const Tensor s = sin.dtype() == x.dtype() ? sin : sin.to(x.dtype());
  const int last = x.dim() - 1;
  const int64_t m = dh / 2;
  // rotate_half(x) = (-x2, x1)
  Tensor rotated = cat({-x.narrow(last, m, m), x.narrow(last, 0, m)}, last);
  return x * c + rotated * s;
}

Tensor apply_rope(const Tensor& x, int64_t offset, double base) {
  ASC_CHECK(x.defined() && x.dim() >= 2, "apply_rope: expected x (..., T, Dh), got {}", shape_of(x));
  ASC_CHECK(is_floating(x.dtype()), "apply_rope: expected a floating x, got {}", x.dtype());
  ASC_CHECK(x.size(-1) % 2 == 0, "apply_rope: the head dim must be even, got x {}", x.shape());
  ASC_CHECK(offset >= 0, "apply_rope: offset must be >= 0, got {}", offset);
  auto [c, s] = rope_cos_sin(x.size(-2), x.size(-1), offset, base, x.dtype());
  if (x.device() != c.device()) {
    c = c.to(x.device());
    s = s.to(x.device());
  }
  return apply_rope(x, c, s);
}

RotaryEmbedding::RotaryEmbedding(int64_t head_dim_, int64_t max_len_, double base_)
    : Module("RotaryEmbedding"), head_dim(head_dim_), max_len(max_len_), base(base_) {
  ASC_CHECK(head_dim_ > 0 && head_dim_ % 2 == 0, "RotaryEmbedding: head_dim must be positive and even, got {}",
            head_dim_);
  ASC_CHECK(max_len_ > 0, "RotaryEmbedding: max_len must be positive, got {}", max_len_);
  // float64 caches, converted per call to the input dtype (a (T, Dh) copy): exact for float64 models too.
  auto [c, s] = rope_cos_sin(max_len_, head_dim_, 0, base_, kFloat64);
  cos_cache = register_buffer("cos", c, /*persistent=*/false);
  sin_cache = register_buffer("sin", s, /*persistent=*/false);
}

Tensor RotaryEmbedding::forward(const Tensor& x, int64_t offset) {
  ASC_CHECK(x.defined() && x.dim() >= 2 && x.size(-1) == head_dim, "RotaryEmbedding: expected x (..., T, {}), got {}",
            head_dim, shape_of(x));
  const int64_t t = x.size(-2);
  ASC_CHECK(offset >= 0 && offset + t <= max_len, "RotaryEmbedding: positions [{}, {}) exceed max_len {}", offset,
            offset + t, max_len);
  return apply_rope(x, cos_cache.narrow(0, offset, t), sin_cache.narrow(0, offset, t));
}

std::string RotaryEmbedding::extra_repr() const {
  return fmt::format("head_dim={}, max_len={}, base={}", head_dim, max_len, base);
}

// ---- ALiBi -------------------------------------------------------------------------------------------------------

std::vector<double> alibi_slopes(int64_t heads) {
  ASC_CHECK(heads > 0, "alibi_slopes: heads must be positive, got {}", heads);
  auto power_of_2 = [](int64_t n) {
    std::vector<double> s;
    for (int64_t h = 1; h <= n; ++h) s.push_back(std::exp2(-8.0 * static_cast<double>(h) / static_cast<double>(n)));
    return s;
  };
  int64_t p = 1;
  while (p * 2 <= heads) p *= 2;
  std::vector<double> s = power_of_2(p);
  if (p == heads) return s;
  // Closest lower power of two, then every other slope of twice that many heads (the ALiBi reference code).
  std::vector<double> extra = alibi_slopes(2 * p);
  for (size_t i = 0; static_cast<int64_t>(s.size()) < heads; i += 2) s.push_back(extra[i]);
  return s;
}

ALiBi::ALiBi(const ALiBiOptions& o) : Module("ALiBi"), options(o) {
  ASC_CHECK(o.heads() > 0, "ALiBi: heads must be positive, got {}", o.heads());
  std::vector<double> s = alibi_slopes(o.heads());
  slopes = register_buffer("slopes", tensor(s, {o.heads()}, {.dtype = kFloat32}), /*persistent=*/false);
}

Tensor ALiBi::bias(int64_t tq, int64_t tk, std::optional<int64_t> q_offset) const {
  ASC_CHECK(tq > 0 && tk > 0, "ALiBi.bias: tq and tk must be positive, got {} and {}", tq, tk);
  const int64_t off = q_offset.value_or(tk - tq);
  const int64_t h = options.heads();
  const std::vector<double> sl = slopes.to_vector<double>();
  std::vector<double> b(static_cast<size_t>(h * tq * tk));
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  for (int64_t hh = 0; hh < h; ++hh)
    for (int64_t i = 0; i < tq; ++i) {
      const int64_t qpos = i + off;
      for (int64_t j = 0; j < tk; ++j) {
        double& v = b[(hh * tq + i) * tk + j];
        if (options.causal())
          v = j > qpos ? kNegInf : -sl[hh] * static_cast<double>(qpos - j);
        else
          v = -sl[hh] * static_cast<double>(std::abs(qpos - j));
      }
    }
  return tensor(b, {h, tq, tk}, {.dtype = slopes.dtype(), .device = slopes.device()});
}

Tensor ALiBi::forward(const Tensor& scores) {
  ASC_CHECK(scores.defined() && scores.dim() >= 3 && scores.size(-3) == options.heads(),
            "ALiBi: expected scores (..., {}, Tq, Tk), got {}", options.heads(), shape_of(scores));
  ASC_CHECK(is_floating(scores.dtype()), "ALiBi: expected floating scores, got {}", scores.dtype());
  Tensor b = bias(scores.size(-2), scores.size(-1));
  if (b.dtype() != scores.dtype()) b = b.to(scores.dtype());
  return scores + b;
}

std::string ALiBi::extra_repr() const { return fmt::format("heads={}, causal={}", options.heads(), options.causal()); }

}  // namespace asc::nn
