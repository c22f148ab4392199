#pragma once
// CUDA emulator (see cuda_runtime.h): __half, IEEE binary16.
#include "asc_emu_float16.h"

struct __half {
  unsigned short __x;
  __half() = default;
  __half(float f) : __x(asc::cuda::emu::round_to_small_float(f, 10, 5)) {}
  __half(double d) : __x(asc::cuda::emu::round_to_small_float(d, 10, 5)) {}
  __half(int v) : __half(static_cast<double>(v)) {}
  __half(long long v) : __half(static_cast<double>(v)) {}
  __half(unsigned long long v) : __half(static_cast<double>(v)) {}
  operator float() const { return asc::cuda::emu::small_float_value(__x, 10, 5); }
};

inline __half __float2half(float f) { return __half(f); }
inline __half __double2half(double d) { return __half(d); }
inline float __half2float(__half h) { return static_cast<float>(h); }
inline __half atomicAdd(__half* p, __half v) {
  const __half old = *p;
  *p = __half(static_cast<double>(static_cast<float>(old)) + static_cast<double>(static_cast<float>(v)));
  return old;
}
