#pragma once
// Storage memory comes from an Allocator chosen by device. The CPU allocator is built in; the CUDA backend
// registers its own (cudaMalloc now, a caching allocator later) when it is compiled in and a GPU is present.
#include <cstddef>

#include "core/device.h"

namespace asc {

class Allocator {
 public:
  virtual ~Allocator() = default;
  // nbytes on `device` (the CUDA allocator serves that device's pool, whatever device is current).
  virtual void* allocate(size_t nbytes, Device device) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  // Copies between two buffers of this allocator's device (the CUDA allocator: also host<->device, blocking).
  virtual void copy(void* dst, const void* src, size_t nbytes) = 0;
  // Like copy, but may return before the copy has finished when the host side is pinned memory (see
  // Tensor::pin_memory): the CUDA allocator then queues it on the device's current stream. Later work on that
  // stream sees the data; the host must not write the source until the stream has reached the copy.
  virtual void copy_async(void* dst, const void* src, size_t nbytes) { copy(dst, src, nbytes); }
};

// CPU memory counters for benchmarks: bytes of live tensor storage in blocks above 4 KiB, and their peak since the
// last reset. Smaller blocks come from per-thread caches and are not counted (they are a rounding error next to
// the tensors whose memory a benchmark compares).
//   asc::reset_cpu_peak_memory(); run(); size_t peak = asc::cpu_memory_stats().peak_allocated;
struct CpuMemoryStats {
  size_t allocated = 0;
  size_t peak_allocated = 0;
  // Freed blocks above 4 KiB the allocator keeps mapped for the next tensor of their size class (at most the
  // process's peak of live tensor memory, at least 256 MiB, at most an eighth of the machine's memory): resident
  // memory beyond `allocated`.
  size_t cached = 0;
};
CpuMemoryStats cpu_memory_stats();
void reset_cpu_peak_memory();  // peak := current
// Returns the cached blocks to the system (like asc::cuda::empty_cache for a device): after a large model has been
// freed, or before measuring the process's resident memory.
//   model.reset(); asc::empty_cpu_cache();
void empty_cpu_cache();

// Bytes of tensor storage (any device, every size) the calling thread has allocated since it started: the
// profiler's per-op allocation counts (core/profiler.h).
size_t thread_allocated_bytes();

// The allocator for `device`; throws asc::Error when that device type has no backend in this build/machine.
Allocator* allocator_for(Device device);
// Installs the allocator for a device type (a test's stand-in device; nullptr removes it).
void register_allocator(Device::Type type, Allocator* alloc);

// The allocator of page-locked ("pinned") host memory, which the GPU can read and write by DMA while the host
// goes on; nullptr when there is no CUDA device. CPU tensors whose storage comes from it are "pinned".
Allocator* pinned_allocator();

// How the CUDA backend installs its allocators as its library loads: a function that returns the allocator, or
// nullptr when the machine has no device, called once, at the first use of that device type. Not at load: asking
// the driver for its devices initialises CUDA, which a program must not pay for (nor suffer: before a fork(), or
// ahead of a tool such as compute-sanitizer that must attach first) unless it uses a device.
using AllocatorProvider = Allocator* (*)();
void register_allocator_provider(Device::Type type, AllocatorProvider provider);
void register_pinned_allocator_provider(AllocatorProvider provider);

}  // namespace asc
