#include "core/storage.h"

#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "core/error.h"

namespace asc {
namespace {

// cpu_memory_stats(): live bytes in blocks above the cache's 4 KiB, and their peak.
std::atomic<size_t> g_cpu_live{0}, g_cpu_peak{0};
thread_local size_t t_allocated = 0;  // thread_allocated_bytes()

void count_alloc(size_t bytes) {
  const size_t now = g_cpu_live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  size_t peak = g_cpu_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_cpu_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

// 64-byte aligned host memory (one cache line; lets the compiler use aligned vector loads). Blocks up to 4 KiB
// are recycled through a small per-thread cache: small temporaries are created and freed at a high rate
// (autograd, per-op outputs) and malloc/free dominate their cost. Sanitizer builds skip the cache so that
// use-after-free stays detectable.
// The machine's physical memory in bytes (SIZE_MAX when the system does not say).
size_t physical_memory() {
  static const size_t bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : SIZE_MAX;
  }();
  return bytes;
}

class CpuAllocator final : public Allocator {
  static constexpr size_t kLine = 64, kMaxCached = 4096, kClasses = kMaxCached / kLine, kPerClass = 16;
  struct Cache {
    void* blocks[kClasses][kPerClass];
    int count[kClasses] = {};
    ~Cache() {
      for (size_t c = 0; c < kClasses; ++c)
        for (int i = 0; i < count[c]; ++i) std::free(blocks[c][i]);
    }
  };
  static Cache& cache() {
    thread_local Cache c;
    return c;
  }
#if defined(ASC_SANITIZE_BUILD)
  static constexpr bool kUseCache = false;
#else
  static constexpr bool kUseCache = true;
#endif

 public:
  void* allocate(size_t nbytes, Device) override {
    if (nbytes == 0) return nullptr;
    // A request beyond this machine's memory is refused before the system allocator sees it: its answer would be a
    // pointer the kernel kills the process for later (overcommit) or, under AddressSanitizer, an abort.
    ASC_CHECK(nbytes <= physical_memory(),
              "cpu allocator: out of memory: {} bytes requested, more than this "
              "machine's {} bytes of memory",
              nbytes, physical_memory());
    size_t rounded = (nbytes + kLine - 1) & ~(kLine - 1);
    if (kUseCache && rounded <= kMaxCached) {
      Cache& c = cache();
      size_t cls = rounded / kLine - 1;
      if (c.count[cls] > 0) return c.blocks[cls][--c.count[cls]];
    }
    void* p = std::aligned_alloc(kLine, rounded);
    ASC_CHECK(p != nullptr, "cpu allocator: out of memory allocating {} bytes", nbytes);
    if (rounded > kMaxCached) count_alloc(rounded);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    size_t rounded = (nbytes + kLine - 1) & ~(kLine - 1);
    if (kUseCache && rounded <= kMaxCached) {
      Cache& c = cache();
      size_t cls = rounded / kLine - 1;
      if (c.count[cls] < static_cast<int>(kPerClass)) {
        c.blocks[cls][c.count[cls]++] = ptr;
        return;
      }
    }
    if (rounded > kMaxCached) g_cpu_live.fetch_sub(rounded, std::memory_order_relaxed);
    std::free(ptr);
  }
  void copy(void* dst, const void* src, size_t nbytes) override {
    if (nbytes) std::memcpy(dst, src, nbytes);
  }
};

CpuAllocator g_cpu_allocator;

// glibc serves blocks above 128 KiB (adaptive up to 32 MiB) with mmap and returns them with munmap, so a loop
// that allocates a fresh multi-MiB output every step pays a page fault per 4 KiB page each time (for a 1024^2
// float32 matmul output: ~8% of the GEMM). Keeping blocks up to 256 MiB in the heap lets them be reused.
const bool g_malloc_tuned = [] {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  return true;
}();
Allocator* g_allocators[2] = {&g_cpu_allocator, nullptr};
Allocator* g_pinned_allocator = nullptr;
AllocatorProvider g_providers[2] = {nullptr, nullptr};
AllocatorProvider g_pinned_provider = nullptr;
std::once_flag g_provided[2], g_pinned_provided;

}  // namespace

CpuMemoryStats cpu_memory_stats() {
  return {g_cpu_live.load(std::memory_order_relaxed), g_cpu_peak.load(std::memory_order_relaxed)};
}
void reset_cpu_peak_memory() { g_cpu_peak.store(g_cpu_live.load(std::memory_order_relaxed)); }
size_t thread_allocated_bytes() { return t_allocated; }

namespace {
// The allocator installed for device type t; the first call asks the backend's provider (once; later calls cost one
// atomic load).
Allocator* installed(int t) {
  if (g_providers[t]) std::call_once(g_provided[t], [t] { g_allocators[t] = g_providers[t](); });
  return g_allocators[t];
}
}  // namespace

Allocator* allocator_for(Device device) {
  Allocator* a = installed(static_cast<int>(device.type));
  ASC_CHECK(a != nullptr,
            "device cuda:{}: no CUDA device is available (the program does not link the CUDA backend, "
            "ascender::cuda, or no GPU is present)",
            device.index);
  return a;
}

void register_allocator(Device::Type type, Allocator* alloc) {
  installed(static_cast<int>(type));  // the provider has had its turn: it never overwrites `alloc` later
  g_allocators[static_cast<int>(type)] = alloc;
}

Allocator* pinned_allocator() {
  if (g_pinned_provider) std::call_once(g_pinned_provided, [] { g_pinned_allocator = g_pinned_provider(); });
  return g_pinned_allocator;
}

void register_allocator_provider(Device::Type type, AllocatorProvider provider) {
  g_providers[static_cast<int>(type)] = provider;
}
void register_pinned_allocator_provider(AllocatorProvider provider) { g_pinned_provider = provider; }

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device), alloc_(allocator_for(device)) {
  data_ = alloc_->allocate(nbytes, device);
  t_allocated += nbytes;
}

Storage::Storage(size_t nbytes, Device device, Allocator* alloc) : nbytes_(nbytes), device_(device), alloc_(alloc) {
  data_ = alloc_->allocate(nbytes, device);
  t_allocated += nbytes;
}

Storage::~Storage() {
  if (data_) alloc_->deallocate(data_, nbytes_);
}

}  // namespace asc
