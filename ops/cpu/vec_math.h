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

// exp(x) for x <= 0 (also -inf -> 0, NaN -> NaN), branch-free so loops over it vectorise. Below the normal range
// of the type it returns 0 (the callers add it to a sum that is >= 1, so this loses nothing).
// float: Cephes expf range reduction and polynomial (about 1 ulp). double: degree-13 Taylor on |r| <= ln2/2
// (truncation ~4e-18 relative).
ASC_ALWAYS_INLINE float exp_nonpos(float x) {
  constexpr float lo = -87.0f;
  const float xc = x < lo ? lo : x;                         // NaN stays NaN
  const float t = xc * 1.44269504088896341f + 12582912.0f;  // + 1.5 * 2^23 rounds to an integer
  const float nf = t - 12582912.0f;
  const uint32_t n = __builtin_bit_cast(uint32_t, t) - 0x4B400000u;  // that integer, two's complement
  const float r = xc - nf * 0.693359375f - nf * -2.12194440e-4f;
  const float z = r * r;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * z + r + 1.0f;
  const float scale = __builtin_bit_cast(float, (n + 127u) << 23);
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

}  // namespace asc::cpu
