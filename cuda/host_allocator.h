#pragma once
// The caching allocator of pinned (page-locked) host memory behind Tensor::pin_memory().
//
// cudaHostAlloc is slow (it locks pages, tens of µs to ms) and an asynchronous host->device copy keeps reading
// its source after the call returns, so blocks are cached and reused with two rules:
//   * sizes are rounded up to a power of two (at least 4 KiB); a request takes a free block of its size class;
//   * a copy queued from a block records a CUDA event on the copy's stream (record_use); a freed block is
//     reused only once all its events have completed, so a pinned tensor dropped right after
//     `.to(cuda, non_blocking)` cannot be overwritten by its successor while the DMA still reads it.
// Thread-safe (one mutex). Blocks are never returned to the driver except by empty_pinned_cache().
#include <cstdint>

#include "cuda/cuda.h"  // PinnedStats

namespace asc::cuda {

// Marks the pinned block containing `host_ptr` as read or written by work queued on `stream` (a cudaStream_t
// cast to uintptr_t); false when host_ptr is not pinned memory of this allocator.
bool record_pinned_use(const void* host_ptr, uintptr_t stream);
// True when host_ptr lies in a live pinned block of this allocator.
bool is_pinned_pointer(const void* host_ptr);

}  // namespace asc::cuda
