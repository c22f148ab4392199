#pragma once
// Tensor-core products of one warp, D = A B + C, through PTX's mma.sync — the one header every tensor-core kernel of
// cuda/ uses, so that each also runs on the CPU emulator (tests/cuda_emu), which implements the same instructions in
// software from the same fragment layouts:
//
//   mma::FragA a;  mma::FragB b;  mma::FragC c{};            // c = 0
//   mma::load_a<mma::Kind::BF16>(a, Qs + 16 * w * ld, ld);   // a 16 × 16 tile of a row-major shared array
//   mma::load_b_nk<mma::Kind::BF16>(b, Ks + 8 * j * ld, ld); // keys j·8 .. j·8+7 as the columns of B (B = Kᵀ)
//   mma::mma<mma::Kind::BF16>(c, a, b);                      // c += A B, float32 accumulators
//
// Shapes: m16n8k16 for bfloat16 / float16 (sm_80+), m16n8k8 for TF32 (float32 operands whose low 13 fraction bits
// the tensor core ignores; load_* round them to nearest, ties away, as cvt.rna.tf32.f32). Every lane of the warp must
// execute each mma (the instruction is warp-collective; the emulator fails the launch otherwise).
//
// The fragments (PTX ISA, "Matrix fragments for mma.m16n8k16 / m16n8k8"): lane = 4 g + t, g = lane / 4 (the
// "group", a row of A / C or a column of B), t = lane % 4. Two 16-bit elements share a register, the lower index
// in the lower half.
//   m16n8k16  A (16 × 16): r0 = A[g][2t, 2t+1]  r1 = A[g+8][2t, 2t+1]  r2 = A[g][2t+8, 2t+9]  r3 = A[g+8][2t+8, 2t+9]
//             B (16 × 8):  r0 = B[2t, 2t+1][g]  r1 = B[2t+8, 2t+9][g]
//   m16n8k8   A (16 × 8):  r0 = A[g][t]  r1 = A[g+8][t]  r2 = A[g][t+4]  r3 = A[g+8][t+4]      (one tf32 each)
//             B (8 × 8):   r0 = B[t][g]  r1 = B[t+4][g]
//   C, D (16 × 8, float32): x0, x1 = C[g][2t, 2t+1]   x2, x3 = C[g+8][2t, 2t+1]
// C++17 and CUDA headers only (included from .cu files, which the emulator compiles as C++).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace asc::cuda::mma {

enum class Kind { BF16, F16, TF32 };

// The operand kind of a storage type: __nv_bfloat16 → BF16, __half → F16, float → TF32.
template <class T>
constexpr Kind kind_of() {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return Kind::BF16;
  else if constexpr (std::is_same_v<T, __half>)
    return Kind::F16;
  else
    return Kind::TF32;
}

// K of one instruction: 16 for the 16-bit kinds, 8 for TF32. M = 16, N = 8 always.
template <Kind K>
inline constexpr int kK = K == Kind::TF32 ? 8 : 16;

struct FragA {
  uint32_t r[4];
};
struct FragB {
  uint32_t r[2];
};
struct FragC {
  float x[4];
};

// ---- operand conversion ------------------------------------------------------------------------------------------

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(double x) { return static_cast<float>(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

__device__ __forceinline__ uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// x as a TF32 operand: rounded to 10 fraction bits, to nearest with ties away from zero (cvt.rna.tf32.f32); NaN and
// infinity pass unchanged.
__device__ __forceinline__ uint32_t tf32_bits(float x) {
#if defined(__CUDA_ARCH__) && !defined(ASC_CUDA_EMULATION_RUNTIME)
  uint32_t u;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(x));
  return u;
#else
  const uint32_t u = float_bits(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return u;
  return (u + 0x1000u) & 0xffffe000u;  // a carry into the exponent is the correct rounding up
#endif
}

// Two values as one register of 16-bit operands (lo in the lower half), rounded to nearest even.
template <Kind K>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  static_assert(K != Kind::TF32, "TF32 operands take a register each");
  uint16_t a, b;
  if constexpr (K == Kind::BF16) {
    const __nv_bfloat16 l = __float2bfloat16(lo), h = __float2bfloat16(hi);
    std::memcpy(&a, &l, 2), std::memcpy(&b, &h, 2);
  } else {
    const __half l = __float2half(lo), h = __float2half(hi);
    std::memcpy(&a, &l, 2), std::memcpy(&b, &h, 2);
  }
  return uint32_t(a) | uint32_t(b) << 16;
}

// The 16-bit storage type whose values are the operands of kind K as they are (bfloat16 for BF16, half for F16).
template <Kind K, class T>
inline constexpr bool kStored = (K == Kind::BF16 && std::is_same_v<T, __nv_bfloat16>) ||
                                (K == Kind::F16 && std::is_same_v<T, __half>);

// lo and hi as one register of 16-bit operands: their bits when they are stored as the operand (no conversion),
// else rounded from float.
template <Kind K, class T>
__device__ __forceinline__ uint32_t two(const T& lo, const T& hi) {
  if constexpr (kStored<K, T>) {
    uint16_t a, b;
    std::memcpy(&a, &lo, 2), std::memcpy(&b, &hi, 2);
    return uint32_t(a) | uint32_t(b) << 16;
  } else {
    return pack2<K>(to_float(lo), to_float(hi));
  }
}

// p[0] and p[1] as one register of 16-bit operands; stored as the operand, p 4-byte aligned, they are one load.
template <Kind K, class T>
__device__ __forceinline__ uint32_t adjacent(const T* p) {
  if constexpr (kStored<K, T>) {
#if defined(__CUDA_ARCH__) && !defined(ASC_CUDA_EMULATION_RUNTIME)
    return *reinterpret_cast<const uint32_t*>(p);
#else
    uint32_t u;
    std::memcpy(&u, p, 4);
    return u;
#endif
  } else {
    return two<K>(p[0], p[1]);
  }
}

// ---- fragment loads ----------------------------------------------------------------------------------------------
// From any memory (shared or global), any element type (float, double, __nv_bfloat16, __half), converted to the
// kind's operand with one rounding. `p` points at the tile's element (0, 0), `ld` is its row stride in elements.
// A tile stored as the operands (kStored: bfloat16 for BF16, half for F16) is read without conversion, a pair of
// adjacent elements in one 4-byte load: then p is 4-byte aligned and ld even.

// The lane: the linear thread index in the block modulo 32, as the hardware forms warps.
__device__ __forceinline__ int lane() {
  return static_cast<int>(((threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x) % 32);
}
__device__ __forceinline__ int lane_g() { return lane() / 4; }
__device__ __forceinline__ int lane_t() { return lane() % 4; }

// A: a (16 × kK) tile of a row-major array, A[m][k] = p[m * ld + k].
template <Kind K, class T>
__device__ __forceinline__ void load_a(FragA& a, const T* p, int64_t ld) {
  const int g = lane_g(), t = lane_t();
  if constexpr (K == Kind::TF32) {
    a.r[0] = tf32_bits(to_float(p[g * ld + t])), a.r[1] = tf32_bits(to_float(p[(g + 8) * ld + t]));
    a.r[2] = tf32_bits(to_float(p[g * ld + t + 4])), a.r[3] = tf32_bits(to_float(p[(g + 8) * ld + t + 4]));
  } else {
    auto at = [&](int m, int k) { return adjacent<K>(p + m * ld + k); };
    a.r[0] = at(g, 2 * t), a.r[1] = at(g + 8, 2 * t), a.r[2] = at(g, 2 * t + 8), a.r[3] = at(g + 8, 2 * t + 8);
  }
}

// B from an (8 × kK) row-major tile holding B's columns as rows: B[k][n] = p[n * ld + k] (B = Xᵀ for X stored
// (n, k), as the keys in q kᵀ).
template <Kind K, class T>
__device__ __forceinline__ void load_b_nk(FragB& b, const T* p, int64_t ld) {
  const int g = lane_g(), t = lane_t();
  if constexpr (K == Kind::TF32) {
    b.r[0] = tf32_bits(to_float(p[g * ld + t])), b.r[1] = tf32_bits(to_float(p[g * ld + t + 4]));
  } else {
    b.r[0] = adjacent<K>(p + g * ld + 2 * t), b.r[1] = adjacent<K>(p + g * ld + 2 * t + 8);
  }
}

// B from a (kK × 8) row-major tile: B[k][n] = p[k * ld + n] (the values in P v).
template <Kind K, class T>
__device__ __forceinline__ void load_b_kn(FragB& b, const T* p, int64_t ld) {
  const int g = lane_g(), t = lane_t();
  if constexpr (K == Kind::TF32) {
    b.r[0] = tf32_bits(to_float(p[t * ld + g])), b.r[1] = tf32_bits(to_float(p[(t + 4) * ld + g]));
  } else {
    auto at = [&](int k) { return two<K>(p[k * ld + g], p[(k + 1) * ld + g]); };
    b.r[0] = at(2 * t), b.r[1] = at(2 * t + 8);
  }
}

// The A operand (16 × 16) of a next product from two accumulator tiles, columns 0-7 (c0) and 8-15 (c1), without
// memory: the C layout's [g][2t, 2t+1] pairs are the A layout's (as the probabilities in flash attention's P v).
template <Kind K>
__device__ __forceinline__ FragA a_from_c(const FragC& c0, const FragC& c1) {
  static_assert(K != Kind::TF32, "the m16n8k8 TF32 A layout differs from C's; go through memory");
  return FragA{
      {pack2<K>(c0.x[0], c0.x[1]), pack2<K>(c0.x[2], c0.x[3]), pack2<K>(c1.x[0], c1.x[1]), pack2<K>(c1.x[2], c1.x[3])}};
}

// ---- the instruction ---------------------------------------------------------------------------------------------

#if defined(ASC_CUDA_EMULATION_RUNTIME)
namespace detail {
inline float operand(Kind k, uint32_t r, int half) {
  if (k == Kind::TF32) {
    const uint32_t u = r & 0xffffe000u;  // the tensor core reads 19 bits
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const uint16_t b = static_cast<uint16_t>(half ? r >> 16 : r & 0xffffu);
  return k == Kind::BF16 ? emu::small_float_value(b, 7, 8) : emu::small_float_value(b, 10, 5);
}
}  // namespace detail

// The emulator's mma.sync: the warp's fragments gathered, A and B rebuilt from the layouts above, this lane's four
// accumulators formed in double (the tensor core's own summation order and internal width are unspecified; a
// float32 result within a rounding of the exact sum).
template <Kind K>
inline void mma(FragC& d, const FragA& a, const FragB& b) {
  constexpr int kk = kK<K>;
  uint64_t mine[3], all[32 * 3];
  std::memcpy(mine, a.r, 16), std::memcpy(mine + 2, b.r, 8);
  emu::warp_gather(0xffffffffu, mine, 3, all);
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    uint32_t r[6];
    std::memcpy(r, all + 3 * l, 24);
    const int g = l / 4, t = l % 4;
    if constexpr (K == Kind::TF32) {
      A[g][t] = detail::operand(K, r[0], 0), A[g + 8][t] = detail::operand(K, r[1], 0);
      A[g][t + 4] = detail::operand(K, r[2], 0), A[g + 8][t + 4] = detail::operand(K, r[3], 0);
      B[t][g] = detail::operand(K, r[4], 0), B[t + 4][g] = detail::operand(K, r[5], 0);
    } else {
      for (int h = 0; h < 2; ++h) {
        A[g][2 * t + h] = detail::operand(K, r[0], h), A[g + 8][2 * t + h] = detail::operand(K, r[1], h);
        A[g][2 * t + 8 + h] = detail::operand(K, r[2], h), A[g + 8][2 * t + 8 + h] = detail::operand(K, r[3], h);
        B[2 * t + h][g] = detail::operand(K, r[4], h), B[2 * t + 8 + h][g] = detail::operand(K, r[5], h);
      }
    }
  }
  const int g = lane_g(), t = lane_t();
  for (int i = 0; i < 4; ++i) {
    const int m = g + (i >= 2 ? 8 : 0), n = 2 * t + (i & 1);
    double s = d.x[i];
    for (int k = 0; k < kk; ++k) s += static_cast<double>(A[m][k]) * B[k][n];
    d.x[i] = static_cast<float>(s);
  }
}
#else
template <Kind K>
__device__ __forceinline__ void mma(FragC& d, const FragA& a, const FragB& b) {
#if defined(__CUDA_ARCH__)
  if constexpr (K == Kind::TF32)
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d.x[0]), "+f"(d.x[1]), "+f"(d.x[2]), "+f"(d.x[3])
        : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
  else if constexpr (K == Kind::BF16)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d.x[0]), "+f"(d.x[1]), "+f"(d.x[2]), "+f"(d.x[3])
        : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d.x[0]), "+f"(d.x[1]), "+f"(d.x[2]), "+f"(d.x[3])
        : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
#endif
}
#endif

}  // namespace asc::cuda::mma
