#pragma once
// Vectorisable float math for the CPU row kernels (softmax, cross-entropy, fused attention): a branch-free exp for
// arguments <= 0 and OpenMP simd reductions. Include it, and write the loops that call it, inside a
// `#pragma GCC optimize("no-trapping-math")` region as ops/cpu/nn.cpp does: GCC neither if-converts "trapping"
// float selects nor inlines functions compiled with other options, and either would keep those loops scalar.
#include <cstdint>

#include "core/cpu_isa.h"

#ifdef ASC_HAVE_OPENMP
#define ASC_CPU_PRAGMA_(x) _Pragma(#x)
// A loop without a reduction whose body GCC would not vectorise on its own (a select around a call, say)
#define ASC_SIMD ASC_CPU_PRAGMA_(omp simd)
#define ASC_SIMD_REDUCE(OP, VAR) ASC_CPU_PRAGMA_(omp simd reduction(OP : VAR))
#define ASC_SIMD_REDUCE2(OP, V1, V2) ASC_CPU_PRAGMA_(omp simd reduction(OP : V1, V2))
// Two sums and a max in one loop: reduction(+ : A, B) reduction(max : C)
#define ASC_SIMD_REDUCE3(OP, V1, V2, OP3, V3) ASC_CPU_PRAGMA_(omp simd reduction(OP : V1, V2) reduction(OP3 : V3))
// A max and any number of sums in one loop: reduction(max : M) reduction(+ : ...)
#define ASC_SIMD_SUMS_MAX(M, ...) ASC_CPU_PRAGMA_(omp simd reduction(max : M) reduction(+ : __VA_ARGS__))
#define ASC_SIMD_SUMS_MIN(M, ...) ASC_CPU_PRAGMA_(omp simd reduction(min : M) reduction(+ : __VA_ARGS__))
#else
#define ASC_SIMD
#define ASC_SIMD_REDUCE(OP, VAR)
#define ASC_SIMD_REDUCE2(OP, V1, V2)
#define ASC_SIMD_REDUCE3(OP, V1, V2, OP3, V3)
#define ASC_SIMD_SUMS_MAX(M, ...)
#define ASC_SIMD_SUMS_MIN(M, ...)
#endif

// Hot CPU kernels are compiled for three instruction set levels and the call picks one at run time (core/cpu_isa.h:
// the processor's best, or a lower cap from ASC_CPU_ISA / set_cpu_isa), so binaries stay portable:
//
//   ASC_CPU_DISPATCH(forward_block(p, bh, t0, rows, w, o));   // or: T l = ASC_CPU_DISPATCH(forward_row(...));
//
// runs the expression inside one of three functions compiled for x86-64-v4 (AVX-512, 512-bit vectors preferred),
// x86-64-v3 (AVX2 + FMA) or the x86-64 baseline, the names in it bound by reference; kIsa, the level as a
// constant (asc::CpuIsa), is in scope there for code that picks a vector width (small_gemm.h). A function the
// expression calls is compiled for the chosen level only when it is inlined: mark a kernel's bodies and helpers
// ASC_ALWAYS_INLINE (a separate function runs the baseline code). Use it at a call per block or row, not per
// element (each call reads the level once). Only inside a file's `#pragma GCC optimize` region (vec_region_begin.h):
// the three functions, defined below, take their options from the region this header is first included in.
// At x86-64-v3 and v4 GCC fuses a * b + c into an FMA wherever it can (its default for C++, whatever -std says; the
// ISO-mode switch to no contraction applies to C only): those levels differ from the baseline in the last bits there.
#define ASC_CPU_DISPATCH(...) \
  ::asc::cpu::dispatch_isa([&]<::asc::CpuIsa kIsa>() ASC_INLINE_LAMBDA -> decltype(auto) { return __VA_ARGS__; })
// A helper that a dispatched kernel calls in its loops: forced inline, so it is compiled for the kernel's level.
#define ASC_ALWAYS_INLINE [[gnu::always_inline]] inline
// The same for a lambda, written after its parameters: a kernel's row loop kept where it is read,
//   const auto rows_kernel = [&](int64_t b, int64_t e) ASC_INLINE_LAMBDA { ... };
//   parallel_for(rows, cost, [&](int64_t b, int64_t e) { ASC_CPU_DISPATCH(rows_kernel(b, e)); });
#define ASC_INLINE_LAMBDA __attribute__((always_inline))

namespace asc::cpu {

#ifdef ASC_CPU_MULTI_ISA
template <class F>
[[gnu::target("arch=x86-64-v4,prefer-vector-width=512")]] decltype(auto) run_x86_64_v4(F& f) {
  return f.template operator()<CpuIsa::x86_64_v4>();
}
template <class F>
[[gnu::target("arch=x86-64-v3")]] decltype(auto) run_x86_64_v3(F& f) {
  return f.template operator()<CpuIsa::x86_64_v3>();
}
#endif
template <class F>
decltype(auto) run_baseline(F& f) {
  return f.template operator()<CpuIsa::baseline>();
}

// ASC_CPU_DISPATCH's switch: f's body compiled for the level cpu_isa() names
template <class F>
decltype(auto) dispatch_isa(F&& f) {
#ifdef ASC_CPU_MULTI_ISA
  switch (cpu_isa()) {
    case CpuIsa::x86_64_v4: return run_x86_64_v4(f);
    case CpuIsa::x86_64_v3: return run_x86_64_v3(f);
    case CpuIsa::baseline: break;
  }
#endif
  return run_baseline(f);
}

// The Cephes expf core shared by exp_nonpos and exp_full: e^x = p 2^n for x in float's range, with n = round(x / ln 2)
// (returned through n) and p = e^r on |r| <= ln2/2 from a degree-7 polynomial; x NaN gives p NaN.
ASC_ALWAYS_INLINE float exp_reduced(float x, int32_t& n) {
  const float t = x * 1.44269504088896341f + 12582912.0f;  // + 1.5 * 2^23 rounds to an integer
  const float nf = t - 12582912.0f;
  n = static_cast<int32_t>(__builtin_bit_cast(uint32_t, t) - 0x4B400000u);  // that integer, two's complement
  const float r = x - nf * 0.693359375f - nf * -2.12194440e-4f;
  const float z = r * r;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  return p * z + r + 1.0f;
}

// exp(x) for x <= 0 (also -inf -> 0, NaN -> NaN), branch-free so loops over it vectorise. Below the normal range
// of the type it returns 0 (the callers add it to a sum that is >= 1, so this loses nothing).
// float: Cephes expf range reduction and polynomial (about 1 ulp). double: degree-13 Taylor on |r| <= ln2/2
// (truncation ~4e-18 relative).
ASC_ALWAYS_INLINE float exp_nonpos(float x) {
  constexpr float lo = -87.0f;
  int32_t n;
  const float p = exp_reduced(x < lo ? lo : x, n);  // NaN stays NaN
  const float scale = __builtin_bit_cast(float, static_cast<uint32_t>(n + 127) << 23);
  return p * scale * (x < lo ? 0.0f : 1.0f);  // -inf -> 0; NaN -> NaN
}

ASC_ALWAYS_INLINE double exp_nonpos(double x) {
  constexpr double lo = -707.0;
  const double xc = x < lo ? lo : x;
  const double t = xc * 1.4426950408889634074 + 6755399441055744.0;  // + 1.5 * 2^52
  const double nf = t - 6755399441055744.0;
  const uint64_t n = __builtin_bit_cast(uint64_t, t) - 0x4338000000000000ull;
  const double r = xc - nf * 6.93145751953125E-1 - nf * 1.42860682030941723212E-6;
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  const double scale = __builtin_bit_cast(double, (n + 1023ull) << 52);
  return p * scale * (x < lo ? 0.0 : 1.0);
}

// erfc(z) for z >= 0 (NaN -> NaN, +inf -> 0), branch-free: the Chebyshev fit of Numerical Recipes §6.2,
// t = 1 / (1 + z/2), erfc(z) = t exp(-z² + P(t)), with a fractional error below 1.2e-7 everywhere — in the tail too,
// where 1 - erf(z) would have no correct digit. The exp is exp_nonpos (P(0) rounds to about 3e-8 above 0 there).
ASC_ALWAYS_INLINE float erfc_nonneg(float z) {
  const float t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  return t * exp_nonpos(p - z * z);
}

// GELU(x) = x Φ(x) = x/2 (1 + erf(x/√2)) and its derivative Φ(x) + x φ(x), with Φ from erfc_nonneg of |x|/√2
// (Φ(x) = c/2 for x < 0, 1 - c/2 for x >= 0): relative error about 1e-7 on both sides, NaN -> NaN, and -inf -> NaN
// as x/2 (1 + erf(x/√2)) gives it.
ASC_ALWAYS_INLINE float gelu_cdf(float x) {
  const float half_c = 0.5f * erfc_nonneg((x < 0.0f ? -x : x) * 0.70710678118654752f);
  return x < 0.0f ? half_c : 1.0f - half_c;
}
ASC_ALWAYS_INLINE float gelu(float x) { return x * gelu_cdf(x); }
ASC_ALWAYS_INLINE float gelu_grad(float x) {
  return gelu_cdf(x) + x * 0.39894228040143268f * exp_nonpos(-0.5f * x * x);
}

// ---- float32 exp, log, tanh, sigmoid over the whole range, branch-free -------------------------------------------
// The elementwise ops' float32 rows (ops/cpu/unary_rows.cpp) call these instead of libm's expf / logf / tanhf, whose
// calls run one element at a time. Each is within a few ulp of the
// correctly rounded value (tests/test_elementwise.cpp measures it against float64 libm, subnormal results included) and
// keeps the IEEE special values: NaN -> NaN, and the infinities and zeros as libm gives them.

// p 2^n for an integer n in [-150, 129] and p in [0.5, 2): 2^n as two normal factors, so the product is exact after
// the first and rounds once after the second, to a subnormal too, or overflows to inf.
ASC_ALWAYS_INLINE float scale_pow2(float p, int32_t n) {
  const int32_t n1 = n >> 1, n2 = n - n1;
  const float f1 = __builtin_bit_cast(float, static_cast<uint32_t>(n1 + 127) << 23);
  const float f2 = __builtin_bit_cast(float, static_cast<uint32_t>(n2 + 127) << 23);
  return p * f1 * f2;
}

// exp(x): exp_reduced on x clamped to [-104, 89] (exp(-104) rounds to 0, exp(89) overflows), scaled by scale_pow2.
ASC_ALWAYS_INLINE float exp_full(float x) {
  int32_t n;
  const float p = exp_reduced(x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x), n);  // NaN stays NaN
  return scale_pow2(p, n);                                                          // NaN: p is NaN, whatever n holds
}

// log(x): Cephes logf. x = m 2^e with m in [√½, √2) (a subnormal x scaled by 2^23 first), f = m - 1,
// log x = f - f²/2 + f³ P(f) + e ln 2 with ln 2 split in two. 0 -> -inf, +inf -> +inf, x < 0 -> NaN.
ASC_ALWAYS_INLINE float log_full(float x) {
  const bool sub = x < 1.17549435e-38f;  // subnormal (also 0 and negatives, replaced at the end)
  const uint32_t bits = __builtin_bit_cast(uint32_t, sub ? x * 8388608.0f : x);
  const float m = __builtin_bit_cast(float, (bits & 0x007FFFFFu) | 0x3F000000u);  // [0.5, 1)
  const bool low = m < 0.707106781186547524f;
  const int32_t e = static_cast<int32_t>((bits >> 23) & 0xFFu) - 126 - (sub ? 23 : 0) - (low ? 1 : 0);
  const float f = low ? m + m - 1.0f : m - 1.0f;
  const float z = f * f;
  float y = 7.0376836292E-2f;
  y = y * f - 1.1514610310E-1f;
  y = y * f + 1.1676998740E-1f;
  y = y * f - 1.2420140846E-1f;
  y = y * f + 1.4249322787E-1f;
  y = y * f - 1.6668057665E-1f;
  y = y * f + 2.0000714765E-1f;
  y = y * f - 2.4999993993E-1f;
  y = y * f + 3.3333331174E-1f;
  const float ef = static_cast<float>(e);
  y = y * f * z - 2.12194440e-4f * ef - 0.5f * z;
  float res = f + y + 0.693359375f * ef;
  res = x < __builtin_inff() ? res : x;  // +inf -> +inf, NaN -> NaN
  res = x == 0.0f ? -__builtin_inff() : res;
  return x < 0.0f ? __builtin_nanf("") : res;
}

// log(1 + t) for t >= 0 (softplus's exp(-|z|) in [0, 1]): log(u) with u = 1 + t, corrected by the rounding of u,
// so a t far below float's epsilon gives t, not 0.
ASC_ALWAYS_INLINE float log1p_nonneg(float t) {
  const float u = 1.0f + t;
  return log_full(u) - ((u - 1.0f) - t) / u;
}

// tanh(x): Cephes tanhf. |x| < 0.625: x + x³ P(x²); beyond, 1 - 2 / (e^{2|x|} + 1) with x's sign (±1 once e^{2|x|}
// overflows). tanh(±0) = ±0, NaN -> NaN.
ASC_ALWAYS_INLINE float tanh_full(float x) {
  const float a = x < 0.0f ? -x : x;
  const float big = 1.0f - 2.0f / (exp_full(a + a) + 1.0f);
  const float s = x * x;
  float p = -5.70498872745E-3f;
  p = p * s + 2.06390887954E-2f;
  p = p * s - 5.37397155531E-2f;
  p = p * s + 1.33314422036E-1f;
  p = p * s - 3.33332819422E-1f;
  const float small = x == 0.0f ? x : p * s * x + x;
  return a < 0.625f ? small : (x < 0.0f ? -big : big);
}

// σ(x) = 1 / (1 + e^{-x}) from e = e^{-|x|} <= 1: 1 / (1 + e) for x >= 0, e / (1 + e) below (no overflow, and the
// small values of the left tail keep their relative precision).
ASC_ALWAYS_INLINE float sigmoid_full(float x) {
  const float e = exp_full(x < 0.0f ? x : -x);  // NaN stays NaN
  return (x < 0.0f ? e : 1.0f) / (1.0f + e);
}
// σ(x) and its slope σ(x) (1 - σ(x)) = e / (1 + e)², the slope without the cancellation of 1 - σ where σ nears 1.
ASC_ALWAYS_INLINE float sigmoid_slope(float x, float& slope) {
  const float e = exp_full(x < 0.0f ? x : -x), d = 1.0f / (1.0f + e);
  slope = e * d * d;
  return x < 0.0f ? e * d : d;
}

}  // namespace asc::cpu
