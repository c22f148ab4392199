#pragma once
// CUDA runtime basics: availability, device count, memory. Always declared, and part of the CPU library: the CUDA
// backend is a library of its own (CMake target ascender::cuda, libascender_cuda) that a program links to use GPUs.
// Without it — or on a machine without a GPU — is_available() is false and CUDA tensors give a clear asc::Error.
//   if (asc::cuda::is_available()) x = x.to(asc::Device::cuda());
#include <cstddef>
#include <cstdint>
#include <string>

namespace asc::cuda {

// Whether this program links the CUDA backend (ascender::cuda), GPU or not.
bool is_built();
// Whether a CUDA device can be used: the backend is linked and the machine has at least one GPU.
bool is_available();
int device_count();
// Name of device `index` (e.g. "NVIDIA H100 80GB HBM3"); error when unavailable.
std::string device_name(int index = 0);

// Whether device `index` computes in bfloat16 natively (compute capability 8.0 and later; torch.cuda.is_bf16_supported
// with including_emulation=False); false when no device is available.
bool is_bf16_supported(int index = 0);

// Waits for all work queued on the current device (error when no device).
void synchronize();
// TF32 tensor-core math for float32 matmuls (off by default: results then match float32 GEMM to ~1e-6 rel.).
void set_allow_tf32(bool allow);
bool allow_tf32();

// Counters of the CUDA caching allocator (cuda/caching_allocator.h), per device. Byte counts are block sizes:
// requests rounded up to 512 B (a large block also keeps a remainder of up to 1 MiB that was not worth
// splitting off); "reserved" is the device memory held in segments, live or cached.
struct MemoryStats {
  size_t allocated = 0;  // bytes in live blocks
  size_t peak_allocated = 0;
  uint64_t num_device_mallocs = 0;  // segments obtained from the device (cudaMalloc calls that succeeded)
  size_t reserved = 0;              // bytes of segments held (allocated + cached free)
  size_t peak_reserved = 0;
  uint64_t num_device_frees = 0;  // segments returned to the device (empty_cache, out-of-memory recovery)
  uint64_t num_allocs = 0;        // successful allocations
  uint64_t num_frees = 0;
  uint64_t num_cache_hits = 0;      // allocations served from cached blocks without a device malloc
  uint64_t num_oom_retries = 0;     // device mallocs that failed, emptied the cache and were retried
  uint64_t num_deferred_frees = 0;  // frees deferred because the block was used on other streams
};
// Statistics of device `device` (-1: the current device); all zero without a CUDA device.
MemoryStats memory_stats(int device = -1);
// Peak counters := current values, for device `device` (-1: the current device).
void reset_peak_memory_stats(int device = -1);
// Returns the cached, fully free segments of every device to the driver (live tensors are untouched).
void empty_cache();
// Marks the CUDA buffer `data` (a tensor's storage data pointer) as used on `stream` (a cudaStream_t cast to
// uintptr_t) in addition to the stream it was allocated on: freeing it is deferred until that stream is idle.
void record_stream(const void* data, uintptr_t stream);

// Counters of the pinned host memory pool behind Tensor::pin_memory() (cuda/host_allocator.h).
//   auto before = asc::cuda::pinned_memory_stats().num_host_allocs;  // flat in a steady loop: blocks are reused
struct PinnedStats {
  size_t allocated = 0;            // bytes in live blocks (sizes rounded up to a power of two, >= 4 KiB)
  size_t reserved = 0;             // bytes of pinned memory held, live or cached
  uint64_t num_host_allocs = 0;    // cudaHostAlloc calls
  uint64_t num_host_frees = 0;     // cudaFreeHost calls (empty_pinned_cache)
  uint64_t num_allocs = 0;         // blocks handed out
  uint64_t num_cache_hits = 0;     // ... of which came from the cache
  uint64_t num_recorded_uses = 0;  // asynchronous copies recorded against a block
};
PinnedStats pinned_memory_stats();
// Returns every cached pinned block whose copies have completed to the driver.
void empty_pinned_cache();

}  // namespace asc::cuda
