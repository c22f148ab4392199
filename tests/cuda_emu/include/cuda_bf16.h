#pragma once
// CUDA emulator (see cuda_runtime.h): __nv_bfloat16, bfloat16 (8 exponent bits, 7 fraction bits).
#include "asc_emu_float16.h"

struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(asc::cuda::emu::round_to_small_float(f, 7, 8)) {}
  __nv_bfloat16(double d) : __x(asc::cuda::emu::round_to_small_float(d, 7, 8)) {}
  __nv_bfloat16(int v) : __nv_bfloat16(static_cast<double>(v)) {}
  __nv_bfloat16(long long v) : __nv_bfloat16(static_cast<double>(v)) {}
  __nv_bfloat16(unsigned long long v) : __nv_bfloat16(static_cast<double>(v)) {}
  operator float() const { return asc::cuda::emu::small_float_value(__x, 7, 8); }
};

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __double2bfloat16(double d) { return __nv_bfloat16(d); }
inline float __bfloat162float(__nv_bfloat16 h) { return static_cast<float>(h); }
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* p, __nv_bfloat16 v) {
  const __nv_bfloat16 old = *p;
  *p = __nv_bfloat16(static_cast<double>(static_cast<float>(old)) + static_cast<double>(static_cast<float>(v)));
  return old;
}
