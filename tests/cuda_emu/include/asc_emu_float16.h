#pragma once
// The 16-bit float types of the CUDA emulator (cuda_fp16.h, cuda_bf16.h): storage, conversions with a single
// round-to-nearest-even from float or double (as NVIDIA's __float2half / __double2bfloat16 do), atomicAdd.
#include <cmath>
#include <cstdint>
#include <cstring>

namespace asc::cuda::emu {

// x rounded to a binary float with `mant` fraction bits and `exp_bits` exponent bits (IEEE layout, subnormals,
// infinities, quiet NaN), returned as its bit pattern. Scaling by powers of two is exact in double, so
// std::nearbyint (round half to even) is the only rounding.
inline uint16_t round_to_small_float(double x, int mant, int exp_bits) {
  const int bias = (1 << (exp_bits - 1)) - 1, max_field = (1 << exp_bits) - 1;
  const uint16_t sign = std::signbit(x) ? static_cast<uint16_t>(1u << (mant + exp_bits)) : 0;
  if (std::isnan(x)) return static_cast<uint16_t>(sign | (max_field << mant) | (1u << (mant - 1)));
  const double a = std::fabs(x);
  if (std::isinf(a)) return static_cast<uint16_t>(sign | (max_field << mant));
  const int emin = 1 - bias;
  if (a < std::ldexp(1.0, emin)) {  // subnormal range: multiples of 2^(emin - mant); rounding up may make it normal
    const double q = std::nearbyint(std::ldexp(a, mant - emin));
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));
  }
  int e = 0;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  int exponent = e - 1;
  double q = std::nearbyint(std::ldexp(a, mant - exponent));  // in [2^mant, 2^(mant+1)]
  if (q == std::ldexp(1.0, mant + 1)) {
    q = std::ldexp(1.0, mant);
    ++exponent;
  }
  if (exponent + bias >= max_field) return static_cast<uint16_t>(sign | (max_field << mant));
  return static_cast<uint16_t>(sign | ((exponent + bias) << mant) | (static_cast<uint32_t>(q) - (1u << mant)));
}

inline float small_float_value(uint16_t bits, int mant, int exp_bits) {
  const int bias = (1 << (exp_bits - 1)) - 1, max_field = (1 << exp_bits) - 1;
  const bool neg = bits >> (mant + exp_bits);
  const int field = (bits >> mant) & max_field;
  const uint32_t frac = bits & ((1u << mant) - 1);
  double v;
  if (field == 0)
    v = std::ldexp(static_cast<double>(frac), 1 - bias - mant);
  else if (field == max_field)
    v = frac ? NAN : INFINITY;
  else
    v = std::ldexp(static_cast<double>(frac | (1u << mant)), field - bias - mant);
  return static_cast<float>(neg ? -v : v);
}

// The storage and conversions of __half (Mant = 10, ExpBits = 5) and __nv_bfloat16 (7, 8): the bits in __x, as
// NVIDIA's types keep them; every conversion in rounds once.
template <int Mant, int ExpBits>
struct SmallFloat {
  unsigned short __x;
  SmallFloat() = default;
  SmallFloat(float f) : __x(round_to_small_float(f, Mant, ExpBits)) {}
  SmallFloat(double d) : __x(round_to_small_float(d, Mant, ExpBits)) {}
  SmallFloat(int v) : SmallFloat(static_cast<double>(v)) {}
  SmallFloat(long long v) : SmallFloat(static_cast<double>(v)) {}
  SmallFloat(unsigned long long v) : SmallFloat(static_cast<double>(v)) {}
  operator float() const { return small_float_value(__x, Mant, ExpBits); }
};

// atomicAdd on a 16-bit float: the sum of the two values rounded once (the emulator runs one thread at a time).
template <class F>
F atomic_add_small(F* p, F v) {
  const F old = *p;
  *p = F(static_cast<double>(static_cast<float>(old)) + static_cast<double>(static_cast<float>(v)));
  return old;
}

}  // namespace asc::cuda::emu
