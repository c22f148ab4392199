#pragma once
// How the CUDA backend library (libascender_cuda) plugs into the CPU library (libascender), as libtorch_cuda plugs
// into libtorch_cpu. The CPU library implements the public API of cuda/cuda.h and asc::DeviceScope (cuda/api.cpp)
// by forwarding to a registered Runtime, and runs CUDA kernels through a registered KernelTable (ops/kernels.h).
// The backend registers both as its library loads (cuda/backend.cpp); without it CUDA is simply absent:
// is_built() and is_available() are false and no CUDA tensor can be made. Plain C++ (no CUDA types): this header is
// part of the CPU library's side of the contract. Not installed: only the backend calls register_runtime.
#include <cstdint>
#include <string>

#include "cuda/cuda.h"

namespace asc::cuda {

// The backend's answers to the public API, one function per call of cuda/cuda.h (same meaning), plus the two
// DeviceScope needs. Called only while the backend is registered.
struct Runtime {
  int (*device_count)();
  std::string (*device_name)(int index);
  int (*compute_capability_major)(int index);
  // The current device of this thread, or -1 when no device is usable.
  int (*current_device_or_none)();
  void (*set_device)(int index);
  void (*restore_device)(int index) noexcept;  // DeviceScope's destructor: never throws
  void (*synchronize)();
  void (*set_allow_tf32)(bool allow);
  bool (*allow_tf32)();
  MemoryStats (*memory_stats)(int device);
  void (*reset_peak_memory_stats)(int device);
  void (*empty_cache)();
  void (*record_stream)(const void* data, uintptr_t stream);
  PinnedStats (*pinned_memory_stats)();
  void (*empty_pinned_cache)();
};

// Called once by the backend library as it loads; `runtime` must outlive the program.
void register_runtime(const Runtime* runtime);

}  // namespace asc::cuda
