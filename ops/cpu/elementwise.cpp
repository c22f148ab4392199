// CPU elementwise kernels: one strided loop per arity, instantiated per op functor and dtype, so the inner loop
// is a straight-line expression the compiler vectorises when all operands are contiguous.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/generator.h"
#include "ops/cpu/bfloat16.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/sum_blocks.h"
#include "ops/kernels.h"

#include "ops/cpu/unary_rows.h"

// ---- dropout and uniforms ------------------------------------------------------------------------------------------
#include "ops/cpu/vec_math.h"  // ASC_CPU_DISPATCH, ASC_SIMD
#include "ops/cpu/vec_region_begin.h"

namespace asc::cpu {
namespace {

// Dropout from uniforms in one pass: the mask keeps where u >= p (a vector select: the region allows it), already
// scaled, and the output is x times it (NaN stays NaN where dropped, as x * 0 gives it).
ASC_ALWAYS_INLINE void dropout_rows(const float* u, const float* x, float* y, float* m, int64_t n, float p,
                                    float keep) {
  ASC_SIMD
  for (int64_t i = 0; i < n; ++i) {
    const float mi = u[i] >= p ? keep : 0.0f;
    m[i] = mi;
    y[i] = x[i] * mi;
  }
}
// U[lo, hi) from U[0, 1): lo + (hi - lo) u in double, rounded once to float (as the other dtypes' path does).
ASC_ALWAYS_INLINE void uniform_rows(const float* u, float* out, int64_t n, double lo, double hi) {
  ASC_SIMD
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(lo + (hi - lo) * static_cast<double>(u[i]));
}
}  // namespace
}  // namespace asc::cpu
#include "ops/cpu/vec_region_end.h"

// ---- float32 uniforms: Philox4x32-10 on 8 counters at once with AVX2 ------------------------------------------------
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define ASC_PHILOX_AVX2 1
#endif

namespace asc::cpu {
namespace {

#ifdef ASC_PHILOX_AVX2
// u[32 g + 4 j + w] = uint_to_unit_float(word w of philox4x32(seed, base + 8 g + j)) for g < groups: the bits of
// core/generator.h's philox4x32, 8 counters per vector (the compiler does not vectorise its 32 x 32 -> 64-bit
// products on its own). Called only where the CPU has AVX2.
__attribute__((target("avx2"))) void philox_unit_floats_avx2(uint64_t seed, uint64_t base, int64_t groups, float* u) {
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u)),
                m1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), sign = _mm256_set1_epi32(INT32_MIN);
  const __m256 unit = _mm256_set1_ps(1.0f / 16777216.0f);
  for (int64_t g = 0; g < groups; ++g) {
    const uint64_t b = base + 8 * static_cast<uint64_t>(g);
    // counter b + j as (low, high) words: the low word wraps past 2^32 - 1 into a carry (unsigned compare via sign
    // flip)
    const __m256i blo = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(b)));
    const __m256i lo = _mm256_add_epi32(blo, lanes);
    const __m256i wrapped = _mm256_cmpgt_epi32(_mm256_xor_si256(blo, sign), _mm256_xor_si256(lo, sign));  // -1 or 0
    __m256i c0 = lo,
            c1 = _mm256_sub_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(b >> 32))), wrapped);
    __m256i c2 = _mm256_setzero_si256(), c3 = _mm256_setzero_si256();
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      // 64-bit products of the even and odd 32-bit lanes, split into high and low words
      const __m256i pe0 = _mm256_mul_epu32(c0, m0), po0 = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), m0);
      const __m256i pe1 = _mm256_mul_epu32(c2, m1), po1 = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), m1);
      const __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(pe0, 32), po0, 0xAA);
      const __m256i lo0 = _mm256_blend_epi32(pe0, _mm256_slli_epi64(po0, 32), 0xAA);
      const __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(pe1, 32), po1, 0xAA);
      const __m256i lo1 = _mm256_blend_epi32(pe1, _mm256_slli_epi64(po1, 32), 0xAA);
      c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(k0)));
      c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(k1)));
      c1 = lo1, c3 = lo0;
      k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
    }
    // uint_to_unit_float: the top 24 bits times 2^-24
    const __m256 A = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c0, 8)), unit);
    const __m256 B = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c1, 8)), unit);
    const __m256 C = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c2, 8)), unit);
    const __m256 D = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c3, 8)), unit);
    // 4 x 8 transpose into element order 4 j + w
    const __m256 ab_lo = _mm256_unpacklo_ps(A, B), ab_hi = _mm256_unpackhi_ps(A, B);  // [A0 B0 A1 B1 | A4 B4 A5 B5]
    const __m256 cd_lo = _mm256_unpacklo_ps(C, D), cd_hi = _mm256_unpackhi_ps(C, D);
    const __m256 t0 = _mm256_shuffle_ps(ab_lo, cd_lo, 0x44), t1 = _mm256_shuffle_ps(ab_lo, cd_lo, 0xEE);  // j 0|4, 1|5
    const __m256 t2 = _mm256_shuffle_ps(ab_hi, cd_hi, 0x44), t3 = _mm256_shuffle_ps(ab_hi, cd_hi, 0xEE);  // j 2|6, 3|7
    float* o = u + 32 * g;
    _mm256_storeu_ps(o + 0, _mm256_permute2f128_ps(t0, t1, 0x20));
    _mm256_storeu_ps(o + 8, _mm256_permute2f128_ps(t2, t3, 0x20));
    _mm256_storeu_ps(o + 16, _mm256_permute2f128_ps(t0, t1, 0x31));
    _mm256_storeu_ps(o + 24, _mm256_permute2f128_ps(t2, t3, 0x31));
  }
}

// The same values as philox_unit_floats_avx2, 16 counters per vector (two of its groups at a time): AVX-512's
// unsigned compare in place of its sign-flip compare, word swaps under a mask (port 5) in place of its 64-bit shifts
// and blends (port 0, which the products need), two sets of 16 counters in flight (a round's products take 5
// cycles), and the 4 x 16 transpose as a 4 x 4 transpose of 128-bit lanes: faster than AVX2's code moved to 512 bits.
// Dropout's masks were a tenth of a Transformer training step at AVX2's rate. (GCC 12's AVX-512 intrinsics start from
// _mm512_undefined_*: its -Wmaybe-uninitialized is a false alarm there.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define ASC_AVX512_INLINE __attribute__((target("avx512f"), always_inline)) inline

struct Philox16 {
  __m512i c0, c1, c2, c3;  // word w of the 16 counters' states
};

// The 16 counters base .. base + 15 as (low word, high word) pairs: the low word may wrap past 2^32 - 1 into a carry.
ASC_AVX512_INLINE Philox16 philox16_start(uint64_t base) {
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i blo = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(base)));
  const __m512i lo = _mm512_add_epi32(blo, lanes);
  const __mmask16 wrapped = _mm512_cmplt_epu32_mask(lo, blo);
  const __m512i bhi = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(base >> 32)));
  return {lo, _mm512_mask_add_epi32(bhi, wrapped, bhi, _mm512_set1_epi32(1)), _mm512_setzero_si512(),
          _mm512_setzero_si512()};
}

// One Philox round under key (k0, k1): the 64-bit products of word 0 (word 2) by its multiplier, for the even
// lanes directly (pe) and the odd ones swapped down (po); their high and low words gathered back in lane order.
// The swaps are permutations by an index vector, not immediate shuffles: the intrinsics with immediates do not
// compile at -O0 (the sanitizer builds) once wrapped in a helper.
ASC_AVX512_INLINE void philox16_round(Philox16& s, uint32_t k0, uint32_t k1) {
  constexpr __mmask16 odd = 0xAAAA, even = 0x5555;
  const __m512i swap = _mm512_setr_epi32(1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);  // words 2i <-> 2i+1
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(0xD2511F53u)),
                m1 = _mm512_set1_epi32(static_cast<int>(0xCD9E8D57u));
  const __m512i pe0 = _mm512_mul_epu32(s.c0, m0), po0 = _mm512_mul_epu32(_mm512_permutexvar_epi32(swap, s.c0), m0);
  const __m512i pe1 = _mm512_mul_epu32(s.c2, m1), po1 = _mm512_mul_epu32(_mm512_permutexvar_epi32(swap, s.c2), m1);
  const __m512i hi0 = _mm512_mask_permutexvar_epi32(po0, even, swap, pe0);
  const __m512i lo0 = _mm512_mask_permutexvar_epi32(pe0, odd, swap, po0);
  const __m512i hi1 = _mm512_mask_permutexvar_epi32(po1, even, swap, pe1);
  const __m512i lo1 = _mm512_mask_permutexvar_epi32(pe1, odd, swap, po1);
  s.c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, s.c1), _mm512_set1_epi32(static_cast<int>(k0)));
  s.c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, s.c3), _mm512_set1_epi32(static_cast<int>(k1)));
  s.c1 = lo1, s.c3 = lo0;
}

// u[4 j + w] = uint_to_unit_float(word w of counter j) for the 16 counters: the top 24 bits times 2^-24, then the
// 4 x 16 transpose into element order.
ASC_AVX512_INLINE void philox16_store(const Philox16& s, float* u) {
  const __m512 unit = _mm512_set1_ps(1.0f / 16777216.0f);
  const __m512 A = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(s.c0, 8)), unit);
  const __m512 B = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(s.c1, 8)), unit);
  const __m512 C = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(s.c2, 8)), unit);
  const __m512 D = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(s.c3, 8)), unit);
  // per 128-bit lane l: t0 = [A B C D of counter 4l], t1 of 4l + 1, t2 of 4l + 2, t3 of 4l + 3
  const __m512 ab_lo = _mm512_unpacklo_ps(A, B), ab_hi = _mm512_unpackhi_ps(A, B);
  const __m512 cd_lo = _mm512_unpacklo_ps(C, D), cd_hi = _mm512_unpackhi_ps(C, D);
  const __m512 t0 = _mm512_shuffle_ps(ab_lo, cd_lo, 0x44), t1 = _mm512_shuffle_ps(ab_lo, cd_lo, 0xEE);
  const __m512 t2 = _mm512_shuffle_ps(ab_hi, cd_hi, 0x44), t3 = _mm512_shuffle_ps(ab_hi, cd_hi, 0xEE);
  // out l = [t0.l t1.l t2.l t3.l]: counters 4l .. 4l + 3 in order
  const __m512 t01_lo = _mm512_shuffle_f32x4(t0, t1, 0x44), t23_lo = _mm512_shuffle_f32x4(t2, t3, 0x44);
  const __m512 t01_hi = _mm512_shuffle_f32x4(t0, t1, 0xEE), t23_hi = _mm512_shuffle_f32x4(t2, t3, 0xEE);
  _mm512_storeu_ps(u + 0, _mm512_shuffle_f32x4(t01_lo, t23_lo, 0x88));
  _mm512_storeu_ps(u + 16, _mm512_shuffle_f32x4(t01_lo, t23_lo, 0xDD));
  _mm512_storeu_ps(u + 32, _mm512_shuffle_f32x4(t01_hi, t23_hi, 0x88));
  _mm512_storeu_ps(u + 48, _mm512_shuffle_f32x4(t01_hi, t23_hi, 0xDD));
}

__attribute__((target("avx512f"))) void philox_unit_floats_avx512(uint64_t seed, uint64_t base, int64_t pairs,
                                                                  float* u) {
  int64_t g = 0;
  for (; g + 1 < pairs; g += 2) {  // two sets of 16 counters, their rounds interleaved
    Philox16 a = philox16_start(base + 16 * static_cast<uint64_t>(g)),
             b = philox16_start(base + 16 * static_cast<uint64_t>(g + 1));
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round, k0 += 0x9E3779B9u, k1 += 0xBB67AE85u) {
      philox16_round(a, k0, k1);
      philox16_round(b, k0, k1);
    }
    philox16_store(a, u + 64 * g);
    philox16_store(b, u + 64 * (g + 1));
  }
  if (g < pairs) {
    Philox16 a = philox16_start(base + 16 * static_cast<uint64_t>(g));
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round, k0 += 0x9E3779B9u, k1 += 0xBB67AE85u) philox16_round(a, k0, k1);
    philox16_store(a, u + 64 * g);
  }
}
#undef ASC_AVX512_INLINE
#pragma GCC diagnostic pop
#endif

// The same values on any CPU: AVX-512 from x86-64-v4 up, AVX2 from x86-64-v3 (core/cpu_isa.h), else one philox4x32
// per block. ASC_CPU_ISA=baseline forces the scalar path (the test suite runs the random tests both ways).
void philox_unit_floats(uint64_t seed, uint64_t base, int64_t groups, float* u) {
#ifdef ASC_PHILOX_AVX2
  if (cpu_isa() >= CpuIsa::x86_64_v4) {
    const int64_t pairs = groups / 2;
    philox_unit_floats_avx512(seed, base, pairs, u);
    if (groups % 2) philox_unit_floats_avx2(seed, base + 16 * static_cast<uint64_t>(pairs), 1, u + 64 * pairs);
    return;
  }
  if (cpu_isa() >= CpuIsa::x86_64_v3) return philox_unit_floats_avx2(seed, base, groups, u);
#endif
  for (int64_t blk = 0; blk < 8 * groups; ++blk) {
    const auto r = philox4x32(seed, base + static_cast<uint64_t>(blk));
    for (int w = 0; w < 4; ++w) u[4 * blk + w] = uint_to_unit_float(r[w]);
  }
}

// Calls fn(i0, u, cnt) for consecutive chunks [i0, i0 + cnt) of [0, n), u[e] the float uniform of element i0 + e in
// the stream at (seed, offset) — element i uses word i % 4 of block offset + i / 4, as for_each_uniform does —, in
// chunks of at most 1024 elements split across threads.
template <class F>
void for_each_uniform_f32(int64_t n, uint64_t seed, uint64_t offset, F&& fn) {
  constexpr int64_t kChunk = 1024, kGroups = kChunk / 32;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  parallel_for(chunks, 12000, [&](int64_t c0, int64_t c1) {
    alignas(64) float u[kChunk];
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t i0 = c * kChunk, cnt = std::min(kChunk, n - i0);
      philox_unit_floats(seed, offset + static_cast<uint64_t>(i0 / 4), std::min(kGroups, (cnt + 31) / 32), u);
      fn(i0, u, cnt);
    }
  });
}

}  // namespace
}  // namespace asc::cpu

namespace asc::cpu {
namespace {

using math::Binary;
using math::Unary;
using math::UnaryParams;

// The contiguous row loops of the generic ops, compiled for each instruction set level and picked at run time
// (ASC_CPU_DISPATCH, ops/cpu/vec_math.h): the per-element functors (ops/math.h) are forced inline, so a level's
// loop is that level's code. They sit outside the no-trapping-math region: the functors' std:: calls (abs, sqrt)
// must inline here, and none of these loops needs a select that only that region would if-convert. An element is
// the same bits at every level where it is one IEEE operation; where a multiply feeds an add (GELU-tanh, the
// derivatives of tanh and SiLU) x86-64-v3 and v4 fuse them into an FMA, one rounding fewer. tests/test_cpu_isa.cpp
// checks both.
template <Unary U, class T>
ASC_ALWAYS_INLINE void unary_rows(const T* a, T* o, int64_t n, const UnaryParams& p) {
  for (int64_t i = 0; i < n; ++i) o[i] = math::unary_fwd<U, T>(a[i], p);
}
template <Unary U, class T>
ASC_ALWAYS_INLINE void unary_backward_rows(const T* g, const T* x, const T* y, T* o, int64_t n, const UnaryParams& p) {
  for (int64_t i = 0; i < n; ++i) o[i] = g[i] * math::unary_grad<U, T>(x[i], y[i], p);
}
// o = x ∘ y with x and y contiguous (sx = sy = 1) or one of them a broadcast scalar (its stride 0)
template <Binary B, class T, class R>
ASC_ALWAYS_INLINE void binary_rows(const T* x, int64_t sx, const T* y, int64_t sy, R* o, int64_t n) {
  if (sx == 1 && sy == 1) {
    for (int64_t i = 0; i < n; ++i) o[i] = math::binary_fwd<B, T>(x[i], y[i]);
  } else if (sy == 0) {
    const T yv = *y;
    for (int64_t i = 0; i < n; ++i) o[i] = math::binary_fwd<B, T>(x[i], yv);
  } else {
    const T xv = *x;
    for (int64_t i = 0; i < n; ++i) o[i] = math::binary_fwd<B, T>(xv, y[i]);
  }
}

template <Unary U, class T>
void unary_impl(const UnaryParams& p, const Tensor& x, Tensor& out) {
  const T* xp = x.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const float pa = static_cast<float>(p.a), pb = static_cast<float>(p.b);  // vec_unary_rows' parameters
  for_each_strided<2>(x.shape(), {out.strides(), x.strides()}, [&](auto off, int64_t n, auto st) {
    T* o = op + off[0];
    const T* a = xp + off[1];
    if (vec_unary_float(U) && std::is_same_v<T, float>) {
      vec_unary_rows(U, reinterpret_cast<const float*>(a), st[1], reinterpret_cast<float*>(o), st[0], n, pa, pb);
    } else if (st[0] == 1 && st[1] == 1) {
      ASC_CPU_DISPATCH(unary_rows<U, T>(a, o, n, p));
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * st[0]] = math::unary_fwd<U, T>(a[i * st[1]], p);
    }
  });
}

template <Unary U, class T>
void unary_backward_impl(const UnaryParams& p, const Tensor& g, const Tensor& x, const Tensor& y, Tensor& gx) {
  const T* gp = g.data_ptr<T>();
  const T* xp = x.data_ptr<T>();
  const T* yp = y.data_ptr<T>();
  T* op = gx.data_ptr<T>();
  const float pa = static_cast<float>(p.a), pb = static_cast<float>(p.b);
  for_each_strided<4>(
      x.shape(), {gx.strides(), g.strides(), x.strides(), y.strides()}, [&](auto off, int64_t n, auto st) {
        T* o = op + off[0];
        const T *gg = gp + off[1], *xx = xp + off[2], *yy = yp + off[3];
        if (vec_unary_float(U) && std::is_same_v<T, float>) {
          using F = const float*;
          vec_unary_backward_rows(U, reinterpret_cast<F>(gg), st[1], reinterpret_cast<F>(xx), st[2],
                                  reinterpret_cast<F>(yy), st[3], reinterpret_cast<float*>(o), st[0], n, pa, pb);
        } else if (st[0] == 1 && st[1] == 1 && st[2] == 1 && st[3] == 1) {
          ASC_CPU_DISPATCH(unary_backward_rows<U, T>(gg, xx, yy, o, n, p));
        } else {
          for (int64_t i = 0; i < n; ++i)
            o[i * st[0]] = gg[i * st[1]] * math::unary_grad<U, T>(xx[i * st[2]], yy[i * st[3]], p);
        }
      });
}

// Calls f.template operator()<U>() with U the compile-time value of `op`.
template <class F>
void visit_unary(Unary op, F&& f) {
  switch (op) {
// clang-format off
#define ASC_U(name) \
  case Unary::name: return f.template operator()<Unary::name>();
    ASC_U(Neg) ASC_U(Exp) ASC_U(Log) ASC_U(Sqrt) ASC_U(Rsqrt) ASC_U(Abs) ASC_U(Relu) ASC_U(Gelu) ASC_U(GeluTanh)
    ASC_U(Silu) ASC_U(Sigmoid) ASC_U(Tanh) ASC_U(Softplus) ASC_U(Clamp) ASC_U(AddScalar) ASC_U(MulScalar)
    ASC_U(RSubScalar) ASC_U(RDivScalar) ASC_U(PowScalar)
#undef ASC_U
    // clang-format on
  }
}

template <Binary B, class T>
void binary_impl(const Tensor& a, const Tensor& b, Tensor& out) {
  using R = decltype(math::binary_fwd<B, T>(T{}, T{}));
  const Shape& shape = out.shape();
  const T* ap = a.data_ptr<T>();
  const T* bp = b.data_ptr<T>();
  R* op = out.data_ptr<R>();
  Strides sa = broadcast_strides(a.shape(), a.strides(), shape), sb = broadcast_strides(b.shape(), b.strides(), shape);
  for_each_strided<3>(shape, {out.strides(), sa, sb}, [&](auto off, int64_t n, auto st) {
    R* o = op + off[0];
    const T *x = ap + off[1], *y = bp + off[2];
    // contiguous, or one operand a broadcast scalar / row
    if (st[0] == 1 && ((st[1] == 1 && (st[2] == 1 || st[2] == 0)) || (st[1] == 0 && st[2] == 1))) {
      ASC_CPU_DISPATCH((binary_rows<B, T, R>(x, st[1], y, st[2], o, n)));
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * st[0]] = math::binary_fwd<B, T>(x[i * st[1]], y[i * st[2]]);
    }
  });
}

template <class F>
void visit_binary(Binary op, F&& f) {
  switch (op) {
// clang-format off
#define ASC_B(name) \
  case Binary::name: return f.template operator()<Binary::name>();
    ASC_B(Add) ASC_B(Sub) ASC_B(Mul) ASC_B(Div) ASC_B(Pow) ASC_B(Max) ASC_B(Min) ASC_B(Eq) ASC_B(Ne) ASC_B(Lt) ASC_B(Le)
    ASC_B(Gt) ASC_B(Ge) ASC_B(And) ASC_B(Or)
#undef ASC_B
    // clang-format on
  }
}

// ---- copies and casts, bfloat16 / float16 included ----------------------------------------------------------------
// A CPU tensor of a reduced float holds data (moved from a GPU, loaded from a file) and converts to and from the
// other dtypes; no other CPU kernel takes one. bfloat16 is its bit pattern (the top half of a float32); float16 is
// the compiler's _Float16. A value rounds once, to nearest even, as CUDA's conversions do.
struct BFloat16Bits {
  uint16_t bits;
};
inline float to_float(BFloat16Bits v) { return bfloat16_value(v.bits); }
inline BFloat16Bits to_bfloat16(float f) { return {bfloat16_bits(f)}; }  // to nearest even; NaN stays NaN
// float64 -> float32 rounded to odd: truncated toward zero, the last bit set when anything was cut off. Rounding that
// to bfloat16 (8 bits fewer than float32's 24) then equals rounding the double directly, as CUDA's __double2bfloat16
// does: rounding to nearest twice would turn 1 + 2^-8 + 2^-30 into the tie 1 + 2^-8, and that into 1.
inline float to_float_round_to_odd(double d) {
  float f = static_cast<float>(d);
  if (!std::isfinite(d) || static_cast<double>(f) == d) return f;
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) --u;  // rounded away from zero: one step back
  u |= 1u;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
template <class D, class S>
inline D cast(S s) {
  if constexpr (std::is_same_v<S, D>)
    return s;
  else if constexpr (std::is_same_v<S, BFloat16Bits>)
    return cast<D>(to_float(s));
  else if constexpr (std::is_same_v<S, _Float16>)
    return cast<D>(static_cast<float>(s));
  else if constexpr (std::is_same_v<D, BFloat16Bits> && std::is_same_v<S, float>)
    return to_bfloat16(s);
  else if constexpr (std::is_same_v<D, BFloat16Bits>)
    return to_bfloat16(to_float_round_to_odd(static_cast<double>(s)));
  else if constexpr (std::is_same_v<D, _Float16>)
    return static_cast<_Float16>(s);  // one rounding, from any of float32, float64, int64, bool
  else
    return static_cast<D>(s);
}
// f(tag) with a value of the storage type of dt, for every dtype.
template <class F>
void visit_storage(DType dt, F&& f) {
  switch (dt) {
    case DType::Float32: return f(float{});
    case DType::Float64: return f(double{});
    case DType::Int64: return f(int64_t{});
    case DType::Bool: return f(bool{});
    case DType::BFloat16: return f(BFloat16Bits{});
    case DType::Float16: return f(_Float16{});
  }
  ASC_THROW("copy: unknown dtype");
}

// Copy where the destination runs along the source's slow axis (a transpose: dst inner stride 1, src inner
// stride large, and the reverse one level up). Walking the destination in order would read the source one
// cache line per element; 32 x 32 tiles keep both sides in cache.
template <class S, class D>
bool copy_transposed(const S* sp, D* dp, const StridedLayout<2>& L) {
  const int nd = L.shape.size();
  if (nd < 2 || nd > 3) return false;
  const int64_t R = L.shape[nd - 2], C = L.shape[nd - 1];
  const int64_t dr = L.strides[0][nd - 2], dc = L.strides[0][nd - 1];
  const int64_t sr = L.strides[1][nd - 2], sc = L.strides[1][nd - 1];
  if (dc != 1 || sr != 1 || sc == 1 || R < 16 || C < 16) return false;
  const int64_t B = nd == 3 ? L.shape[0] : 1;
  const int64_t db = nd == 3 ? L.strides[0][0] : 0, sb = nd == 3 ? L.strides[1][0] : 0;
  constexpr int64_t T = 32;
  parallel_for(B * ((R + T - 1) / T), T * C, [&](int64_t b0, int64_t b1) {
    for (int64_t task = b0; task < b1; ++task) {
      int64_t b = task / ((R + T - 1) / T), r0 = (task % ((R + T - 1) / T)) * T;
      const S* s = sp + b * sb;
      D* d = dp + b * db;
      for (int64_t c0 = 0; c0 < C; c0 += T)
        for (int64_t r = r0; r < std::min(R, r0 + T); ++r)
          for (int64_t c = c0; c < std::min(C, c0 + T); ++c) d[r * dr + c] = cast<D>(s[r + c * sc]);
    }
  });
  return true;
}

template <class S, class D>
void copy_impl(const Tensor& src, Tensor& dst) {
  const S* sp = static_cast<const S*>(src.raw_data());
  D* dp = static_cast<D*>(dst.raw_data());
  Strides ss = broadcast_strides(src.shape(), src.strides(), dst.shape());
  if (dst.numel() >= 1024 && copy_transposed<S, D>(sp, dp, coalesce<2>(dst.shape(), {dst.strides(), ss}))) return;
  for_each_strided<2>(dst.shape(), {dst.strides(), ss}, [&](auto off, int64_t n, auto st) {
    D* o = dp + off[0];
    const S* s = sp + off[1];
    if (st[0] == 1 && st[1] == 1) {
      if constexpr (std::is_same_v<S, D>)
        std::memcpy(o, s, n * sizeof(D));
      else
        for (int64_t i = 0; i < n; ++i) o[i] = cast<D>(s[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * st[0]] = cast<D>(s[i * st[1]]);
    }
  });
}

}  // namespace

void unary(Unary op, const UnaryParams& p, const Tensor& x, Tensor& out) {
  ASC_DISPATCH_FLOAT(x.dtype(), "unary",
                     [&] { visit_unary(op, [&]<Unary U>() { unary_impl<U, scalar_t>(p, x, out); }); });
}

void unary_backward(Unary op, const UnaryParams& p, const Tensor& g, const Tensor& x, const Tensor& y, Tensor& gx) {
  ASC_DISPATCH_FLOAT(x.dtype(), "unary_backward",
                     [&] { visit_unary(op, [&]<Unary U>() { unary_backward_impl<U, scalar_t>(p, g, x, y, gx); }); });
}

void binary(Binary op, const Tensor& a, const Tensor& b, Tensor& out) {
  ASC_DISPATCH_ALL(a.dtype(), "binary", [&] {
    visit_binary(op, [&]<Binary B>() {
      if constexpr (std::is_same_v<scalar_t, bool> && !math::is_comparison(B) && B != Binary::Max && B != Binary::Min) {
        // Arithmetic on bools is promoted to int64 by the op layer; only logic reaches here.
        ASC_THROW("binary: op not defined for bool tensors");
      } else {
        binary_impl<B, scalar_t>(a, b, out);
      }
    });
  });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  ASC_DISPATCH_ALL(out.dtype(), "where", [&] {
    const Shape& shape = out.shape();
    const bool* cp = cond.data_ptr<bool>();
    const scalar_t* ap = a.data_ptr<scalar_t>();
    const scalar_t* bp = b.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    Strides sc = broadcast_strides(cond.shape(), cond.strides(), shape);
    Strides sa = broadcast_strides(a.shape(), a.strides(), shape);
    Strides sb = broadcast_strides(b.shape(), b.strides(), shape);
    for_each_strided<4>(shape, {out.strides(), sc, sa, sb}, [&](auto off, int64_t n, auto st) {
      for (int64_t i = 0; i < n; ++i)
        op[off[0] + i * st[0]] = cp[off[1] + i * st[1]] ? ap[off[2] + i * st[2]] : bp[off[3] + i * st[3]];
    });
  });
}

void copy(const Tensor& src, Tensor& dst) {
  visit_storage(src.dtype(), [&](auto s) {
    visit_storage(dst.dtype(), [&](auto d) { copy_impl<decltype(s), decltype(d)>(src, dst); });
  });
}

void fill(Tensor& dst, double value) {
  ASC_DISPATCH_ALL(dst.dtype(), "fill", [&] {
    scalar_t* p = dst.data_ptr<scalar_t>();
    const scalar_t v = static_cast<scalar_t>(value);
    for_each_strided<1>(dst.shape(), {dst.strides()}, [&](auto off, int64_t n, auto st) {
      for (int64_t i = 0; i < n; ++i) p[off[0] + i * st[0]] = v;
    });
  });
}

void isnan(const Tensor& x, Tensor& out) {
  ASC_DISPATCH_FLOAT(x.dtype(), "isnan", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    bool* op = out.data_ptr<bool>();
    for_each_strided<2>(x.shape(), {out.strides(), x.strides()}, [&](auto off, int64_t n, auto st) {
      for (int64_t i = 0; i < n; ++i) op[off[0] + i * st[0]] = std::isnan(xp[off[1] + i * st[1]]);
    });
  });
}

// Sum of n elements `st` apart. Eight independent partial sums when contiguous: one accumulator is a chain of
// dependent adds (4 cycles each), and the compiler may not reorder floating-point additions itself.
// Forced inline and called through ASC_CPU_DISPATCH: the eight partial sums are one 512-bit register of doubles at
// x86-64-v4, and the same additions in the same order at every level, so the same bits.
template <class acc_t, class scalar_t>
ASC_ALWAYS_INLINE acc_t run_sum(const scalar_t* a, int64_t n, int64_t st) {
  if (st != 1) {
    acc_t s = 0;
    for (int64_t i = 0; i < n; ++i) s += a[i * st];
    return s;
  }
  acc_t part[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += a[i + j];
  for (; i < n; ++i) part[0] += a[i];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

// o[i] += a[i]: a row of x added into a row of the float64 (or int64) sums
template <class acc_t, class scalar_t>
ASC_ALWAYS_INLINE void add_into(acc_t* o, const scalar_t* a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] += a[i];
}

// A full reduction's blocks of kSumBlock elements (ops/cpu/sum_blocks.h) depend on the shape only, never on the thread
// count, and their sums are added in block order: the result has the same bits at any number of threads.

template <class scalar_t>
void sum_impl(const Tensor& x, Tensor& out) {
  // Accumulate in double (float64 sums of float32 data keep long reductions accurate), walking x in memory
  // order with the output broadcast (stride 0) over the reduced dims.
  using acc_t = std::conditional_t<std::is_same_v<scalar_t, int64_t>, int64_t, double>;
  const int64_t m = out.numel();
  const scalar_t* xp = x.data_ptr<scalar_t>();
  scalar_t* op = out.data_ptr<scalar_t>();
  if (m == 1) {
    const int64_t total = x.numel();
    if (total == 0) {
      op[0] = scalar_t(0);
      return;
    }
    const StridedLayout<1> L = coalesce<1>(x.shape(), {x.strides()});
    const int nd = L.shape.size();
    const int64_t n = L.shape[nd - 1], rows = total / n, step = L.strides[0][nd - 1];
    std::vector<acc_t> part;
    if (rows == 1) {  // one run (contiguous data): blocks of kSumBlock elements along it
      part.resize(static_cast<size_t>((n + kSumBlock - 1) / kSumBlock));
      parallel_for(static_cast<int64_t>(part.size()), kSumBlock, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b)
          part[b] =
              ASC_CPU_DISPATCH(run_sum<acc_t>(xp + b * kSumBlock * step, std::min(kSumBlock, n - b * kSumBlock), step));
      });
    } else {  // many runs: blocks of whole runs
      const int64_t per = std::max<int64_t>(1, kSumBlock / n);
      part.resize(static_cast<size_t>((rows + per - 1) / per));
      parallel_for(static_cast<int64_t>(part.size()), per * n, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          acc_t s = 0;
          auto body = [&](const std::array<int64_t, 1>& off, int64_t len, const std::array<int64_t, 1>& st) {
            s += ASC_CPU_DISPATCH(run_sum<acc_t>(xp + off[0], len, st[0]));
          };
          for_rows<1>(L, b * per, std::min(rows, (b + 1) * per), body);
          part[b] = s;
        }
      });
    }
    acc_t s = 0;
    for (const acc_t v : part) s += v;
    op[0] = static_cast<scalar_t>(s);
    return;
  }
  // A contiguous x summed over its leading dims into its trailing m elements (a bias's gradient: (rows, m) -> (m)):
  // a fixed number of blocks of whole rows, each summed by one thread in one contiguous sweep (the prefetcher's
  // pattern: threads taking column groups of every row ran no faster than one thread), then the blocks in order. The
  // blocks depend on the shape only: the same bits at any thread count.
  int64_t kept = x.dim();
  while (kept > 0 && out.size(kept - 1) == x.size(kept - 1)) --kept;
  bool leading = x.is_contiguous() && m > 1;
  for (int64_t d = 0; d < kept && leading; ++d) leading = out.size(d) == 1;
  const int64_t rows = m > 0 ? x.numel() / m : 0;
  const int64_t blocks = column_sum_blocks(rows, m);
  if (leading && blocks > 1) {
    const std::vector<acc_t> sums = column_sums_by_blocks<acc_t>(
        rows, m, [&](acc_t* acc, int64_t r) { ASC_CPU_DISPATCH(add_into(acc, xp + r * m, m)); });
    for (int64_t c = 0; c < m; ++c) op[c] = static_cast<scalar_t>(sums[static_cast<size_t>(c)]);
    return;
  }
  std::vector<acc_t> acc(static_cast<size_t>(m), acc_t(0));
  Strides so = broadcast_strides(out.shape(), contiguous_strides(out.shape()), x.shape());
  acc_t* ap = acc.data();
  // Reductions into a broadcast output run serially: rows may hit the same output element.
  for_each_strided<2>(
      x.shape(), {so, x.strides()},
      [&](auto off, int64_t n, auto st) {
        acc_t* o = ap + off[0];
        const scalar_t* a = xp + off[1];
        if (st[0] == 0) {
          *o += ASC_CPU_DISPATCH(run_sum<acc_t>(a, n, st[1]));
        } else if (st[0] == 1 && st[1] == 1) {  // a row of x into a row of sums
          ASC_CPU_DISPATCH(add_into(o, a, n));
        } else {
          for (int64_t i = 0; i < n; ++i) o[i * st[0]] += a[i * st[1]];
        }
      },
      /*parallel=*/false);
  for (int64_t i = 0; i < m; ++i) op[i] = static_cast<scalar_t>(acc[static_cast<size_t>(i)]);
}

void sum(const Tensor& x, Tensor& out) {
  ASC_DISPATCH_NUMERIC(x.dtype(), "sum", [&] { sum_impl<scalar_t>(x, out); });
}

namespace {
// Calls fn(i, u) for every i in [0, n) with u ~ U[0, 1) (53 bits) from lanes (2(i%2), 2(i%2)+1) of Philox block
// offset + i / 2: the float64 stream (float32 has its own, vectorised: for_each_uniform_f32). Each block is
// computed once for the two elements that share it.
template <class F>
void for_each_uniform_f64(int64_t n, uint64_t seed, uint64_t offset, F&& fn) {
  const int64_t blocks = (n + 1) / 2;
  parallel_for(blocks, 40, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      auto r = philox4x32(seed, offset + static_cast<uint64_t>(blk));
      const int64_t i0 = blk * 2, cnt = std::min<int64_t>(2, n - i0);
      for (int64_t j = 0; j < cnt; ++j) fn(i0 + j, uint_to_unit_double(r[2 * j], r[2 * j + 1]));
    }
  });
}

// out = lo + (hi - lo) u, rounded once to T.
template <class T>
void uniform_typed(Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi) {
  T* p = out.data_ptr<T>();
  if constexpr (std::is_same_v<T, float>)
    for_each_uniform_f32(out.numel(), seed, offset, [&](int64_t i0, const float* u, int64_t cnt) {
      ASC_CPU_DISPATCH(uniform_rows(u, p + i0, cnt, lo, hi));
    });
  else
    for_each_uniform_f64(out.numel(), seed, offset,
                         [&](int64_t i, double u) { p[i] = static_cast<T>(lo + (hi - lo) * u); });
}

// mask = (u >= p) * scale with the u rand() would draw for this tensor, out = x * mask.
template <class T>
void dropout_typed(const Tensor& x, Tensor& out, Tensor& mask, uint64_t seed, uint64_t offset, double p, double scale) {
  const T* xp = x.data_ptr<T>();
  T *y = out.data_ptr<T>(), *m = mask.data_ptr<T>();
  const T keep = static_cast<T>(scale), pt = static_cast<T>(p);
  if constexpr (std::is_same_v<T, float>)
    for_each_uniform_f32(x.numel(), seed, offset, [&](int64_t i0, const float* u, int64_t cnt) {
      ASC_CPU_DISPATCH(dropout_rows(u, xp + i0, y + i0, m + i0, cnt, pt, keep));
    });
  else
    for_each_uniform_f64(x.numel(), seed, offset, [&](int64_t i, double u) {
      m[i] = static_cast<T>(u) >= pt ? keep : T(0);
      y[i] = xp[i] * m[i];
    });
}
// fn(i, c, len) for the pieces of [i0, i1) that lie within one row of n elements: i the first element, c its column.
template <class F>
ASC_ALWAYS_INLINE void for_row_segments(int64_t i0, int64_t i1, int64_t n, F&& fn) {
  for (int64_t i = i0; i < i1;) {
    const int64_t c = i % n, len = std::min(i1 - i, n - c);
    fn(i, c, len);
    i += len;
  }
}

// out = act(x + bias) · mask over (rows, n), and slope = act'(x + bias) where given: float32 by unary_rows.cpp's row
// segments (a chunk of uniforms may start and end inside a row), float64 element by element.
template <class T>
void bias_act_dropout_typed(Unary act, const Tensor& x, const Tensor& bias, Tensor& out, Tensor& keep, Tensor& slope,
                            uint64_t seed, uint64_t offset, double p, double scale) {
  const int64_t total = x.numel(), n = x.size(-1);
  if (total == 0) return;
  const T* xp = x.data_ptr<T>();
  const T* bp = bias.defined() ? bias.data_ptr<T>() : nullptr;
  T* y = out.data_ptr<T>();
  bool* kp = keep.defined() ? keep.data_ptr<bool>() : nullptr;
  T* sp = slope.defined() ? slope.data_ptr<T>() : nullptr;
  if constexpr (std::is_same_v<T, float>) {
    const float pt = static_cast<float>(p), sc = static_cast<float>(scale);
    if (kp) {
      for_each_uniform_f32(total, seed, offset, [&](int64_t i0, const float* u, int64_t cnt) {
        for_row_segments(i0, i0 + cnt, n, [&](int64_t i, int64_t c, int64_t len) {
          vec_bias_act_rows(act, xp + i, bp ? bp + c : nullptr, u + (i - i0), pt, sc, y + i, kp + i,
                            sp ? sp + i : nullptr, len);
        });
      });
    } else {
      parallel_for(total, 8, [&](int64_t i0, int64_t i1) {
        for_row_segments(i0, i1, n, [&](int64_t i, int64_t c, int64_t len) {
          vec_bias_act_rows(act, xp + i, bp ? bp + c : nullptr, nullptr, pt, sc, y + i, nullptr, sp ? sp + i : nullptr,
                            len);
        });
      });
    }
  } else {
    const T pt = static_cast<T>(p), sc = static_cast<T>(scale);
    visit_ffn_activation(act, [&]<Unary U>() {  // ops/math.h's functors, as the composed ops run them
      const math::UnaryParams none{};
      auto value = [&](int64_t i) {
        const T z = bp ? xp[i] + bp[i % n] : xp[i];
        if (sp) sp[i] = math::unary_grad<U, T>(z, T(0), none);
        return math::unary_fwd<U, T>(z, none);
      };
      if (kp)
        for_each_uniform_f64(total, seed, offset, [&](int64_t i, double u) {
          const bool k = static_cast<T>(u) >= pt;
          kp[i] = k;
          y[i] = value(i) * (k ? sc : T(0));
        });
      else
        parallel_for(total, 64, [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) y[i] = value(i);
        });
    });
  }
}

// gx = (g · mask) · slope: dropout's backward, then the activation's.
template <class T>
void bias_act_dropout_backward_typed(const Tensor& g, const Tensor& slope, const Tensor& keep, double scale,
                                     Tensor& gx) {
  const int64_t total = g.numel();
  if (total == 0) return;
  const T *gp = g.data_ptr<T>(), *sp = slope.data_ptr<T>();
  const bool* kp = keep.defined() ? keep.data_ptr<bool>() : nullptr;
  T* o = gx.data_ptr<T>();
  if constexpr (std::is_same_v<T, float>) {
    const float sc = static_cast<float>(scale);
    parallel_for(total, 2, [&](int64_t i0, int64_t i1) {
      vec_bias_act_backward_rows(gp + i0, sp + i0, kp ? kp + i0 : nullptr, sc, o + i0, i1 - i0);
    });
  } else {
    const T sc = static_cast<T>(scale);
    parallel_for(total, 4, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) o[i] = (kp ? gp[i] * (kp[i] ? sc : T(0)) : gp[i]) * sp[i];
    });
  }
}

}  // namespace

void uniform(Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi) {
  ASC_DISPATCH_FLOAT(out.dtype(), "rand", [&] { uniform_typed<scalar_t>(out, seed, offset, lo, hi); });
}

void dropout(const Tensor& x, Tensor& out, Tensor& mask, uint64_t seed, uint64_t offset, double p, double scale) {
  ASC_DISPATCH_FLOAT(x.dtype(), "dropout", [&] { dropout_typed<scalar_t>(x, out, mask, seed, offset, p, scale); });
}

void bias_act_dropout(Unary act, const Tensor& x, const Tensor& bias, Tensor& out, Tensor& keep, Tensor& slope,
                      uint64_t seed, uint64_t offset, double p, double scale) {
  ASC_DISPATCH_FLOAT(x.dtype(), "bias_act_dropout",
                     [&] { bias_act_dropout_typed<scalar_t>(act, x, bias, out, keep, slope, seed, offset, p, scale); });
}

void bias_act_dropout_backward(const Tensor& g, const Tensor& slope, const Tensor& keep, double scale, Tensor& gx) {
  ASC_DISPATCH_FLOAT(g.dtype(), "bias_act_dropout_backward",
                     [&] { bias_act_dropout_backward_typed<scalar_t>(g, slope, keep, scale, gx); });
}

void normal(Tensor& out, uint64_t seed, uint64_t offset, double mean, double stddev) {
  ASC_DISPATCH_FLOAT(out.dtype(), "randn", [&] {
    scalar_t* p = out.data_ptr<scalar_t>();
    const int64_t n = out.numel();
    // Box-Muller: the pair (2j, 2j+1) uses block offset + j; lanes 0/1 give (u1, u2).
    parallel_for(n, 32, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        auto r = philox4x32(seed, offset + static_cast<uint64_t>(i / 2));
        double u1 = uint_to_unit_double(r[0], r[1]), u2 = uint_to_unit_double(r[2], r[3]);
        double rad = std::sqrt(-2.0 * std::log(1.0 - u1));  // 1 - u1 in (0, 1]: never log(0)
        double th = 2.0 * M_PI * u2;
        double z = (i % 2 == 0) ? rad * std::cos(th) : rad * std::sin(th);
        p[i] = static_cast<scalar_t>(mean + stddev * z);
      }
    });
  });
}

void randint(Tensor& out, uint64_t seed, uint64_t offset, int64_t low, int64_t high) {
  int64_t* p = out.data_ptr<int64_t>();
  // In uint64 (modular): high - low and low + offset overflow int64 for ranges wider than 2^63.
  const uint64_t range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
  const int64_t n = out.numel();
  for (int64_t i = 0; i < n; ++i) {
    auto r = philox4x32(seed, offset + static_cast<uint64_t>(i / 2));
    uint64_t v = (static_cast<uint64_t>(r[2 * (i % 2)]) << 32) | r[2 * (i % 2) + 1];
    p[i] = static_cast<int64_t>(static_cast<uint64_t>(low) + v % range);  // bias <= range / 2^64: negligible
  }
}

}  // namespace asc::cpu
