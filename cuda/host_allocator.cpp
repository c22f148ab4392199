// The pinned host memory pool (see cuda/host_allocator.h) and the core/ Allocator that hands it to Storage.
#include "cuda/host_allocator.h"

#include <cuda_runtime.h>

#include <bit>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"
#include "cuda/check.h"

namespace asc::cuda {
namespace {

constexpr size_t kMinPinned = size_t{4} << 10;

class PinnedPool {
 public:
  void* malloc(size_t nbytes) {
    if (nbytes == 0) return nullptr;
    const size_t size = std::bit_ceil(std::max(nbytes, kMinPinned));
    std::lock_guard<std::mutex> lock(mu_);
    // Reuse a free block of this size class whose recorded copies have all completed.
    auto& list = free_[size];
    for (auto it = list.begin(); it != list.end(); ++it) {
      Block& b = blocks_.at(*it);
      if (!copies_done(b)) continue;
      void* p = *it;
      list.erase(it);
      b.live = true;
      stats_.allocated += size;
      ++stats_.num_allocs;
      ++stats_.num_cache_hits;
      return p;
    }
    void* p = nullptr;
    // Portable: the block is pinned for every device, not just the current one.
    cudaError_t e = cudaHostAlloc(&p, size, cudaHostAllocPortable);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      release_cached_locked();
      e = cudaHostAlloc(&p, size, cudaHostAllocPortable);
    }
    ASC_CHECK(e == cudaSuccess, "pin_memory: cudaHostAlloc of {} bytes failed: {} ({} bytes pinned already)", size,
              cudaGetErrorName(e), stats_.reserved);
    blocks_.emplace(p, Block{size, true, {}});
    ++stats_.num_host_allocs;
    ++stats_.num_allocs;
    stats_.allocated += size;
    stats_.reserved += size;
    return p;
  }

  // Called from Storage's destructor: must not throw.
  void free(void* p) {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(p);
    if (it == blocks_.end() || !it->second.live) {
      std::fprintf(stderr, "ascender: free of %p, which is not a live pinned block, ignored\n", p);
      return;
    }
    it->second.live = false;
    stats_.allocated -= it->second.size;
    free_[it->second.size].push_back(p);
  }

  bool record_use(const void* ptr, uintptr_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    Block* b = block_containing(ptr);
    if (!b) return false;
    cudaEvent_t ev = nullptr;
    ASC_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    const cudaError_t e = cudaEventRecord(ev, reinterpret_cast<cudaStream_t>(stream));
    if (e != cudaSuccess) cudaEventDestroy(ev);
    ASC_CUDA_CHECK(e);
    b->events.push_back(ev);
    ++stats_.num_recorded_uses;
    return true;
  }

  bool contains(const void* ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    return block_containing(ptr) != nullptr;
  }

  PinnedStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    release_cached_locked();
  }

 private:
  struct Block {
    size_t size;
    bool live;
    std::vector<cudaEvent_t> events;  // copies queued from/to this block, not yet seen complete
  };

  // The live block holding ptr (a tensor's data pointer may sit inside its block), or nullptr.
  Block* block_containing(const void* ptr) {
    auto it = blocks_.upper_bound(const_cast<void*>(ptr));
    if (it == blocks_.begin()) return nullptr;
    --it;
    const auto* base = static_cast<const char*>(it->first);
    const auto* q = static_cast<const char*>(ptr);
    return (it->second.live && q >= base && q < base + it->second.size) ? &it->second : nullptr;
  }

  // Drops the completed events of b; true when none is left pending.
  static bool copies_done(Block& b) {
    std::erase_if(b.events, [](cudaEvent_t ev) {
      const cudaError_t e = cudaEventQuery(ev);
      if (e == cudaErrorNotReady) {
        cudaGetLastError();
        return false;
      }
      ASC_CUDA_CHECK(e);
      cudaEventDestroy(ev);
      return true;
    });
    return b.events.empty();
  }

  void release_cached_locked() {
    for (auto& [size, list] : free_) {
      std::erase_if(list, [&](void* p) {
        Block& b = blocks_.at(p);
        if (!copies_done(b)) return false;
        ASC_CUDA_CHECK(cudaFreeHost(p));
        stats_.reserved -= b.size;
        ++stats_.num_host_frees;
        blocks_.erase(p);
        return true;
      });
    }
  }

  std::mutex mu_;
  std::map<void*, Block> blocks_;              // every block, by address
  std::map<size_t, std::vector<void*>> free_;  // free blocks by size class
  PinnedStats stats_;
};

// Never destroyed: pinned tensors may outlive static destruction.
PinnedPool& pool() {
  static PinnedPool* p = new PinnedPool;
  return *p;
}

// core/'s view of the pool: CPU storage in pinned blocks.
class PinnedAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, Device) override { return pool().malloc(nbytes); }
  void deallocate(void* ptr, size_t) override { pool().free(ptr); }
  void copy(void* dst, const void* src, size_t nbytes) override {
    if (nbytes) std::memcpy(dst, src, nbytes);
  }
};

// The pinned pool, when a device exists, found at its first use (core/allocator.h says why not at start-up).
const bool g_registered = [] {
  register_pinned_allocator_provider([]() -> Allocator* {
    static PinnedAllocator* const alloc = new PinnedAllocator;  // never destroyed (see cuda/runtime.cu)
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      n = 0;
    }
    return n > 0 ? alloc : nullptr;
  });
  return true;
}();

}  // namespace

bool record_pinned_use(const void* host_ptr, uintptr_t stream) { return pool().record_use(host_ptr, stream); }
bool is_pinned_pointer(const void* host_ptr) { return pool().contains(host_ptr); }
namespace impl {
PinnedStats pinned_memory_stats() { return pool().stats(); }
void empty_pinned_cache() { pool().empty_cache(); }
}  // namespace impl

}  // namespace asc::cuda
