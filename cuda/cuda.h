#pragma once
// CUDA runtime basics: availability, device count, memory. Always declared; in a build without CUDA (or on a
// machine without a GPU) cuda_is_available() is false and CUDA tensors give a clear asc::Error.
//   if (asc::cuda::is_available()) x = x.to(asc::Device::cuda());
#include <cstddef>
#include <cstdint>
#include <string>

namespace asc::cuda {

bool is_available();
int device_count();
// Name of device `index` (e.g. "NVIDIA H100 80GB HBM3"); error when unavailable.
std::string device_name(int index = 0);

// Waits for all work queued on the current device (error when no device).
void synchronize();
// TF32 tensor-core math for float32 matmuls (off by default: results then match float32 GEMM to ~1e-6 rel.).
void set_allow_tf32(bool allow);
bool allow_tf32();

// Byte counters of the CUDA allocator (device mallocs are counted to show caching working later).
struct MemoryStats {
  size_t allocated = 0;      // bytes in live tensors
  size_t peak_allocated = 0;
  uint64_t num_device_mallocs = 0;
};
MemoryStats memory_stats();

}  // namespace asc::cuda
