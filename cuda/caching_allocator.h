#pragma once
// A caching device-memory allocator (in the spirit of PyTorch's CUDACachingAllocator, much simpler).
//
// Device memory is obtained from a DeviceMemory backend in segments and carved into blocks; freed blocks are
// cached and reused, so a steady training loop makes no device malloc after its first step.
//   * sizes are rounded up to 512 B; requests <= 1 MiB ("small") are carved from 2 MiB segments, larger ones
//     get a segment of their own rounded up to 2 MiB;
//   * free blocks live in size-ordered sets per (stream, small/large pool); allocation is best-fit; a block is
//     split when the remainder is worth keeping (>= 512 B small, > 1 MiB large); a freed block is coalesced
//     with its free neighbours in the same segment;
//   * stream-aware: a block belongs to the stream it was allocated on and returns to that stream's pool.
//     record_stream(ptr, s) marks use on another stream s: the block's free is then deferred until the backend
//     reports every such stream idle;
//   * out of memory: the cached fully free segments are returned to the device (and streams holding deferred
//     frees are synchronized), the malloc is retried once, then asc::Error names the size and the statistics;
//   * freeing an unknown pointer, an interior pointer or freeing twice throws asc::Error; one mutex guards all.
//
// The backend is an interface, so the allocator is plain C++ (tests run it on host memory with a mock); the
// CUDA backend (cuda/runtime.cu) implements it with cudaMalloc / cudaFree / cudaStreamQuery.
// This header is C++17-clean (included by .cu files): no fmt, no core/error.h.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda.h"  // MemoryStats

namespace asc::cuda {

// Streams are opaque integers here (a cudaStream_t cast to uintptr_t; 0 is the legacy default stream).
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // nbytes of device memory, or nullptr when the device is out of memory (other failures may throw).
  virtual void* malloc(size_t nbytes) = 0;
  virtual void free(void* ptr) = 0;
  // True when every piece of work queued on `stream` so far has completed (used for deferred frees).
  virtual bool stream_idle(uintptr_t stream) = 0;
  // Blocks until `stream` is idle (used only on the out-of-memory path to complete deferred frees).
  virtual void synchronize(uintptr_t stream) = 0;
};

class CachingAllocator {
 public:
  static constexpr size_t kMinBlock = 512;                  // rounding granularity and smallest block
  static constexpr size_t kSmallSize = size_t{1} << 20;     // requests up to this size use the small pool
  static constexpr size_t kSmallSegment = size_t{2} << 20;  // segment size of the small pool
  static constexpr size_t kLargeRound = size_t{2} << 20;    // large segments are rounded up to this

  // `backend` is not owned and must outlive the allocator; `name` (e.g. "cuda:0") appears in error messages.
  explicit CachingAllocator(DeviceMemory* backend, std::string name = "device");
  // Returns every segment to the backend (live blocks included: their pointers become invalid).
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least nbytes for use on `stream` (nullptr for nbytes == 0). Throws asc::Error when out of
  // memory after emptying the cache and retrying once.
  void* malloc(size_t nbytes, uintptr_t stream);
  // Returns the block of a pointer obtained from malloc (nullptr is a no-op). Throws on anything else.
  void free(void* ptr);
  // Marks the live block at ptr as used by `stream` too: its free waits until that stream is idle.
  void record_stream(const void* ptr, uintptr_t stream);
  // Returns every cached, fully free segment to the backend (deferred frees whose streams are idle first).
  void empty_cache();

  MemoryStats stats() const;
  void reset_peak_stats();           // peaks := current values
  bool owns(const void* ptr) const;  // ptr is a live block of this allocator

  // Rounded block size and segment size for a request (the policy, exposed for tests and diagnostics).
  static size_t round_size(size_t nbytes);
  static size_t segment_size(size_t rounded);

  // Layout introspection (tests, diagnostics): every segment with its blocks in address order.
  enum class BlockState { Free, Live, PendingFree };
  struct BlockInfo {
    size_t offset;  // from the segment base
    size_t size;
    BlockState state;
  };
  struct SegmentInfo {
    uintptr_t base;
    size_t size;
    uintptr_t stream;
    bool small;
    std::vector<BlockInfo> blocks;
  };
  std::vector<SegmentInfo> snapshot() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace asc::cuda
