#pragma once
// CUDA emulator (see cuda_runtime.h): __nv_bfloat16, bfloat16 (8 exponent bits, 7 fraction bits).
#include "asc_emu_float16.h"

struct __nv_bfloat16 : asc::cuda::emu::SmallFloat<7, 8> {
  using SmallFloat::SmallFloat;
};

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __double2bfloat16(double d) { return __nv_bfloat16(d); }
inline float __bfloat162float(__nv_bfloat16 h) { return static_cast<float>(h); }
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* p, __nv_bfloat16 v) { return asc::cuda::emu::atomic_add_small(p, v); }
