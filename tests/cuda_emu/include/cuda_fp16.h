#pragma once
// CUDA emulator (see cuda_runtime.h): __half, IEEE binary16 (5 exponent bits, 10 fraction bits).
#include "asc_emu_float16.h"

struct __half : asc::cuda::emu::SmallFloat<10, 5> {
  using SmallFloat::SmallFloat;
};

inline __half __float2half(float f) { return __half(f); }
inline __half __double2half(double d) { return __half(d); }
inline float __half2float(__half h) { return static_cast<float>(h); }
inline __half atomicAdd(__half* p, __half v) { return asc::cuda::emu::atomic_add_small(p, v); }
