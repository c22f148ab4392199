#pragma once
// Per-element math of the elementwise ops, written once for every backend: each functor has the forward value
// and, for differentiable unary ops, the derivative dy/dx given x and y. CUDA kernels include this header too
// (ASC_HD expands to __host__ __device__ there).
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define ASC_HD __host__ __device__ __forceinline__
#define ASC_HD_FORCE ASC_HD
#else
#define ASC_HD inline
// Forced inline on the host: the CPU kernels call these from loops compiled for several instruction sets
// (ops/cpu/vec_math.h, ASC_CPU_DISPATCH) or inside a no-trapping-math region, and a call left out of line would run
// the baseline code, one element at a time.
#define ASC_HD_FORCE [[gnu::always_inline]] inline
#endif

namespace asc::math {

enum class Unary : uint8_t {
  Neg,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Abs,
  Relu,
  Gelu,
  GeluTanh,
  Silu,
  Sigmoid,
  Tanh,
  Softplus,
  Clamp,
  AddScalar,
  MulScalar,
  RSubScalar,
  RDivScalar,
  PowScalar,
};

// Parameters of a unary op: scalar operand (a), bounds (lo/hi), softplus beta/threshold (a/b).
struct UnaryParams {
  double a = 0, b = 0, lo = -INFINITY, hi = INFINITY;
};

template <class T>
ASC_HD T sigmoid(T x) {
  return x >= T(0) ? T(1) / (T(1) + std::exp(-x)) : std::exp(x) / (T(1) + std::exp(x));
}

// What the derivative of each unary op reads, so autograd saves only that.
constexpr bool unary_grad_uses_x(Unary u) {
  switch (u) {
    case Unary::Neg:
    case Unary::AddScalar:
    case Unary::MulScalar:
    case Unary::RSubScalar:
    case Unary::Exp:
    case Unary::Sqrt:
    case Unary::Rsqrt:
    case Unary::Sigmoid:
    case Unary::Tanh: return false;
    default: return true;
  }
}
constexpr bool unary_grad_uses_y(Unary u) {
  switch (u) {
    case Unary::Exp:
    case Unary::Sqrt:
    case Unary::Rsqrt:
    case Unary::Sigmoid:
    case Unary::Tanh:
    case Unary::RDivScalar: return true;
    default: return false;
  }
}

// Forward value of unary op U.
template <Unary U, class T>
ASC_HD_FORCE T unary_fwd(T x, const UnaryParams& p) {
  constexpr T kInvSqrt2 = T(0.70710678118654752440), kInvSqrt2Pi = T(0.39894228040143267794);
  constexpr T kSqrt2OverPi = T(0.79788456080286535588), kC = T(0.044715);
  (void)kInvSqrt2Pi;
  if constexpr (U == Unary::Neg)
    return -x;
  else if constexpr (U == Unary::Exp)
    return std::exp(x);
  else if constexpr (U == Unary::Log)
    return std::log(x);
  else if constexpr (U == Unary::Sqrt)
    return std::sqrt(x);
  else if constexpr (U == Unary::Rsqrt)
    return T(1) / std::sqrt(x);
  else if constexpr (U == Unary::Abs)
    return std::abs(x);
  // !(x <= 0) rather than x > 0: NaN passes through, as in PyTorch (relu(NaN) = NaN).
  else if constexpr (U == Unary::Relu)
    return !(x <= T(0)) ? x : T(0);
  else if constexpr (U == Unary::Gelu)
    return T(0.5) * x * (T(1) + std::erf(x * kInvSqrt2));
  else if constexpr (U == Unary::GeluTanh)
    return T(0.5) * x * (T(1) + std::tanh(kSqrt2OverPi * (x + kC * x * x * x)));
  else if constexpr (U == Unary::Silu)
    return x * sigmoid(x);
  else if constexpr (U == Unary::Sigmoid)
    return sigmoid(x);
  else if constexpr (U == Unary::Tanh)
    return std::tanh(x);
  else if constexpr (U == Unary::Softplus) {
    T bx = T(p.a) * x;
    return bx > T(p.b) ? x : std::log1p(std::exp(bx)) / T(p.a);
  } else if constexpr (U == Unary::Clamp)
    return x < T(p.lo) ? T(p.lo) : (x > T(p.hi) ? T(p.hi) : x);
  else if constexpr (U == Unary::AddScalar)
    return x + T(p.a);
  else if constexpr (U == Unary::MulScalar)
    return x * T(p.a);
  else if constexpr (U == Unary::RSubScalar)
    return T(p.a) - x;
  else if constexpr (U == Unary::RDivScalar)
    return T(p.a) / x;
  else if constexpr (U == Unary::PowScalar)
    return p.a == 2 ? x * x : std::pow(x, T(p.a));  // a square (distances, k-means losses): exact, no libm call
}

// Derivative dy/dx of unary op U at x (with y = forward value).
template <Unary U, class T>
ASC_HD_FORCE T unary_grad(T x, T y, const UnaryParams& p) {
  constexpr T kInvSqrt2 = T(0.70710678118654752440), kInvSqrt2Pi = T(0.39894228040143267794);
  constexpr T kSqrt2OverPi = T(0.79788456080286535588), kC = T(0.044715);
  if constexpr (U == Unary::Neg)
    return T(-1);
  else if constexpr (U == Unary::Exp)
    return y;
  else if constexpr (U == Unary::Log)
    return T(1) / x;
  else if constexpr (U == Unary::Sqrt)
    return T(0.5) / y;
  else if constexpr (U == Unary::Rsqrt)
    return T(-0.5) * y * y * y;
  else if constexpr (U == Unary::Abs)
    return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0));
  // PyTorch passes the gradient where relu(x) is not <= 0, NaN included (threshold_backward).
  else if constexpr (U == Unary::Relu)
    return !(x <= T(0)) ? T(1) : T(0);
  else if constexpr (U == Unary::Gelu)
    return T(0.5) * (T(1) + std::erf(x * kInvSqrt2)) + x * kInvSqrt2Pi * std::exp(T(-0.5) * x * x);
  else if constexpr (U == Unary::GeluTanh) {
    T u = kSqrt2OverPi * (x + kC * x * x * x), t = std::tanh(u);
    return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * kSqrt2OverPi * (T(1) + T(3) * kC * x * x);
  } else if constexpr (U == Unary::Silu) {
    T s = sigmoid(x);
    return s * (T(1) + x * (T(1) - s));
  } else if constexpr (U == Unary::Sigmoid)
    return y * (T(1) - y);
  else if constexpr (U == Unary::Tanh)
    return T(1) - y * y;
  else if constexpr (U == Unary::Softplus) {
    T bx = T(p.a) * x;
    return bx > T(p.b) ? T(1) : sigmoid(bx);
  } else if constexpr (U == Unary::Clamp)
    return (x >= T(p.lo) && x <= T(p.hi)) ? T(1) : T(0);
  else if constexpr (U == Unary::AddScalar)
    return T(1);
  else if constexpr (U == Unary::MulScalar)
    return T(p.a);
  else if constexpr (U == Unary::RSubScalar)
    return T(-1);
  else if constexpr (U == Unary::RDivScalar)
    return -y / x;
  else if constexpr (U == Unary::PowScalar)
    return p.a == 2 ? T(2) * x : T(p.a) * std::pow(x, T(p.a) - T(1));
}

enum class Binary : uint8_t { Add, Sub, Mul, Div, Pow, Max, Min, Eq, Ne, Lt, Le, Gt, Ge, And, Or };

template <Binary B, class T>
ASC_HD_FORCE auto binary_fwd(T a, T b) {
  if constexpr (B == Binary::Add)
    return a + b;
  else if constexpr (B == Binary::Sub)
    return a - b;
  else if constexpr (B == Binary::Mul)
    return a * b;
  else if constexpr (B == Binary::Div)
    return a / b;
  else if constexpr (B == Binary::Pow)
    return static_cast<T>(std::pow(a, b));
  // NaN in either operand gives NaN (PyTorch's maximum / minimum); a != a is false for integers.
  else if constexpr (B == Binary::Max)
    return (a > b || a != a) ? a : b;
  else if constexpr (B == Binary::Min)
    return (a < b || a != a) ? a : b;
  else if constexpr (B == Binary::Eq)
    return a == b;
  else if constexpr (B == Binary::Ne)
    return a != b;
  else if constexpr (B == Binary::Lt)
    return a < b;
  else if constexpr (B == Binary::Le)
    return a <= b;
  else if constexpr (B == Binary::Gt)
    return a > b;
  else if constexpr (B == Binary::Ge)
    return a >= b;
  else if constexpr (B == Binary::And)
    return static_cast<bool>(a) && static_cast<bool>(b);
  else if constexpr (B == Binary::Or)
    return static_cast<bool>(a) || static_cast<bool>(b);
}

constexpr bool is_comparison(Binary b) { return b >= Binary::Eq; }

// ---- surrogate derivatives of the hard gate F = 1[u >= 0] (ops/geometry.h) --------------------------------------
// The built-in entries of the surrogate registry, each integrating to 1 over u, in float64. The registry's host
// functions and the CUDA kernel both evaluate this one definition.
enum class SurrogateKind : uint8_t { Sigmoid, Rectangular, Triangular, Atan };

// One built-in derivative s'(u) of width w. `exp_nonpos(x)` is e^x for x <= 0: std::exp below; the CPU firing kernel
// passes its vectorisable one and calls this from its loops (forced inline on the host so that it compiles inside
// that kernel's no-trapping-math region, where its selects become branch-free).
template <SurrogateKind K, class Exp>
ASC_HD_FORCE double surrogate_derivative_of(double u, double w, Exp exp_nonpos) {
  if constexpr (K == SurrogateKind::Sigmoid) {  // w σ(wu)(1 - σ(wu)) = w e^{-|wu|} / (1 + e^{-|wu|})^2, stable
    const double e = exp_nonpos(-__builtin_fabs(w * u));
    return w * e / ((1.0 + e) * (1.0 + e));
  } else if constexpr (K == SurrogateKind::Rectangular) {
    return __builtin_fabs(u) < w / 2 ? 1.0 / w : 0.0;
  } else if constexpr (K == SurrogateKind::Triangular) {
    const double t = 1.0 - __builtin_fabs(u) / w;
    return (t > 0.0 ? t : 0.0) / w;
  } else {  // Atan
    const double t = 3.14159265358979323846 / 2 * w * u;
    return w / (2.0 * (1.0 + t * t));
  }
}

ASC_HD double surrogate_derivative(SurrogateKind kind, double u, double w) {
  const auto ex = [](double x) { return std::exp(x); };
  switch (kind) {
    case SurrogateKind::Sigmoid: return surrogate_derivative_of<SurrogateKind::Sigmoid>(u, w, ex);
    case SurrogateKind::Rectangular: return surrogate_derivative_of<SurrogateKind::Rectangular>(u, w, ex);
    case SurrogateKind::Triangular: return surrogate_derivative_of<SurrogateKind::Triangular>(u, w, ex);
    case SurrogateKind::Atan: return surrogate_derivative_of<SurrogateKind::Atan>(u, w, ex);
  }
  return 0.0;
}

}  // namespace asc::math
