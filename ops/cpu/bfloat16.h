#pragma once
// float32 -> bfloat16 (its bit pattern: the top half of a float32), rounded once to nearest, ties to even, as CUDA's
// conversions do; a NaN stays a quiet NaN of the same sign instead of rounding to infinity. Branch-free apart from the
// NaN select, so a loop over contiguous floats vectorises.
#include <cstdint>
#include <cstring>

namespace asc::cpu {

inline uint16_t bfloat16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float bfloat16_value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace asc::cpu
