// The float32 rows of the transcendental unary ops (ops/cpu/unary_rows.h). A file of their own: the row loops'
// selects vectorise only inside a no-trapping-math region, and ASC_CPU_DISPATCH's functions take their options from
// the region ops/cpu/vec_math.h is first included in, which in ops/cpu/elementwise.cpp is outside one (its generic
// rows call std:: functions that would not inline into the region).
#include "ops/cpu/unary_rows.h"

#include "ops/cpu/vec_region_begin.h"  // the row loops' region, closed by vec_region_end.h at the end

#include "ops/cpu/vec_math.h"  // inside the region: exp_full, log_full, tanh_full, sigmoid_full, gelu, ASC_CPU_DISPATCH

namespace asc::cpu {
namespace {

using math::Unary;

// Forward of U in float32: ops/math.h's unary_fwd, two of them rewritten where float32 would cancel or overflow —
// GELU-tanh as x σ(2u) (= x (1 + tanh u) / 2) and softplus as max(z, 0) + log(1 + e^{-|z|}) (= log(1 + e^z), z = βx).
template <Unary U>
ASC_ALWAYS_INLINE float vec_fwd(float x, float a, float b) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f, kC = 0.044715f;
  if constexpr (U == Unary::Exp)
    return exp_full(x);
  else if constexpr (U == Unary::Log)
    return log_full(x);
  else if constexpr (U == Unary::Gelu)
    return gelu(x);
  else if constexpr (U == Unary::GeluTanh)  // (1 + tanh u) / 2 = σ(2u): no cancellation in the left tail
    return x * sigmoid_full(2.0f * kSqrt2OverPi * (x + kC * x * x * x));
  else if constexpr (U == Unary::Silu)
    return x * sigmoid_full(x);
  else if constexpr (U == Unary::Sigmoid)
    return sigmoid_full(x);
  else if constexpr (U == Unary::Tanh)
    return tanh_full(x);
  else {  // Softplus: β = a, threshold = b
    const float z = a * x;
    const float soft = ((z > 0.0f ? z : 0.0f) + log1p_nonneg(exp_full(z < 0.0f ? z : -z))) / a;
    return z > b ? x : soft;
  }
}
// Derivative dy/dx of U in float32, given x and y = vec_fwd(x).
template <Unary U>
ASC_ALWAYS_INLINE float vec_grad(float x, float y, float a, float b) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f, kC = 0.044715f;
  if constexpr (U == Unary::Exp)
    return y;
  else if constexpr (U == Unary::Log)
    return 1.0f / x;
  else if constexpr (U == Unary::Gelu)
    return gelu_grad(x);
  else if constexpr (U == Unary::GeluTanh) {  // s = σ(2u) = (1 + tanh u) / 2, so (1 - tanh² u) / 2 = 2 s (1 - s)
    float slope;
    const float s = sigmoid_slope(2.0f * kSqrt2OverPi * (x + kC * x * x * x), slope);
    return s + 2.0f * x * slope * kSqrt2OverPi * (1.0f + 3.0f * kC * x * x);
  } else if constexpr (U == Unary::Silu) {  // s (1 + x (1 - s)) = s + x s (1 - s)
    float slope;
    const float s = sigmoid_slope(x, slope);
    return s + x * slope;
  } else if constexpr (U == Unary::Sigmoid)
    return y * (1.0f - y);
  else if constexpr (U == Unary::Tanh)
    return 1.0f - y * y;
  else {  // Softplus
    const float z = a * x;
    return z > b ? 1.0f : sigmoid_full(z);
  }
}

template <Unary U>
ASC_ALWAYS_INLINE void rows(const float* x, float* y, int64_t n, float a, float b) {
  ASC_SIMD
  for (int64_t i = 0; i < n; ++i) y[i] = vec_fwd<U>(x[i], a, b);
}
template <Unary U>
ASC_ALWAYS_INLINE void backward_rows(const float* g, const float* x, const float* y, float* gx, int64_t n, float a,
                                     float b) {
  ASC_SIMD
  for (int64_t i = 0; i < n; ++i) gx[i] = g[i] * vec_grad<U>(x[i], y[i], a, b);
}
// The same values on strided operands (a transposed view gets the numbers a contiguous copy would: the same level,
// so the same FMA contractions).
template <Unary U>
ASC_ALWAYS_INLINE void strided(const float* x, int64_t sx, float* y, int64_t sy, int64_t n, float a, float b) {
  for (int64_t i = 0; i < n; ++i) y[i * sy] = vec_fwd<U>(x[i * sx], a, b);
}
template <Unary U>
ASC_ALWAYS_INLINE void backward_strided(const float* g, int64_t sg, const float* x, int64_t sx, const float* y,
                                        int64_t sy, float* gx, int64_t sgx, int64_t n, float a, float b) {
  for (int64_t i = 0; i < n; ++i) gx[i * sgx] = g[i * sg] * vec_grad<U>(x[i * sx], y[i * sy], a, b);
}

// Calls f.template operator()<U>() with U the compile-time value of op (one of vec_unary_float's).
template <class F>
void visit(Unary op, F&& f) {
  switch (op) {
    case Unary::Exp: return f.template operator()<Unary::Exp>();
    case Unary::Log: return f.template operator()<Unary::Log>();
    case Unary::Gelu: return f.template operator()<Unary::Gelu>();
    case Unary::GeluTanh: return f.template operator()<Unary::GeluTanh>();
    case Unary::Silu: return f.template operator()<Unary::Silu>();
    case Unary::Sigmoid: return f.template operator()<Unary::Sigmoid>();
    case Unary::Tanh: return f.template operator()<Unary::Tanh>();
    case Unary::Softplus: return f.template operator()<Unary::Softplus>();
    default: __builtin_unreachable();  // callers ask vec_unary_float first
  }
}

// The feed-forward activation (bias_act_dropout): relu as ops/math.h has it (NaN passes), the others vec_fwd's.
template <Unary U>
ASC_ALWAYS_INLINE float act_fwd(float z) {
  if constexpr (U == Unary::Relu)
    return !(z <= 0.0f) ? z : 0.0f;
  else
    return vec_fwd<U>(z, 0.0f, 0.0f);
}
template <Unary U>
ASC_ALWAYS_INLINE float act_grad(float z) {  // none of the four reads its output
  if constexpr (U == Unary::Relu)
    return !(z <= 0.0f) ? 1.0f : 0.0f;
  else
    return vec_grad<U>(z, 0.0f, 0.0f, 0.0f);
}
// y = act(x + b) · m with m = (u >= p ? scale : 0), the operations of add, the activation and dropout in their
// order, so the bits are theirs; with kSlope also slope = act'(x + b), the activation's backward factor (GELU's
// Φ(z) is shared by both). kBias / kDrop: whether b and u are given.
template <Unary U, bool kBias, bool kDrop, bool kSlope>
ASC_ALWAYS_INLINE void bias_act_rows(const float* x, const float* b, const float* u, float p, float scale, float* y,
                                     bool* keep, float* slope, int64_t n) {
  ASC_SIMD
  for (int64_t i = 0; i < n; ++i) {
    const float z = kBias ? x[i] + b[i] : x[i];
    const float a = act_fwd<U>(z);
    if constexpr (kSlope) slope[i] = act_grad<U>(z);
    if constexpr (kDrop) {
      const bool k = u[i] >= p;
      keep[i] = k;
      y[i] = a * (k ? scale : 0.0f);
    } else {
      y[i] = a;
    }
  }
}
// gx = (g · m) · slope: dropout's backward (a product by its mask), then the activation's.
template <bool kDrop>
ASC_ALWAYS_INLINE void bias_act_backward_rows(const float* g, const float* slope, const bool* keep, float scale,
                                              float* gx, int64_t n) {
  const auto* k8 = reinterpret_cast<const uint8_t*>(keep);  // GCC 12 does not vectorise loads of bool
  ASC_SIMD
  for (int64_t i = 0; i < n; ++i) {
    const float gi = kDrop ? g[i] * (k8[i] != 0 ? scale : 0.0f) : g[i];
    gx[i] = gi * slope[i];
  }
}
// Calls f.template operator()<U, kBias, kDrop, kSlope>() for op one of the feed-forward activations.
template <class F>
void visit_act(Unary op, bool bias, bool drop, bool slope, F&& f) {
  visit_ffn_activation(op, [&]<Unary U>() {
    auto with = [&]<bool kBias>() {
      if (drop)
        slope ? f.template operator()<U, kBias, true, true>() : f.template operator()<U, kBias, true, false>();
      else
        slope ? f.template operator()<U, kBias, false, true>() : f.template operator()<U, kBias, false, false>();
    };
    bias ? with.template operator()<true>() : with.template operator()<false>();
  });
}

}  // namespace

void vec_unary_rows(Unary op, const float* x, int64_t sx, float* y, int64_t sy, int64_t n, float a, float b) {
  visit(op, [&]<Unary U>() {
    if (sx == 1 && sy == 1)
      ASC_CPU_DISPATCH(rows<U>(x, y, n, a, b));
    else
      ASC_CPU_DISPATCH(strided<U>(x, sx, y, sy, n, a, b));
  });
}

void vec_unary_backward_rows(Unary op, const float* g, int64_t sg, const float* x, int64_t sx, const float* y,
                             int64_t sy, float* gx, int64_t sgx, int64_t n, float a, float b) {
  visit(op, [&]<Unary U>() {
    if (sg == 1 && sx == 1 && sy == 1 && sgx == 1)
      ASC_CPU_DISPATCH(backward_rows<U>(g, x, y, gx, n, a, b));
    else
      ASC_CPU_DISPATCH(backward_strided<U>(g, sg, x, sx, y, sy, gx, sgx, n, a, b));
  });
}

void vec_bias_act_rows(Unary act, const float* x, const float* b, const float* u, float p, float scale, float* y,
                       bool* keep, float* slope, int64_t n) {
  visit_act(act, b != nullptr, u != nullptr, slope != nullptr, [&]<Unary U, bool kBias, bool kDrop, bool kSlope>() {
    ASC_CPU_DISPATCH(bias_act_rows<U, kBias, kDrop, kSlope>(x, b, u, p, scale, y, keep, slope, n));
  });
}

void vec_bias_act_backward_rows(const float* g, const float* slope, const bool* keep, float scale, float* gx,
                                int64_t n) {
  if (keep)
    ASC_CPU_DISPATCH(bias_act_backward_rows<true>(g, slope, keep, scale, gx, n));
  else
    ASC_CPU_DISPATCH(bias_act_backward_rows<false>(g, slope, keep, scale, gx, n));
}

}  // namespace asc::cpu

#include "ops/cpu/vec_region_end.h"
